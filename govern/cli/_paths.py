"""Where a `govern` command may write: never over a file it reads (`refuse_overwriting`), and the error for
any input the person running the command must change (`UsageError`, exit 2)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["UsageError", "refuse_overwriting", "same_file"]


class UsageError(Exception):
    """Bad input from the person running the command (exit 2)."""


def same_file(a: Path, b: Path) -> bool:
    """True when `a` and `b` name one file (through symlinks, `..` or hard links)."""
    try:
        if a.resolve() == b.resolve():
            return True
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, RuntimeError):
        return False


def refuse_overwriting(output: Path, inputs: list[tuple[str, Path]]) -> None:
    """Raise UsageError when `output` is one of `inputs` (each with what it is): writing it would
    replace what the command reads."""
    for what, path in inputs:
        if same_file(output, path):
            raise UsageError(f"{output} is the {what} ({path}); refusing to write over it: give another "
                             "output path")
