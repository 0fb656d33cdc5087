"""A process paused (SIGSTOP, a long GC pause, a frozen VM) just as its async side effect was about to
start, after the attempt marker committed, and woken after another process took the run over: the other
process found the call's deadline passed, resolved it as never started and fired it. The woken process
must not fire it too: the tool's deadline is set from the marker's window as it is armed, and the window is
checked again right before the tool's first step (the child: async_pause_child.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paused import is_paused

import bide

pytestmark = pytest.mark.slow

CHILD = str(Path(__file__).resolve().parent / "async_pause_child.py")


def _child(url: str, ledger: Path, *signal_file: Path) -> list[str]:
    return [sys.executable, CHILD, url, str(ledger), *map(str, signal_file)]


@pytest.mark.parametrize("where", ["as the call starts", "inside the call, at a ready await"])
def test_a_driver_paused_as_its_async_call_starts_does_not_fire_it_again(
    durable_store_spec: tuple[str, str], tmp_path: Path, where: str
) -> None:
    """Paused inside the call, at an await that was ready at once (`asyncio.sleep(0)`): when the process
    woke, asyncio ran that ready step before the deadline's timer, and the tool went on to its effect, after
    the other process had fired the call. Each step of a claimed call is now checked against its window."""
    url, prefix = durable_store_spec
    in_tool = "1" if "inside" in where else ""
    env = {**os.environ, "BIDE_TEST_PREFIX": prefix, "BIDE_TEST_PAUSE_IN_TOOL": in_tool}
    ledger, paused = tmp_path / "ledger", tmp_path / "paused"
    first = subprocess.Popen(_child(url, ledger, paused), env=env, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (paused.exists() and is_paused(first.pid)):  # it stops itself there (see the child)
            assert first.poll() is None and time.monotonic() < deadline, "the first driver never got there"
            time.sleep(0.005)
        # Past the first driver's lease (0.6 s), the marker's deadline (1 s) and the clock skew (0.2 s).
        time.sleep(2.5)
        second = subprocess.run(_child(url, ledger), env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(second.stdout) == {"outcome": "completed", "answer": "Done."}, second.stderr
        os.kill(first.pid, signal.SIGCONT)
        out, _ = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
            first.wait()
    fired = ledger.read_text().splitlines()
    assert len(fired) == 1, f"the charge fired {len(fired)} times for one call: {fired}"
    # The woken driver could not write any more: it hands back the answer the other one recorded.
    assert json.loads(out) == {"outcome": "completed", "answer": "Done."}
    store = bide.open_store(url, table_prefix=prefix)
    try:
        assert [e.key for e in store.load("order-1") if e.key.startswith("result:")] == ["result:c0.0"]
    finally:
        store.close()
