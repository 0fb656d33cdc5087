"""Writing a file whole: never half-written, never through a planted symlink, optionally never overwriting."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

__all__ = ["write_whole"]


def write_whole(path: Path, data: bytes, *, mode: int = 0o644, overwrite: bool = True) -> None:
    """Write `data` to `path`, all of it or nothing.

    The bytes go to a fresh temporary file beside `path` (created exclusively under an unpredictable name,
    so a symlink planted there is never followed), are fsynced, and then the file is renamed over `path`
    (`overwrite`), or linked to `path` exclusively (not `overwrite`: `FileExistsError` when `path` exists,
    with no window between that check and the write). The new directory entry is fsynced too.

    On a filesystem without hard links (some network and object-store mounts) the exclusive write creates
    `path` itself with O_EXCL and writes it there: still never overwriting, but a crash in the middle can
    leave a short file, which a later write of the same bytes then reports as existing with other contents.
    """
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                _create_exclusively(path, data, mode)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # after the rename, or the link: only the temporary name goes
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _create_exclusively(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
