"""A small filesystem of its own for a test: a tmpfs mounted on a directory (the tests run as root: `make
test` installs what they need, and the mount is part of the test, not optional)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Make `path` and mount a tmpfs of `size` (mount's syntax: "65536", "1m") on it; unmounted on exit."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
