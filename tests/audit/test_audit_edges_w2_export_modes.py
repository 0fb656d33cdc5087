"""The mode `bide-audit export -o FILE` gives a file it replaces: the replaced file's read bits and its
owner's write bit, never a group or world write bit nor an execute bit. It kept the whole mode, so a
0666 file (made under a umask of 0, say) came back world-writable: anyone could then swap the evidence
for other bytes. A new file is 0600 whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import bide

from .conftest import write_run

REPO = Path(__file__).resolve().parents[2]


def audit(*args: str, cwd: Path, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "bide.audit._cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120,
        preexec_fn=lambda: os.umask(umask),
    )  # fmt: skip


@pytest.fixture
def export(tmp_path: Path) -> list[str]:
    """The arguments of an export of run `r` of a SQLite store, signed with `log.key` (`-o` to add)."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        write_run(store, "r", 2)
    finally:
        store.close()
    assert audit("keygen", "log.key", cwd=tmp_path).returncode == 0
    return ["export", "--store", url, "--run", "r", "--key", "log.key"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def exported(path: Path, cwd: Path) -> None:
    """`path` holds the exported evidence, which verifies."""
    checked = audit("verify-evidence", str(path), "--pubkey", "log.key.pub", cwd=cwd)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("found", "kept"),
    [(0o666, 0o644), (0o664, 0o644), (0o662, 0o640), (0o660, 0o640), (0o777, 0o644), (0o620, 0o600),
     (0o444, 0o444), (0o4755, 0o644)],
    ids=lambda m: f"{m:o}",
)  # fmt: skip
def test_a_replaced_export_keeps_no_group_or_world_write_bit(
    tmp_path: Path, export: list[str], found: int, kept: int
) -> None:
    old = tmp_path / "evidence.json"
    old.write_text("yesterday's evidence\n")
    old.chmod(found)
    done = audit(*export, "-o", "evidence.json", cwd=tmp_path, umask=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(old) == kept
    exported(old, tmp_path)


def test_a_file_replaced_through_a_link_loses_its_world_write_bit_too(
    tmp_path: Path, export: list[str]
) -> None:
    deployed = tmp_path / "shared" / "evidence.json"
    deployed.parent.mkdir()
    deployed.write_text("yesterday's evidence\n")
    deployed.chmod(0o666)
    (tmp_path / "link.json").symlink_to(deployed)
    done = audit(*export, "--head", "-o", "link.json", cwd=tmp_path, umask=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "link.json").is_symlink() and mode(deployed) == 0o644


def test_a_new_export_is_0600_under_a_umask_of_0(tmp_path: Path, export: list[str]) -> None:
    done = audit(*export, "-o", "evidence.json", cwd=tmp_path, umask=0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(tmp_path / "evidence.json") == 0o600
    exported(tmp_path / "evidence.json", tmp_path)
