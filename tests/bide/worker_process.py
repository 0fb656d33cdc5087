"""`bide worker` as a real process for tests: the app module written into `tmp_path`, stdout and stderr read
as they come, so that a test can wait for what the worker says and then signal it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[2]
CONSOLE_SCRIPT = Path(sys.executable).parent / "bide"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class WorkerProcess:
    """`bide worker` with the app `source` on the store `url` (`extra`: more options), started through
    `python -m bide._cli`, or the `bide` console script."""

    def __init__(
        self, tmp_path: Path, source: str, url: str, *extra: str, console_script: bool = False
    ) -> None:
        module = f"wapp_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(source)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO), env.get("PYTHONPATH", "")])
        launcher = [str(CONSOLE_SCRIPT)] if console_script else [sys.executable, "-m", "bide._cli"]
        command = [*launcher, "worker", "--store", url, "--app", f"{module}:build", *extra]
        self.process = subprocess.Popen(
            command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.said: list[str] = []
        self.out: list[str] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, lines), daemon=True)
            for stream, lines in ((self.process.stderr, self.said), (self.process.stdout, self.out))
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def stderr(self) -> str:
        return "".join(self.said)

    def says(self, words: str) -> None:
        wait_until(lambda: words in self.stderr(), f"the worker to say {words!r}; it said {self.stderr()!r}")

    def signal_then_wait_for(self, signum: int, words: str) -> None:
        """Send `signum` (once the signal before was taken: two pending at once would be one), then wait
        until the worker says `words`."""
        self.process.send_signal(signum)
        self.says(words)

    def ended(self) -> tuple[int, str]:
        """The exit code, and what the worker wrote to stdout."""
        code = self.process.wait(timeout=60)
        for reader in self.readers:
            reader.join(10)
        return code, "".join(self.out)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
