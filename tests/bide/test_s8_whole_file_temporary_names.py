"""The temporaries of whole-file writes (`bide._files.write_whole`) left by killed writers are removed by the
next write of the same path (`remove_leftovers`). Two gaps:

- The removal matched mkstemp's names too (``.NAME.<8 of [a-z0-9_]>.tmp``, the portable temporary where
  there is no O_TMPFILE), which are words and dates: a user's own ``.k.original.tmp`` or
  ``.k.20261207.tmp`` beside `k` was deleted by `bide-audit keygen --force k`. Every temporary is named
  ``.NAME.<12 hex digits>.tmp`` now, and only that form is removed.
- Root replacing another user's file (a 0640 export of root:auditors) gives the temporary to that user
  before the rename; one killed then left a temporary that no later write removed (not root's own). Root
  now also removes leftovers owned by the owner of the file it writes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import bide
from bide._files import write_whole

ROOT = Path(bide.__file__).resolve().parents[1]  # the writers run the bide these tests import
NOBODY = 65534

# Writes argv[2] to argv[1] (giving it to argv[3] as uid and gid unless "-"), without O_TMPFILE if argv[4]
# is "portable", and stops just before the rename: says "named", then waits for ever.
WRITER = """
import os, sys, threading
from pathlib import Path

if sys.argv[4] == "portable":
    del os.O_TMPFILE
from bide._files import write_whole

def stop() -> None:
    print("named", flush=True)
    threading.Event().wait()

owner = None if sys.argv[3] == "-" else (int(sys.argv[3]), int(sys.argv[3]))
write_whole(Path(sys.argv[1]), sys.argv[2].encode(), owner=owner, before_rename=stop)
"""

TEMPORARY = re.compile(r"\.head\.json\.[0-9a-f]{12}\.tmp")


def _killed_before_rename(target: Path, *, owner: int | None = None, portable: bool = False) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [str(target), "old", "-" if owner is None else str(owner), "portable" if portable else "linux"]
    command = [sys.executable, "-c", WRITER, *argv]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    try:
        line = child.stdout.readline()  # blocks until the writer is at the rename (or died)
        assert line == "named\n", f"the writer did not reach its rename: {line!r}, exit {child.poll()}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_a_users_files_that_look_like_mkstemp_names_are_not_removed(tmp_path: Path) -> None:
    target = tmp_path / "head.json"
    mine = [".head.json.original.tmp", ".head.json.20261207.tmp", ".head.json.old_copy.tmp"]
    for name in mine:
        (tmp_path / name).write_text("the user's own data\n")

    write_whole(target, b"{}")

    assert _temporaries(tmp_path) == sorted(mine)
    assert all((tmp_path / name).read_text() == "the user's own data\n" for name in mine)


def test_the_portable_temporary_has_the_one_name_form_and_a_killed_writers_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "head.json"
    _killed_before_rename(target, portable=True)
    left = _temporaries(tmp_path)
    assert len(left) == 1 and TEMPORARY.fullmatch(left[0]), left
    assert (tmp_path / left[0]).stat().st_mode & 0o777 == 0o644  # write_whole's mode, set before the rename

    write_whole(target, b"new")

    assert target.read_bytes() == b"new" and _temporaries(tmp_path) == []


def _as_root() -> None:
    # Giving a file to another user takes root; `make test` runs the tests as root (as the mount tests need).
    assert os.geteuid() == 0, "these tests give files to another user: run them as root (make test does)"


def test_root_removes_a_leftover_it_gave_to_the_owner_of_the_file_it_replaces(tmp_path: Path) -> None:
    _as_root()
    target = tmp_path / "head.json"
    target.write_text("nobody's export")
    os.chown(target, NOBODY, NOBODY)
    _killed_before_rename(target, owner=NOBODY)
    left = _temporaries(tmp_path)
    assert len(left) == 1 and (tmp_path / left[0]).stat().st_uid == NOBODY, left

    write_whole(target, b"new", owner=(NOBODY, NOBODY), mode=0o640)

    assert target.read_bytes() == b"new" and target.stat().st_uid == NOBODY
    assert _temporaries(tmp_path) == []


def test_root_leaves_temporary_names_owned_by_someone_other_than_the_files_owner(tmp_path: Path) -> None:
    """Root's own file at the path: a file of another user's, though named as a temporary, stays; so does
    one of a user who owns neither the file nor it."""
    _as_root()
    target = tmp_path / "head.json"
    theirs = tmp_path / ".head.json.0123456789ab.tmp"
    theirs.write_text("another user's")
    os.chown(theirs, NOBODY, NOBODY)
    write_whole(target, b"root's")
    assert _temporaries(tmp_path) == [theirs.name]

    os.chown(target, NOBODY - 1, NOBODY - 1)
    write_whole(target, b"again", owner=(NOBODY - 1, NOBODY - 1))
    assert _temporaries(tmp_path) == [theirs.name] and theirs.read_text() == "another user's"
