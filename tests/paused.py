"""Pausing a child process (SIGSTOP, as a long GC pause or a frozen VM would) and knowing it has stopped.

`kill(pid, SIGSTOP)` returns before the child has stopped: the kernel wakes one of its threads, and that
thread stops the others when it next runs. Until then another thread of the child (a store's worker thread,
say) goes on running Python, so a file the test writes right after the kill may be seen by a child that
has not stopped yet, and the test's premise ("it goes on only once woken") is false. `pause` returns once
every thread of the child is stopped.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def is_paused(pid: int) -> bool:
    """Whether every thread of process `pid` is stopped (state T, or t under a tracer)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        states.append(stat.rpartition(")")[2].split()[0])  # the state follows the command name
    return bool(states) and all(state in ("T", "t") for state in states)


def pause(pid: int, *, timeout: float = 30.0) -> None:
    """Stop process `pid` with SIGSTOP and return once all its threads have stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_until_paused(pid, timeout=timeout)


def wait_until_paused(pid: int, *, timeout: float = 30.0) -> None:
    """Wait until every thread of process `pid` is stopped (it may have stopped itself)."""
    deadline = time.monotonic() + timeout
    while not is_paused(pid):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout} s")
        time.sleep(0.002)
