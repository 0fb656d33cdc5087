"""Standard output that cannot be written, for the three command lines (`bide`, `bide-audit`, `govern`).

A reader that went away (`govern check cert.json | head -1`, a closed pipe) is not a failure of the
command: what it decided is in its exit code, which stays what it was. Output that cannot be written for
another reason (a full disk behind `> result.json`) is: the command goes on to its end all the same (what it
records or writes is done whatever becomes of its output), then says on standard error that its output is
lost and with which code it would have ended, and exits with the usage-or-input code (2), never 0, since what
it printed is lost or cut short.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
from collections.abc import Callable
from typing import TextIO

__all__ = [
    "OUTPUT_LOST",
    "GuardedStdout",
    "WrappedStream",
    "closed_stdout_fails",
    "emitted",
    "ended",
    "informational_exit",
    "lost_output",
    "output_failed",
    "silence_stdout",
]

OUTPUT_LOST = 2


def closed_stdout_fails() -> None:
    """Start a command: forget a lost output of a command run before in this process, and give a process
    started with standard output or error closed (`>&-`, `2>&-`), whose `sys.stdout` or `sys.stderr` is None,
    a sink that drops what is written, as None did for `print` (so a tool that prints runs as it would), and
    remembers that standard output lost something (`lost_output`), so that the command's exit says its output
    is lost (`OUTPUT_LOST`) instead of crashing on None. A standard error that cannot be written (a full
    disk behind `2>`) drops what is written to it: an OSError raised by a message there ended commands
    with exit 1, "found wanting", whatever their own code."""
    global _CLOSED_STDOUT, _WRITE_FAILED, _LOSS_SAID
    _WRITE_FAILED, _LOSS_SAID = None, False
    if _CLOSED_STDOUT is not None:
        _CLOSED_STDOUT.dropped = False  # (a command run before in this process lost its output, not this one)
    _fill_closed_descriptors()
    if sys.stdout is None:
        sys.stdout = _CLOSED_STDOUT = _Closed()
    if sys.stderr is None:
        sys.stderr = _Closed()
    elif not isinstance(sys.stderr, (_Closed, _QuietStderr)):
        sys.stderr = _QuietStderr(sys.stderr)


def _fill_closed_descriptors() -> None:
    """Open /dev/null on standard input, output or error where the process started with it closed (`>&-`):
    the next file opened takes the lowest free descriptor, and a database connection opened as 1 received
    what a tool's native code wrote to its standard output (runs halted on a broken connection)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)  # (dup2's copy is inherited)
                os.close(null)
            else:  # inherited too, as the standard descriptors are: a tool's subprocess writes there
                os.set_inheritable(fd, True)


def lost_output() -> bool:
    """True when something was written to a standard output that was closed when the process started."""
    return _CLOSED_STDOUT is not None and _CLOSED_STDOUT.dropped


