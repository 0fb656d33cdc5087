"""A SQLite store in a directory the user may not enter is unreadable there (exit 4, as a read-only place
is), for reading and writing commands alike, and the message names that directory and what to do.

Before: `bide show`, `bide runs`, `bide resolve` and `bide-audit export` ended with exit 6 ("the store
failed", which a script retries for ever), naming no directory; a store one directory further down was
"the directory ... does not exist; create it first" (exit 2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from store_places import as_another_user, make_store

import bide

_COMMANDS = {
    "bide show": ["bide._cli", "show", "r1"],
    "bide runs": ["bide._cli", "runs"],
    "bide resolve": ["bide._cli", "resolve", "r1", "c1", "--not-started"],
    "bide cancel": ["bide._cli", "cancel", "r1"],
}


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m module args` as another user would run it (the checkout's code first on the path)."""
    wrap = as_another_user()
    repo = str(Path(bide.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*wrap, sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


@pytest.mark.parametrize("depth", ["in it", "below it"])
def test_commands_on_a_store_in_a_directory_the_user_may_not_enter_say_so_with_exit_4(
    tmp_path: Path, depth: str
) -> None:
    closed = tmp_path / "closed"
    folder = closed if depth == "in it" else closed / "inside"
    folder.mkdir(parents=True)
    path = folder / "bide.db"
    make_store(path)
    key = tmp_path / "log.key"
    assert subprocess.run(["bide-audit", "keygen", str(key)], capture_output=True).returncode == 0
    url = f"sqlite:///{path}"
    closed.chmod(0)
    try:
        done = {name: _run(command[0], *command[1:], "--store", url) for name, command in _COMMANDS.items()}
        listed = _run("bide._cli", "runs", "--store", url, "--json")
        exported = _run("bide.audit._cli", "export", "--store", url, "--run", "r1", "-o",
                        str(tmp_path / "ev.json"), "--key", str(key))  # fmt: skip
    finally:
        closed.chmod(0o755)
    done["bide-audit export"] = exported
    for name, ran in done.items():
        assert ran.returncode == 4, f"{name}: {ran.returncode} {ran.stderr}"
        said = ran.stderr
        assert f"the directory {closed} may not be entered" in said, f"{name}: {said}"
        assert f"chmod o+x {closed}" in said and "fail the same way every time" in said, f"{name}: {said}"
        assert "store failed" not in said and "does not exist" not in said, f"{name}: {said}"
    assert listed.returncode == 4 and json.loads(listed.stdout)["reason"] == "unreadable", listed.stdout
    assert not (tmp_path / "ev.json").exists()
    # Nothing was changed: the store reads as before once the directory may be entered.
    again = _run("bide._cli", "show", "r1", "--store", url)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("way", ["through a link", "through .."])
def test_the_directory_named_is_the_one_the_kernel_may_not_enter_on_the_way(tmp_path: Path, way: str) -> None:
    """A re-test: a store reached through a symbolic link into the closed directory named the directory
    holding the link (which may be entered), and one reached through `closed/..` named none."""
    closed, open_ = tmp_path / "closed", tmp_path / "open"
    (closed / "sub").mkdir(parents=True)
    open_.mkdir()
    make_store(closed / "sub" / "bide.db")
    (open_ / "link").symlink_to("../closed/sub")
    make_store(open_ / "bide.db")
    url = f"sqlite:///{open_ / 'link' / 'bide.db'}" if way == "through a link" else (
        f"sqlite:///{closed}/../open/bide.db"
    )
    closed.chmod(0)
    try:
        ran = _run("bide._cli", "show", "r1", "--store", url)
    finally:
        closed.chmod(0o755)
    assert ran.returncode == 4, ran.stderr
    assert f"the directory {closed} may not be entered" in ran.stderr, ran.stderr
    assert f"chmod o+x {closed}" in ran.stderr, ran.stderr
