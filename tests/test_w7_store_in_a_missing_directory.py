"""docs/cli.md: a SQLite store path whose directory does not exist is a usage error (exit 2, "create it
first") in every command, `bide-audit export` too; "no bide store at ..." (exit 4) is for a file missing
from a directory that exists. Nothing is created either way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("path", "code", "said"), [
    ("nodir/bide.db", 2, "does not exist; create it first"),
    ("bide.db", 4, "no bide store at"),
])
def test_a_store_path_is_exit_2_without_its_directory_and_4_without_its_file(
    tmp_path: Path, path: str, code: int, said: str
) -> None:
    assert _run("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    export = ("export", "--store", path, "--run", "r", "--key", "log.key", "--head", "-o", "h.json")
    commands = [
        ("bide._cli", ("runs", "--store", path)),
        ("bide._cli", ("show", "--store", path, "r")),
        ("bide.audit._cli", export),
    ]
    for module, args in commands:
        done = _run(module, *args, cwd=tmp_path)
        assert done.returncode == code and said in done.stderr, (args, done.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.key", "log.key.pub"]
