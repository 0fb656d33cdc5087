"""A file written whole (`bide._files.write_whole`: evidence packages, heads, proofs, keys, anchors) leaves
nothing behind when its writer is killed in the middle: no partial hidden temporary file per try, for
SIGKILL and for a SIGTERM the program does not handle (what `timeout`, systemd and `docker stop` send)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SIZE = 128 << 20  # long enough to write and fsync that a kill 50 ms in lands in the middle
WRITER = (
    "import sys; from pathlib import Path; from bide._files import write_whole; "
    "data = b'x' * int(sys.argv[2]); print('writing', flush=True); "
    "write_whole(Path(sys.argv[1]), data); print('done', flush=True)"
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_writer_killed_mid_write_leaves_no_file_behind(sig: signal.Signals, tmp_path: Path) -> None:
    target = tmp_path / "evidence.json"
    for _ in range(5):  # a machine fast enough to finish first tries again (the file is then whole)
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(target), str(SIZE)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline() == "writing\n"
        time.sleep(0.05)
        child.send_signal(sig)
        out, _ = child.communicate(timeout=60)
        left = sorted(p.name for p in tmp_path.iterdir())
        if "done" in out:
            assert left == [target.name] and target.stat().st_size == SIZE
            target.unlink()
            continue
        assert child.returncode == -sig
        assert left == [], f"left behind by a writer killed with {sig.name}: {left}"
        return
    pytest.fail("the writer finished before every kill: make SIZE larger")
