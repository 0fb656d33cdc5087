"""Reading an input file (an artifact, a policy file) whole, up to a size limit, without hanging.

A named pipe (FIFO) that no process has open for writing would block a plain open() forever, so it is
opened without waiting and refused if nothing is writing it. A pipe that has a writer is read to its end:
a process substitution (``bide-audit verify <(curl ...)``) works. Reading goes in chunks, so a large limit
never allocates more than what is there.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["read_limited"]

_CHUNK = 1 << 20


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of `path`, at most `limit` + 1 of them (more than `limit` means it is over the limit).
    Raises OSError when it cannot be read, and for a pipe that nothing writes (ENXIO, "a pipe with no
    writer")."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb", buffering=0):  # closes fd, however the reading ends
        pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
        if not pipe:
            os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(_CHUNK, limit + 1 - total))
            except BlockingIOError:  # a pipe with a writer that has not written yet: wait for it
                os.set_blocking(fd, True)
                continue
            if not chunk:
                if pipe and total == 0 and not os.get_blocking(fd):
                    # End of file before any wait: no process had the pipe open for writing.
                    raise OSError(errno.ENXIO, "a pipe with no writer (nothing to read; bide does not wait "
                                  "for one: give a file, or start the writer first)")
                break
            if pipe:
                os.set_blocking(fd, True)
            chunks.append(chunk)
            total += len(chunk)
    return b"".join(chunks)
