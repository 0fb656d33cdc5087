"""Work run in children made by os.fork(), for the tests of what a store or an event log does across a fork.

A child never returns into pytest (it would run the rest of the session twice): it ends with os._exit, its
traceback, if it failed, written to a file the parent reads. A child that hangs is killed after a deadline,
so that a hang fails its test instead of stalling the run.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def fork(work: Callable[[], None], errors: Path) -> int:
    """Run `work` in a forked child; its pid. A failure's traceback goes to `errors`."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            errors.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    return pid


def wait_all(
    pids: list[int],
    errors: list[Path],
    while_waiting: Callable[[], None] = lambda: None,
    timeout: float = 120.0,
) -> None:
    """Wait for the children (killed after `timeout` seconds), calling `while_waiting` meanwhile, and fail
    with their tracebacks if any failed or hung."""
    deadline = time.monotonic() + timeout
    status: dict[int, int] = {}
    while len(status) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in status:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status[pid] = code
        while_waiting()
        time.sleep(0.01)
    for pid in pids:
        if pid not in status:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    failed = [p.read_text() for p in errors if p.exists()]
    hung = len(pids) - len(status)
    assert not hung, f"{hung} children hung for {timeout} s; failures: {failed}"
    assert all(os.waitstatus_to_exitcode(code) == 0 for code in status.values()), failed


def in_child(work: Callable[[], None], folder: Path, timeout: float = 20.0) -> None:
    """Run `work` in one forked child and wait for it (killed after `timeout`: a hang fails the test); fail
    with its traceback if it failed. Its traceback file goes in `folder`."""
    errors = folder / f"child-{time.monotonic_ns()}.txt"
    wait_all([fork(work, errors)], [errors], timeout=timeout)