def silence_stdout(stream: TextIO | io.TextIOBase | None = None) -> None:
    """Point standard output (or the file descriptor behind `stream`) at /dev/null, so that nothing written
    later (the interpreter's own flush at exit included) fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, (sys.stdout if stream is None else stream).fileno())
    except (OSError, ValueError):
        pass  # no file descriptor behind stdout (a test's capture): nothing will be flushed to it
    finally:
        os.close(devnull)


def output_failed(exc: OSError, stream: TextIO | io.TextIOBase | None = None) -> None:
    """Standard output (or `stream`, a copy of it) could not be written: silence it and remember why, for
    `ended` to say. A reader that went away (a closed pipe) is silenced only: it is no failure."""
    global _WRITE_FAILED
    silence_stdout(stream)
    if not isinstance(exc, BrokenPipeError) and _WRITE_FAILED is None:
        _WRITE_FAILED = exc.strerror or str(exc)


def emitted(write: Callable[[], None], code: int, prefix: str = "error: ") -> int:
    """Run `write` (the command's printing), then end as `ended(code, prefix)` does."""
    try:
        write()
    except OSError as exc:
        output_failed(exc)
    return ended(code, prefix)


def ended(code: int, prefix: str = "error: ") -> int:
    """The exit code of a command whose own code is `code`: `code`, or `OUTPUT_LOST` once standard output
    (flushed here) could not be written for a reason other than a closed pipe. That is said on standard
    error after `prefix`, with `code`: the command did its work, and a script must not read 2 as "nothing
    was done". With `--json` the document was what was lost, so standard error is all there is to say it.
    The loss is said once, by the first call that finds it."""
    global _LOSS_SAID
    try:
        sys.stdout.flush()
    except OSError as exc:
        output_failed(exc)
    why = _WRITE_FAILED or ("standard output is closed" if lost_output() else None)
    if why is None:
        return code
    if _LOSS_SAID:
        return OUTPUT_LOST
    _LOSS_SAID = True
    _say(
        f"{prefix}the output could not be written ({why}); the command itself finished (exit {code}): "
        "what it recorded or wrote stands; only its printed output is lost"
    )
    return OUTPUT_LOST


def _say(message: str) -> None:
    # Standard error may be full or closed too: the exit code says what happened all the same.
    with contextlib.suppress(OSError):
        print(message, file=sys.stderr)


def informational_exit(done: SystemExit, prefix: str = "error: ") -> SystemExit:
    """What to raise once argparse printed `--help` or `--version` and exits with `done`: the same exit,
    or one with `OUTPUT_LOST` when that text could not be written (argparse exits 0 either way)."""
    if done.code not in (0, None):
        return done
    code = ended(0, prefix)
    return done if code == 0 else SystemExit(code)


class WrappedStream(io.TextIOBase):
    """A text stream over another (`inner`), which answers whatever a subclass does not change."""

    def __init__(self, inner: TextIO | io.TextIOBase) -> None:
        super().__init__()
        self._inner = inner

    def write(self, text: str) -> int:
        return self._inner.write(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]  # (what printers encode for; read-only here)
        return self._inner.encoding


class GuardedStdout(WrappedStream):
    """Standard output as a command prints to it: once it cannot be written, what is printed is dropped and
    the command goes on to its own exit code; a failure other than a reader that went away (a full disk) is
    remembered, for `ended` to report as `OUTPUT_LOST` (never as a verdict or a bug)."""

    def __init__(self, inner: TextIO | io.TextIOBase) -> None:
        super().__init__(inner)
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                raw = getattr(self._inner, "buffer", None)
                if isinstance(raw, io.FileIO):
                    self._write_all(raw, text)
                else:
                    self._inner.write(text)
            except OSError as exc:
                self._gone = True
                output_failed(exc, self._inner)
        return len(text)

    def _write_all(self, raw: io.FileIO, text: str) -> None:
        """Unbuffered output (PYTHONUNBUFFERED): the text layer writes straight to the file and drops the
        rest of a short write (a disk filling partway), so a cut output ended with exit 0. Written whole
        here: the write after a short one fails and says why."""
        self._inner.flush()
        data = text.encode(self._inner.encoding or "utf-8", getattr(self._inner, "errors", None) or "strict")
        while data:
            written = raw.write(data)
            if not written:
                raise OSError(errno.EIO, "standard output took none of the bytes written to it")
            data = data[written:]

    def flush(self) -> None:
        if not self._gone:
            try:
                self._inner.flush()
            except OSError as exc:
                self._gone = True
                output_failed(exc, self._inner)


class _QuietStderr(WrappedStream):
    """Standard error that drops what cannot be written to it (a full disk): the message is lost, the
    command's exit code is not. Everything else is the stream's own."""

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError):
            self._inner.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._inner.flush()

    def __getattr__(self, name: str) -> object:  # (buffer, errors, ...: the stream's own)
        return getattr(self._inner, name)


_CLOSED_STDOUT: _Closed | None = None  # the sink `closed_stdout_fails` gave standard output, if any
_WRITE_FAILED: str | None = None  # why standard output could not be written (a full disk), if it could not
_LOSS_SAID = False  # whether `ended` said on standard error that the output is lost


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
