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
import stat
import urllib.parse

__all__ = [
    "OpenedFile",
    "connect_existing",
    "not_a_database",
    "other_names",
    "out_of_reach",
    "sqlite_uri",
    "unenterable_directory",
    "why_unwritable",
]


class OpenedFile:
    """The file at `path` when it was opened (its device and inode). Once it is found gone or replaced,
    it stays so for this object, whatever the path names later: a file restored there may even get the old
    file's inode number back, once nothing holds the old one open."""

    def __init__(self, path: str, label: str) -> None:
        """The file at `path` now (OSError if there is none), called `label` ("the store file") in what
        `swapped` says."""
        info = os.stat(path)
        self.path = path
        # SQLite follows a symbolic link to the file and keeps its write-ahead log beside the file itself:
        # watched at "<link>-wal", a log deleted under the store went unnoticed and the commits made into
        # it, an attempt marker among them, vanished with the process.
        self.wal = os.path.realpath(path) + "-wal"
        self.label = label
        self.identity = (info.st_dev, info.st_ino)
        self.gone: str | None = None

    def swapped(self, connection: dict[str, object] | None = None) -> str | None:
        """None while `path` still names the file opened and, given `connection` (a dict kept with one open
        connection, like SQLAlchemy's `info`), the write-ahead log beside it is still the one that
        connection writes to; else what became of them, in words. A path that cannot be looked at for
        another reason (a directory made unreadable) counts as unchanged: the connections' own reads and
        writes say what they can."""
        if self.gone is None:
            changed = _changed(self.path, self.identity, "was deleted or moved away", "was replaced")
            self.gone = None if changed is None else f"{self.label} {self.path!r} {changed}"
        if self.gone is None and connection is not None:
            self.gone = self._wal_swapped(connection)
        return self.gone

    def _wal_swapped(self, connection: dict[str, object]) -> str | None:
        # SQLite deletes the -wal file only when the last connection closes: while this one is open, the
        # file it wrote its first commit to stays at the path. (None at that first look: no -wal, so not in
        # WAL mode, and nothing to check.)
        wal = self.wal
        if "bide_wal" not in connection:
            try:
                info = os.stat(wal)
            except OSError:
                connection["bide_wal"] = None
                return None
            connection["bide_wal"] = (info.st_dev, info.st_ino)
            return None
        seen = connection["bide_wal"]
        if not isinstance(seen, tuple):
            return None
        changed = _changed(wal, seen, "was deleted", "was replaced")
        if changed is None:
            return None
        return f"the write-ahead log {wal!r} of {self.label} {self.path!r} {changed}"


