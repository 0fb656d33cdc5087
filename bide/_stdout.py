"""Standard output that cannot be written, for the three command lines (`bide`, `bide-audit`, `govern`).

A reader that went away (`govern check cert.json | head -1`, a closed pipe) is not a failure of the
command: what it decided is in its exit code, which stays what it was. Output that cannot be written for
another reason (a full disk behind `> result.json`) is: it is said on standard error, and the command
exits with the usage-or-input code (2), never 0, since what it printed is lost or cut short.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable
from typing import TextIO

__all__ = [
    "OUTPUT_LOST",
    "GuardedStdout",
    "OutputLost",
    "closed_stdout_fails",
    "emitted",
    "informational_exit",
    "lost_output",
    "silence_stdout",
]

OUTPUT_LOST = 2


def closed_stdout_fails() -> None:
    """A process started with standard output or error closed (`>&-`, `2>&-`) has `sys.stdout` or
    `sys.stderr` None: give it a sink that drops what is written, as None did for `print` (so a tool that
    prints runs as it would), and remembers that standard output lost something (`lost_output`), so that
    the command's exit says its output is lost (`OUTPUT_LOST`) instead of crashing on None."""
    global _CLOSED_STDOUT
    if sys.stdout is None:
        sys.stdout = _CLOSED_STDOUT = _Closed()
    if sys.stderr is None:
        sys.stderr = _Closed()


def lost_output() -> bool:
    """True when something was written to a standard output that was closed when the process started."""
    return _CLOSED_STDOUT is not None and _CLOSED_STDOUT.dropped


def silence_stdout() -> None:
    """Point standard output at /dev/null, so that nothing written later (the interpreter's own flush at
    exit included) fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # no file descriptor behind stdout (a test's capture): nothing will be flushed to it
    finally:
        os.close(devnull)


def emitted(write: Callable[[], None], code: int) -> int:
    """Run `write` (the command's printing) and flush standard output; return `code`, or `OUTPUT_LOST` when
    the output could not be written for a reason other than a closed pipe."""
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
    except OSError as exc:
        silence_stdout()
        _say(f"error: the output could not be written ({exc.strerror or exc})")
        return OUTPUT_LOST
    if lost_output():
        _say("error: the output could not be written (standard output is closed)")
        return OUTPUT_LOST
    return code


def _say(message: str) -> None:
    # Standard error may be full or closed too: the exit code says what happened all the same.
    with contextlib.suppress(OSError):
        print(message, file=sys.stderr)


def informational_exit(done: SystemExit) -> SystemExit:
    """What to raise once argparse printed `--help` or `--version` and exits with `done`: the same exit,
    or one with `OUTPUT_LOST` when that text could not be written (argparse exits 0 either way)."""
    if done.code not in (0, None):
        return done
    code = emitted(lambda: None, 0)
    return done if code == 0 else SystemExit(code)


class OutputLost(Exception):
    """Standard output could not be written for another reason than a closed pipe (a full disk)."""


class GuardedStdout(io.TextIOBase):
    """Standard output as a command prints to it: once the reader went away, what is printed is dropped and
    the command goes on to its own exit code; a write that fails for another reason raises OutputLost, for
    the command to report as `OUTPUT_LOST` (never as a verdict or a bug)."""

    def __init__(self, inner: TextIO | io.TextIOBase) -> None:
        super().__init__()
        self._inner = inner
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._inner.write(text)
            except BrokenPipeError:
                self._gone = True
                silence_stdout()
            except OSError as exc:
                raise OutputLost(exc.strerror or str(exc)) from exc
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._gone = True
                silence_stdout()
            except OSError as exc:
                raise OutputLost(exc.strerror or str(exc)) from exc

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # (what printers encode for; read-only here)
        return self._inner.encoding


_CLOSED_STDOUT: _Closed | None = None  # the sink `closed_stdout_fails` gave standard output, if any


class _Closed(io.TextIOBase):
    """A standard stream that was closed before the command started: what is written is dropped (as Python
    drops a `print` to a None stream), and `dropped` says whether anything was."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = False

    def write(self, text: str) -> int:
        self.dropped = self.dropped or bool(text)
        return len(text)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the stream is closed")

    @property
    def encoding(self) -> str:  # type: ignore[override]  # (what printers encode for; read-only here)
        return "utf-8"
