"""A writer of a whole file (`bide._files.write_whole`) SIGKILLed after its temporary file got its name and
before that name was renamed over the target (or, for an exclusive write, unlinked once linked) left the
temporary behind for ever, one per kill. The next write of the same path removes such a leftover now; the
temporary of a writer still at work is left alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide._files import replace_pair, write_whole

ROOT = Path(bide.__file__).resolve().parents[1]

# Writes argv[2] to argv[1], and stops (says "named", then waits for ever) at the point given by argv[3]:
# "rename" just before the temporary is renamed over the target, "unlink" just after an exclusive write
# linked it to the target (before its temporary name is removed).
WRITER = """
import os, sys, threading
from pathlib import Path
from bide._files import write_whole

target, data, where = Path(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]

def stop() -> None:
    print("named", flush=True)
    threading.Event().wait()

if where == "rename":
    write_whole(target, data, before_rename=stop)
else:
    real_link = os.link

    def link_then_stop(src, dst, **kwargs):
        real_link(src, dst, **kwargs)
        if Path(dst) == target:
            stop()

    os.link = link_then_stop
    write_whole(target, data, overwrite=False)
"""


def _writer_stopped_at(target: Path, data: str, where: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), data, where], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    line = child.stdout.readline()  # blocks until the writer is at the point (or died)
    assert line == "named\n", f"the writer did not reach {where!r}: {line!r}, exit {child.poll()}"
    return child


def _killed(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("where", ["rename", "unlink"])
def test_a_temporary_left_by_a_writer_killed_before_its_rename_goes_with_the_next_write(
    tmp_path: Path, where: str
) -> None:
    target = tmp_path / "head.json"
    _killed(_writer_stopped_at(target, '{"n": 1}', where))
    assert len(_temporaries(tmp_path)) == 1, "the kill left no temporary: the test misses its window"

    write_whole(target, b'{"n": 2}')

    assert target.read_bytes() == b'{"n": 2}'
    assert _temporaries(tmp_path) == []


def test_the_temporary_of_a_writer_still_at_work_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "head.json"
    child = _writer_stopped_at(target, '{"n": 1}', "rename")
    try:
        live = _temporaries(tmp_path)
        assert len(live) == 1
        write_whole(target, b'{"n": 2}')
        assert _temporaries(tmp_path) == live  # still there: its writer holds it
    finally:
        _killed(child)
    write_whole(target, b'{"n": 3}')
    assert _temporaries(tmp_path) == []


def test_a_key_pair_write_removes_leftovers_beside_both_files(tmp_path: Path) -> None:
    first, second = tmp_path / "key.pem", tmp_path / "key.pub"
    _killed(_writer_stopped_at(first, "old private", "rename"))
    _killed(_writer_stopped_at(second, "old public", "rename"))
    assert len(_temporaries(tmp_path)) == 2

    replace_pair(first, b"private", 0o600, second, b"public", 0o644)

    assert (first.read_bytes(), second.read_bytes()) == (b"private", b"public")
    assert _temporaries(tmp_path) == []


def test_files_that_only_look_like_temporaries_are_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "head.json"
    others = [".head.json.notours.tmp", ".head.json.0123456789ab.tmp.keep", ".other.json.0123456789ab.tmp"]
    for name in others:
        (tmp_path / name).write_bytes(b"someone else's")
    write_whole(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*others, target.name])
