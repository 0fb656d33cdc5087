"""What the multi-process tests share (SIGKILL, parallel calls, threads driven by two processes at once).

In a child process: `signal_parent` (write a file the parent waits for), `wait_for_kill`, a start barrier
(`start_barrier`), and `HookedStore`, a store that runs hooks around every journal write. In the parent:
`spawn` a child script, `finish` it (its last stdout line is its JSON outcome), kill it at the point it
signals (`kill_at_point`), let a barrier's children go, and read an effect file's lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import bide

# -- in the child -------------------------------------------------------------------------------------------


def signal_parent(path: str, text: str) -> None:
    """Write `text` to `path` at once (the parent sees the whole file or none)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def wait_for_kill() -> NoReturn:
    """Block the process, its event loop too (no deadline fires, nothing else runs), until SIGKILL."""
    while True:
        time.sleep(1)


def start_barrier(go: str) -> None:
    """Say this process is ready (`<go>.ready.<pid>`), then wait until the parent creates `go`."""
    with open(f"{go}.ready.{os.getpid()}", "w"):
        pass
    while not os.path.exists(go):
        time.sleep(0.001)


Hook = Callable[[list[str]], Awaitable[None] | None]


class HookedStore:
    """Passes every call to the real store; runs `before(keys)` and `after(keys)` around each journal write
    (`keys`: the write's record keys). A hook may block the process (`wait_for_kill`) or await."""

    def __init__(self, inner: bide.Store, *, before: Hook | None = None, after: Hook | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.before = before
        self.after = after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], **options: Any
    ) -> list[bide.Entry]:
        keys = [k for k, _ in items]
        await _call(self.before, keys)
        out: list[bide.Entry] = await self.inner.ainsert_many(run_id, items, **options)
        await _call(self.after, keys)
        return out


async def _call(hook: Hook | None, keys: list[str]) -> None:
    if hook is not None:
        waited = hook(keys)
        if waited is not None:
            await waited


def append_line(path: str | Path, text: str) -> None:
    """Append a line to `path`, synced to disk (a side effect that survives SIGKILL)."""
    with open(path, "a") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- in the parent ------------------------------------------------------------------------------------------


def spawn(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start `python script args...` with the environment plus `env`."""
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[dict[str, Any], list[str]]:
    """Wait for a child that must exit 0: its last stdout line (JSON) and the lines before it."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    lines = out.strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1])
    return result, lines[:-1]


def wait_for_file(path: Path, procs: Sequence[subprocess.Popen[str]] = (), timeout: float = 60) -> None:
    """Wait until `path` exists; fail at once if one of `procs` exits first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no child created {path.name}"
        time.sleep(0.005)


def kill_at_signal(proc: subprocess.Popen[str], signal_file: Path, timeout: float = 60) -> None:
    """Wait until the child wrote `signal_file` (it reached its kill point), then SIGKILL it."""
    wait_for_file(signal_file, [proc], timeout)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def kill_at_point(
    script: Path, *args: str, point: str, signal_file: Path, env: dict[str, str] | None = None
) -> None:
    """Run a child told to pause at `point` (BIDE_TEST_PAUSE_AT, BIDE_TEST_SIGNAL) and SIGKILL it there."""
    pause = {"BIDE_TEST_PAUSE_AT": point, "BIDE_TEST_SIGNAL": str(signal_file)}
    kill_at_signal(spawn(script, *args, env={**(env or {}), **pause}), signal_file)


def release_barrier(go: Path, children: int, timeout: float = 60) -> None:
    """Once `children` processes wait at `start_barrier(go)`, let them all go at once."""
    deadline = time.monotonic() + timeout
    while len(list(go.parent.glob(f"{go.name}.ready.*"))) < children:
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.01)
    go.write_text("go")


def effect_lines(path: Path) -> list[str]:
    """The lines of an effect file (none if it does not exist)."""
    return path.read_text().splitlines() if path.exists() else []
