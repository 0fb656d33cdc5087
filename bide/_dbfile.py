"""The SQLite file a store or an event log has open, held by identity.

Open connections write through their file descriptors, not through the path. A store file deleted, moved
away, or replaced by another file renamed over it (an operator restoring a backup) while connections are
open would take their commits into a file nobody reads again, reported as successes; a new connection
would create an empty file at the path, and the write-ahead log, which stays at the path, would mix the
old file's pages into the new one. So a store or log notes its file's device and inode once open, opens
later connections only on that file (never creating one), and checks the path before and after each
write's commit: one `stat` each.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from dataclasses import dataclass

__all__ = ["OpenedFile", "connect_existing", "out_of_reach", "why_unwritable"]


@dataclass(frozen=True)
class OpenedFile:
    """The file at `path` when it was opened (its device and inode)."""

    path: str
    device: int
    inode: int

    @classmethod
    def at(cls, path: str) -> OpenedFile:
        """The file at `path` now (OSError if there is none)."""
        info = os.stat(path)
        return cls(path, info.st_dev, info.st_ino)

    def swapped(self) -> str | None:
        """None while `path` still names the file opened; else what became of it, in words. A path that
        cannot be looked at for another reason (a directory made unreadable) counts as unchanged: the
        connections' own reads and writes say what they can."""
        try:
            info = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            return "was deleted or moved away"
        except OSError:
            return None
        if (info.st_dev, info.st_ino) != (self.device, self.inode):
            return "was replaced by another file"
        return None


def connect_existing(opened: OpenedFile, timeout: float) -> sqlite3.Connection | str:
    """A connection to the file `opened` (SQLite's busy timeout `timeout` seconds), or what became of the
    file when the path no longer names it. The file is never created."""
    swapped = opened.swapped()
    if swapped is not None:
        return swapped
    uri = f"file:{urllib.parse.quote(opened.path)}?mode=rw"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
    except sqlite3.OperationalError:
        swapped = opened.swapped()  # gone between the look and the open; else SQLite's own reason stands
        if swapped is not None:
            return swapped
        raise
    swapped = opened.swapped()
    if swapped is not None:
        conn.close()
        return swapped
    return conn


def out_of_reach(path: str) -> str | None:
    """What keeps this user from the file `path` although it may well exist (a directory on the way that may
    not be searched, or the file's own mode), in words; None when nothing does or the file is simply not
    there (a missing file is its callers' to report)."""
    try:
        os.stat(path)
    except PermissionError:
        return f"permission denied reaching {path!r}: a directory on its path is not searchable by this user"
    except OSError:
        return None
    if not os.access(path, os.R_OK):
        return f"permission denied: {path!r} is not readable by this user"
    return None


def why_unwritable(path: str) -> str:
    """A hint for a SQLite file at `path` that cannot be opened or written: "" when nothing is found, else
    "; " and the likely cause. In WAL mode even a reader creates `-wal` and `-shm` files beside the store,
    so a full disk or a directory this user may not write makes opening fail ("disk I/O error", "unable to
    open database file", "attempt to write a readonly database")."""
    reach = out_of_reach(path)
    if reach is not None:
        return f"; {reach}"
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    try:
        info = os.statvfs(directory)
    except OSError:
        return ""
    if info.f_flag & os.ST_RDONLY:
        return f"; the file system holding {directory} is mounted read-only"
    if info.f_bavail * info.f_frsize < 64 * 1024:
        return f"; the disk holding {directory} is full: free some space (SQLite writes {name}-wal beside it)"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"; {path!r} is not writable by this user"
    if not os.access(directory, os.W_OK | os.X_OK):
        return (
            f"; the directory {directory} is not writable by this user: SQLite creates {name}-wal and "
            f"{name}-shm beside the store"
        )
    return ""
