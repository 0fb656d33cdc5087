"""Where a `govern` command may write: never over a file it reads (`refuse_overwriting`); the error for any
input the person running the command must change (`UsageError`, exit 2), and for an input file that is not
there to read (`InputFileUnreadable`, exit 4, as in `bide-audit`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bide._files import private_key_refusal

__all__ = ["InputFileUnreadable", "UsageError", "input_file_size", "is_directory", "is_other_than_file",
           "output_status", "refuse_overwriting", "same_file", "unreadable_input"]


class UsageError(Exception):
    """Bad input from the person running the command (exit 2)."""


class InputFileUnreadable(Exception):
    """An input file (machine file, certificate, key) that does not exist or cannot be opened (exit 4): the
    message names the path and says what to give instead."""


def input_file_size(path: Path, what: str) -> int:
    """The size in bytes of the input file at `path`, once it is known to be a regular file this process can
    open. Raises InputFileUnreadable naming `path` when it is missing, a directory, some other kind of file
    or unreadable; `what` says what the file should be ("a machine file"), for the message."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise InputFileUnreadable(f"{path} is a directory; give the path of {what}")
        if not stat.S_ISREG(info.st_mode):
            # A pipe or a device would block or never end: only files are inputs.
            raise InputFileUnreadable(f"{path} is not a regular file; give the path of {what}")
        with path.open("rb"):
            pass
    except FileNotFoundError:
        raise InputFileUnreadable(f"{path}: no such file; give the path of {what}") from None
    except OSError as exc:
        raise unreadable_input(path, what, exc) from None
    return info.st_size


def unreadable_input(path: Path, what: str, error: OSError) -> InputFileUnreadable:
    """The error for an input file that exists but could not be read."""
    return InputFileUnreadable(f"{path}: cannot be read ({error.strerror or error}); give the path of {what}")


def output_status(path: Path) -> os.stat_result | None:
    """What is at the output path `path` (through symlinks): its status, or None when nothing is there
    yet. Raises UsageError naming `path` when it cannot be looked up at all: a name longer than the file
    system takes, a directory this process may not search, a loop of symbolic links."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there: writing it says what is wrong, if anything is
    except OSError as exc:
        # Path.exists() and is_dir() raise these too (only "no such file" is False): bad input, not a bug.
        raise UsageError(f"{path}: cannot be written ({exc.strerror or exc}); nothing was written: give "
                         "another path") from None


def is_directory(path: Path) -> bool:
    """True when `path` is a directory (UsageError when it cannot be looked up, as `output_status`)."""
    info = output_status(path)
    return info is not None and stat.S_ISDIR(info.st_mode)


def is_other_than_file(path: Path) -> bool:
    """True when something other than a regular file is at the output path `path` (a directory, a pipe, a
    device), which writing it would replace; UsageError when it cannot be looked up, as `output_status`."""
    info = output_status(path)
    return info is not None and not stat.S_ISREG(info.st_mode)


def same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name one file (through symlinks, `..` or hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):
        return False


def refuse_overwriting(output: Path, inputs: list[tuple[str, Path]]) -> None:
    """Raise UsageError when `output` is one of `inputs` (each with what it is), or a private key file,
    input or not (`-o KEY` without `--sign`): writing it would replace what the command reads, or a key
    nothing can make again."""
    for what, path in inputs:
        if same_file(output, path):
            raise UsageError(f"{output} is the {what} ({path}); refusing to write over it: give another "
                             "output path")
    refusal = private_key_refusal(output)
    if refusal is not None:
        raise UsageError(f"{output} {refusal}; refusing to write over it: give another output path (a key "
                         "lost cannot be made again)")