def other_names(path: str, label: str) -> str | None:
    """Why the SQLite file at `path` must not be opened because it has other names (hard links), or None
    (one name, or nothing there). SQLite keeps a write-ahead log beside the name a file is opened by:
    processes that open one file by two names each see a log of their own, so one misses the other's
    commits (an attempt marker among them: a side effect fired twice), and a log left beside one name is
    later played over the other's commits (a finished run back to halted, with no error)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    links = info.st_nlink
    if links <= 1 or not stat.S_ISREG(info.st_mode):  # a directory has two or more: callers say what it is
        return None
    return (
        f"{label} {path!r} has {links} names (hard links to one file): SQLite keeps the write-ahead log "
        "beside the name a file is opened by, so processes using different names would miss each other's "
        f"commits; keep one name (list the others with `find / -xdev -samefile {path}`, then remove them "
        "while no process has the file open), or copy the file instead of linking it"
    )


def _changed(path: str, identity: tuple[int, int], gone: str, replaced: str) -> str | None:
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return gone
    except OSError:
        return None
    return None if (info.st_dev, info.st_ino) == identity else f"{replaced} by another file"


def sqlite_uri(path: str, mode: str) -> str:
    """The URI SQLite opens the file at absolute `path` by, in `mode` (ro, rw, rwc). The authority is empty
    ("file://" then the path): a path starting with "//", which POSIX allows, would otherwise be read as a
    host name."""
    return f"file://{urllib.parse.quote(path)}?mode={mode}"


def connect_existing(opened: OpenedFile, timeout: float) -> sqlite3.Connection | str:
    """A connection to the file `opened` (SQLite's busy timeout `timeout` seconds), or what became of the
    file when the path no longer names it. The file is never created."""
    swapped = opened.swapped()
    if swapped is not None:
        return swapped
    try:
        conn = sqlite3.connect(
            sqlite_uri(opened.path, "rw"), uri=True, timeout=timeout, check_same_thread=False
        )
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


_SQLITE_MAGIC = b"SQLite format 3\x00"


def not_a_database(path: str) -> str | None:
    """Why the existing `path` cannot be a SQLite database file, or None (it is one, an empty file SQLite
    makes one of, or nothing is there): a directory, a pipe or device (opening one could block forever), or
    a file whose first bytes are not SQLite's."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):
        return "it is a directory, not a SQLite database file"
    if not stat.S_ISREG(info.st_mode):
        return "it is not a regular file (a pipe or a device), so not a SQLite database file"
    if info.st_size == 0:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
    except OSError:
        return None  # unreadable: opening it says why
    if head != _SQLITE_MAGIC:
        return "the file is not a SQLite database (another kind of file)"
    return None


def out_of_reach(path: str) -> str | None:
    """What keeps this user from the file `path` although it may well exist (a directory on the way that may
    not be searched, or the file's own mode), in words; None when nothing does or the file is simply not
    there (a missing file is its callers' to report)."""
    try:
        os.stat(path)
    except PermissionError:
        closed = unenterable_directory(path)
        which = f"the directory {closed}" if closed is not None else "a directory on its path"
        return f"permission denied reaching {path!r}: {which} may not be entered (searched) by this user"
    except OSError:
        return None
    if not os.access(path, os.R_OK):
        return f"permission denied: {path!r} is not readable by this user"
    return None


def unenterable_directory(path: str) -> str | None:
    """The first directory on the way to `path` that this user may not enter (search: no x permission for
    them), or None when each one may be entered (or one is missing: that is not this user's lack). The way
    is the kernel's: each name in turn as written (a `..` after a directory needs that directory entered), a
    symbolic link followed to where it leads."""
    way = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    for _ in range(40):  # (links followed at most; a loop gives up as the kernel does)
        parts = way.split(os.sep)
        for depth in range(2, len(parts) + 1):
            here = os.sep.join(parts[:depth]) or os.sep
            try:
                os.stat(here)
            except PermissionError:
                try:
                    target = os.readlink(here)  # (the directory holding the link may be entered)
                except OSError:  # (named as its real path: the way there may hold links and `..`)
                    return os.path.realpath(os.sep.join(parts[: depth - 1]) or os.sep)
                way = os.path.join(os.path.realpath(os.path.dirname(here)), target, *parts[depth:])
                break
            except OSError:
                return None
        else:
            return None
    return None


def why_unwritable(path: str, error: BaseException | None = None) -> str:
    """A hint for a SQLite file at `path` that cannot be opened or written: "" when nothing is found, else
    "; " and the likely cause. In WAL mode even a reader creates `-wal` and `-shm` files beside the store,
    so a full disk or a directory this user may not write makes opening fail ("disk I/O error", "unable to
    open database file", "attempt to write a readonly database"). Given `error` (the sqlite3 error met, or
    SQLAlchemy's wrapper of one), only a cause that can explain it is said: none for a lock held elsewhere,
    and a place SQLite may not write only for SQLite's refusals (read-only, cannot open), not for a disk
    I/O error."""
    code = _result_code(error)
    if code is not None and code not in _UNWRITABLE:
        return ""
    refused = code is None or code in _REFUSALS
    reach = out_of_reach(path)
    if reach is not None:
        return f"; {reach}"
    # Where SQLite writes: beside the file a symbolic link names, not beside the link.
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    name = os.path.basename(path)
    try:
        info = os.statvfs(directory)
    except OSError:
        return ""
    if info.f_flag & os.ST_RDONLY and refused:
        return f"; the file system holding {directory} is mounted read-only"
    if info.f_bavail * info.f_frsize < 64 * 1024:
        return f"; the disk holding {directory} is full: free some space (SQLite writes {name}-wal beside it)"
    if not refused:
        return ""
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"; {path!r} is not writable by this user"
    for beside in (f"{path}-wal", f"{path}-shm"):
        # Left by a process that opened a read-only store: SQLite gives it the main file's mode.
        if os.path.exists(beside) and not os.access(beside, os.W_OK):
            return (
                f"; {beside!r}, which SQLite keeps beside the store, is not writable by this user: make it "
                "writable as the store is (or remove it while no process has the store open)"
            )
    if not os.access(directory, os.W_OK | os.X_OK):
        return (
            f"; the directory {directory} is not writable by this user: SQLite creates {name}-wal and "
            f"{name}-shm beside the store"
        )
    return ""


# SQLite's primary result codes for a file that cannot be written (PERM, READONLY, IOERR, FULL, CANTOPEN),
# and among them its refusals, which a place it may not write explains (READONLY, CANTOPEN).
_UNWRITABLE = frozenset({3, 8, 10, 13, 14})
_REFUSALS = frozenset({8, 14})


def _result_code(error: BaseException | None) -> int | None:
    """SQLite's primary result code of `error` (a sqlite3 error, or SQLAlchemy's wrapper of one); None
    when there is none."""
    code = getattr(getattr(error, "orig", None) or error, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None
