"""Anchoring: send every signed tree head somewhere the store's operator cannot rewrite.

Hashes alone detect accidental corruption. They detect tampering by whoever controls the store and the
signing key only once heads have left their reach: an auditor compares a head obtained from the anchor
with the journal (consistency proof) and the operator cannot produce a different history for an anchored
size without the mismatch showing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._files import StillLocked, hold_directory_lock, hold_lock_file, write_whole
from ._errors import AuditError, NotVerified
from ._formats import SignedTreeHead

if TYPE_CHECKING:
    from ._keys import PublicKey
    from ._log import AuditLog

__all__ = [
    "LOCK_FILE",
    "AnchorError",
    "Comparison",
    "DirectoryPublisher",
    "ForkRefused",
    "HttpPublisher",
    "Publisher",
]

#: The file in an anchor directory that whoever compares and publishes there holds locked (`bide-audit
#: export --anchor-dir`, `DirectoryPublisher.publish_checked`), made for the while and removed after (hidden:
#: not a head).
LOCK_FILE = ".bide-audit-export.lock"
#: How long a publisher waits for another one comparing and publishing in its anchor directory.
LOCK_WAIT_S = 30.0
# How many runs' heads one DirectoryPublisher remembers (`_Known`): the most recently published.
_KNOWN_KEPT = 1024

# How a library's ForkRefused says to publish the fork all the same (the export's says --allow-fork).
_ALLOW_IN_THE_LIBRARY = (
    "publish it with `DirectoryPublisher.publish_checked(log, error.sth, allow_fork=True)` (or `publish`, "
    "which compares nothing)"
)


class AnchorError(AuditError):
    """A signed head could not be published; the head is valid, but not anchored: publish it again."""


class ForkRefused(AnchorError, NotVerified):
    """The head was not published: it forks from a head of its run already anchored in the directory (the
    log's key would have signed two histories of one run). The journal is not the one that was anchored: it
    was changed behind bide, the store rolled back, or the run started again under the same id. Publishing
    again does not help: restore the store from a backup, or publish the fork knowingly
    (`DirectoryPublisher.publish_checked(log, error.sth, allow_fork=True)`). `comparison` says what was
    found, `sth` is the head refused."""

    def __init__(self, message: str, comparison: Comparison) -> None:
        super().__init__(message)
        self.comparison = comparison
        self.sth = comparison.sth


@dataclass(frozen=True)
class Comparison:
    """What comparing `sth` with the heads of its run anchored in `directory` found
    (`DirectoryPublisher.compare`): each anchored head it forks from, as (file, head, why); the key ids of
    the run's heads there signed by keys that were not compared (`others`); and, when the heads there
    could not be read (a drop box: writable, not readable), why (`unreadable`: then none was compared)."""

    sth: SignedTreeHead
    directory: Path
    forks: tuple[tuple[Path, SignedTreeHead, str], ...] = ()
    others: tuple[str, ...] = ()
    unreadable: str | None = None
    #: The ids of the keys whose heads were compared: `sth`'s, and the log's earlier ones.
    key_ids: frozenset[str] = frozenset()
    #: The heads `sth` was compared with, as (file, head).
    compared: tuple[tuple[Path, SignedTreeHead], ...] = field(default=(), repr=False)

    def forks_in_words(self) -> str:
        """The first few heads it forks from, for a message: each one's file, size, key (when another than
        `sth`'s) and why."""
        named = "; ".join(_fork_in_words(path, head, why, self.sth) for path, head, why in self.forks[:3])
        if len(self.forks) > 3:
            named += f"; and {len(self.forks) - 3} more"
        return named

    def refusal(
        self,
        *,
        nothing_done: str = "Nothing was published",
        allow: str = _ALLOW_IN_THE_LIBRARY,
        earlier: str = "one of the publisher's earlier_keys",
    ) -> ForkRefused:
        """The error that refuses to publish `sth` for its forks, saying what they mean and what to do:
        `nothing_done` says what was not done, `allow` how to publish it all the same, and `earlier` where
        the log's earlier keys were given."""
        sth = self.sth
        keys = "and key" if all(head.key_id == sth.key_id for _, head, _ in self.forks) else (
            f"(signed by its key or {earlier})"
        )
        return ForkRefused(
            f"the head of run {sth.log_id!r} at {sth.size} records forks from a head of the same run {keys} "
            f"already anchored in {self.directory}: {self.forks_in_words()}. The journal is not the one that "
            "head was signed over: it was changed behind bide, the store rolled back, or the run deleted and "
            f"started again under the same id. {nothing_done}. Restore the store from a backup (`bide show "
            "RUN` shows the journal as it is); to publish this head beside the anchored ones all the same, "
            f"as a fork every auditor of the directory will see, {allow}",
            self,
        )


def _fork_in_words(path: Path, head: SignedTreeHead, why: str, sth: SignedTreeHead) -> str:
    key = "" if head.key_id == sth.key_id else f", signed by {head.key_id}"
    return f"{path} ({head.size} records{key}): {why}"


@dataclass
class _Known:
    """What a publisher knows of a run's folder once it published a head there that forks from none: the
    files it has read (`names`), and the heads a later head must still be compared with (`heads`: that one
    and those larger than it). Every other head read there is a prefix of that head, so a head consistent
    with it is consistent with them too."""

    names: set[str]
    heads: tuple[tuple[Path, SignedTreeHead], ...]


@runtime_checkable
class Publisher(Protocol):
    """Receives each signed tree head; must raise (never return) when the head was not durably accepted."""

    def publish(self, sth: SignedTreeHead) -> None:
        """Anchor one head."""
        ...


class DirectoryPublisher:
    """Writes each head to ``<directory>/<sha256(log_id) hex>/<size, 20 digits>-<timestamp_ns>.json``.

    Point it at a directory the operator cannot rewrite (another machine's mount, an append-only bucket
    synced elsewhere, a WORM volume): a directory on the same disk only guards against accidents.
    Files are written whole (temporary file, fsync, then an exclusive link into place) and never
    overwritten. The directory must exist: it is never created (a head published under a mistyped path
    would sit where nobody looks for it), only the per-log folder inside it, which a failed write (a full
    disk: AnchorError caused by the OSError) removes again if it created it and it is still empty.

    `AuditLog.sign_head` publishes through `publish_checked`: a head that forks from one of its run already
    anchored here (signed by the log's key, or one of `earlier_keys`, its keys before a rotation) is refused
    (`ForkRefused`), not published beside it. `publish` alone writes the head without comparing.
    """

    def __init__(self, directory: str | os.PathLike[str], *, earlier_keys: Sequence[PublicKey] = ()) -> None:
        self.directory = Path(directory)
        self.earlier_keys = tuple(earlier_keys)
        self._known: dict[tuple[str, frozenset[str]], _Known] = {}  # most recently published last
        # Per run (log id): names of files in its folder named like heads that did not read as heads of it.
        self._not_heads: dict[str, set[str]] = {}
        self._publishing = threading.Lock()  # one comparison and publication at a time in this process

    def path_for(self, sth: SignedTreeHead) -> Path:
        """Where `sth` is (or will be) written."""
        return self.path_for_log(sth.log_id) / f"{sth.size:020d}-{sth.timestamp_ns}.json"

    def publish_checked(self, log: AuditLog, sth: SignedTreeHead, *, allow_fork: bool = False) -> Comparison:
        """Publish `sth`, a head `log` signed, unless it forks from a head of its run already anchored here
        (`compare`): then `ForkRefused` and nothing is published, unless `allow_fork`. What
        `AuditLog.sign_head` does with this publisher. Compared and published under the directory's lock
        (`locked`, the one `bide-audit export --anchor-dir` takes), so two publishers at once take turns and
        the second is compared with the first's head; one kept waiting 30 s in all (`LOCK_WAIT_S`, behind
        other threads of this process as well as other publishers) raises AnchorError. Heads there
        that cannot be read (a drop box) are not compared, and the head is published. Returns what the
        comparison found."""
        self._check_directory()
        # One deadline for both waits: threads of this process queued behind one that waits for another
        # process's lock each give up LOCK_WAIT_S after they began, not one wait after another.
        until = time.monotonic() + LOCK_WAIT_S
        still_locked = AnchorError(
            f"cannot publish the tree head: the anchor directory {self.directory} stayed locked by "
            f"another publisher for {LOCK_WAIT_S:g} s (a paused or stuck `bide-audit export`, say); "
            "nothing was published: publish again"
        )
        if not self._publishing.acquire(timeout=LOCK_WAIT_S):
            raise still_locked
        try:
            with self.locked(wait=max(0.0, until - time.monotonic())):
                found = self.compare(log, sth)
                if found.forks and not allow_fork:
                    raise found.refusal()
                self.publish(sth)
                self._remember(found)
        except StillLocked:
            raise still_locked from None
        finally:
            self._publishing.release()
        return found

    @contextlib.contextmanager
    def locked(self, wait: float = LOCK_WAIT_S) -> Iterator[bool]:
        """Hold the directory's locks meanwhile, waiting up to `wait` seconds for another publisher
        (`bide-audit export --anchor-dir`, or `publish_checked` in another process), then `StillLocked` (an
        OSError): an exclusive `flock` on the lock file `LOCK_FILE` there (removed after: a file can be
        locked where a directory cannot, as on NFS, and in a directory this user may write but not list)
        and on the directory itself (what exports before the lock file locked). Yields whether either was
        taken (neither, on a file system that locks neither)."""
        until = time.monotonic() + wait
        with contextlib.ExitStack() as stack:
            by_file = hold_lock_file(self.directory / LOCK_FILE, until, stack)
            by_directory = hold_directory_lock(self.directory, until, stack)
            yield by_file or by_directory

    def compare(
        self, log: AuditLog, sth: SignedTreeHead, *, earlier_keys: Sequence[PublicKey] | None = None
    ) -> Comparison:
        """Compare `sth`, a head `log` signed, with the heads of its run anchored here signed by `log`'s key
        or one of `earlier_keys` (default: this publisher's), by consistency proofs from the run's tree
        (`AuditLog.forks`). Hold `locked()` from here to the publication, so that no head comes in between.
        The heads this publisher already compared and published past are not read again (a file here is
        never rewritten)."""
        keys = self.earlier_keys if earlier_keys is None else tuple(earlier_keys)
        ids = frozenset({sth.key_id, *(key.key_id for key in keys)})
        known = self._known.get((sth.log_id, ids))
        try:
            if known is None:
                read = self.anchored(sth.log_id)
            else:
                read = self.anchored(sth.log_id, besides=known.names)
        except AnchorError as exc:  # a drop box: writable, not readable
            return Comparison(sth, self.directory, unreadable=str(exc), key_ids=ids)
        heads = (*(known.heads if known is not None else ()), *read)
        others = tuple(sorted({head.key_id for _, head in read} - ids))
        forks = log.forks(sth, [head for _, head in heads], earlier_keys=keys)
        found = tuple((*heads[i], why) for i, why in forks)
        return Comparison(sth, self.directory, found, others, key_ids=ids, compared=heads)

    def _remember(self, found: Comparison) -> None:
        """Once `found.sth` is published: what the next comparison of its run may skip (`_Known`)."""
        sth, key = found.sth, (found.sth.log_id, found.key_ids)
        known = self._known.pop(key, None)  # put back last (the most recent), unless forgotten
        if found.forks or found.unreadable is not None:
            return  # a fork published knowingly, or nothing read: all compared next time
        if known is None:
            known = _Known(set(), ())
        self._known[key] = known
        # A long-lived publisher of ever more runs: the oldest published are forgotten (and compared in full
        # should they be published again), so no run pins its names for the life of the process.
        while len(self._known) > _KNOWN_KEPT:
            self._known.pop(next(iter(self._known)))
        kept = {log_id for log_id, _ in self._known}
        for log_id in [log_id for log_id in self._not_heads if log_id not in kept]:
            del self._not_heads[log_id]
        own = self.path_for(sth)
        known.names.update(path.name for path, _ in found.compared)
        known.names.add(own.name)
        ids = found.key_ids
        larger = [(f, head) for f, head in found.compared if head.key_id in ids and head.size > sth.size]
        known.heads = ((own, sth), *larger)

    def _check_directory(self) -> None:
        if not self.directory.is_dir():
            what = "is not a directory" if self.directory.exists() else "does not exist"
            raise AnchorError(
                f"cannot publish the tree head: the anchor directory {self.directory} {what}; create it "
                "(DirectoryPublisher never creates it, so a mistyped path cannot hide a head)"
            )

    def publish(self, sth: SignedTreeHead) -> None:
        """Write `sth` here, without comparing it with the heads anchored here (`publish_checked` does)."""
        target = self.path_for(sth)
        data = sth.to_json()
        self._check_directory()
        folder = target.parent.name
        created = False
        # The run's folder is opened once, refusing a symbolic link (O_NOFOLLOW), and the head is written
        # through that handle: a link planted at its name, before or during the write, sends nothing
        # outside the directory. (The anchor directory itself is the operator's: it may be a link.)
        # O_PATH: a handle that needs no read permission (an anchor may be a drop box: write and search only).
        try:
            top = os.open(self.directory, _HANDLE | os.O_DIRECTORY)
        except OSError as exc:
            raise AnchorError(f"cannot publish the tree head to {self.directory}: {exc}") from exc
        try:
            try:
                try:
                    os.mkdir(folder, dir_fd=top)
                    created = True
                except FileExistsError:
                    pass
                try:
                    own = os.open(folder, _HANDLE | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    raise AnchorError(
                        f"cannot publish the tree head: {target.parent} is not a folder publish() made (a "
                        "symbolic link or a file), and nothing is written through it; remove it, and the "
                        "folder is made again"
                    ) from None
                try:
                    held = _through(own, target)
                    # Linked into place exclusively: no window between a check and the write, so an anchored
                    # head is never overwritten (not even by a racing publisher) and never seen half-written.
                    try:
                        # Not tidy: a folder of many heads, each name written once (see write_whole).
                        write_whole(held, data, overwrite=False, tidy=False)
                    except FileExistsError:
                        if held.read_bytes() == data:
                            return
                        raise AnchorError(
                            f"{target} exists with other contents; refusing to overwrite an anchored head"
                        ) from None
                finally:
                    os.close(own)
            except OSError as exc:
                if created:  # an empty folder would look like a log whose heads were lost
                    with contextlib.suppress(OSError):  # not empty: a racing publisher's head is in it
                        os.rmdir(folder, dir_fd=top)
                raise AnchorError(f"cannot write the tree head to {target}: {exc}") from exc
        finally:
            os.close(top)

    def anchored(
        self, log_id: str, *, besides: AbstractSet[str] = frozenset()
    ) -> list[tuple[Path, SignedTreeHead]]:
        """The heads of `log_id` already published here, with their files, in name order: each file of the
        run's folder named as `publish` names heads that reads, strictly, as a head of `log_id` (whoever
        signed it: check the signatures that matter). A symbolic link or other non-regular file there, or
        one that does not read as a head, is left out; no folder (or a link or file at its name, which
        `publish` refuses) gives none. Raises AnchorError when the folder cannot be read (an anchor that
        is a drop box, writable but not readable). Files named in `besides` (read before) are left out."""
        folder = self.path_for_log(log_id)
        # The files this publisher read whole and found not to be heads of the run are not read again (a file
        # here is never rewritten): a junk file does not cost a parse at every anchoring.
        not_heads: AbstractSet[str] = self._not_heads.get(log_id, frozenset())
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return []
            raise AnchorError(f"cannot read the heads anchored in {folder}: {exc.strerror or exc}") from exc
        try:
            try:
                names = sorted(
                    n
                    for n in os.listdir(fd)
                    if n not in besides and n not in not_heads and _HEAD_NAME.fullmatch(n)
                )
            except OSError as exc:
                why = exc.strerror or exc
                raise AnchorError(f"cannot read the heads anchored in {folder}: {why}") from exc
            found = []
            for name in names:
                sth = _read_head(fd, name, log_id)
                if isinstance(sth, SignedTreeHead):
                    found.append((folder / name, sth))
                elif sth is _NOT_A_HEAD:
                    self._not_heads.setdefault(log_id, set()).add(name)
            return found
        finally:
            os.close(fd)

    def path_for_log(self, log_id: str) -> Path:
        """The folder of `log_id`'s heads."""
        return self.directory / hashlib.sha256(log_id.encode()).hexdigest()


_HANDLE = getattr(os, "O_PATH", os.O_RDONLY)
_HEAD_NAME = re.compile(r"[0-9]{20}-[0-9]+\.json")
_MAX_HEAD_FILE = 64 * 1024  # a head is a few hundred bytes (its run id at most 4,096 characters)


class _NotAHead:
    """What `_read_head` returns for a file it read and judged: not a head of the run."""


_NOT_A_HEAD = _NotAHead()


def _read_head(folder_fd: int, name: str, log_id: str) -> SignedTreeHead | _NotAHead | None:
    """The head in the regular file `name` of the folder open as `folder_fd`, if it reads as one of
    `log_id`; O_NOFOLLOW and O_NONBLOCK: a link is not followed, and a pipe planted there is not waited on.
    `_NOT_A_HEAD` when it was judged (not a regular file, too large, not a head, another run's), None when
    it could not be opened or read (which may pass: it is read again next time)."""
    from ._errors import UnreadableInput
    from ._strict import parse_artifact

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb", buffering=0) as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return _NOT_A_HEAD
            data = file.read(_MAX_HEAD_FILE + 1)
    except OSError:
        return None
    if len(data) > _MAX_HEAD_FILE:
        return _NOT_A_HEAD
    try:
        sth = parse_artifact(SignedTreeHead, data, what=name)
    except UnreadableInput:
        return _NOT_A_HEAD
    return sth if sth.log_id == log_id else _NOT_A_HEAD


def _through(folder_fd: int, target: Path) -> Path:
    """`target`'s name inside the folder open as `folder_fd`, as a path that reaches that very folder
    (Linux's /proc/self/fd), not whatever its name leads to now; `target` itself where there is no /proc."""
    handle = Path(f"/proc/self/fd/{folder_fd}")
    return handle / target.name if handle.is_dir() else target


class HttpPublisher:
    """POSTs each head as JSON (``Content-Type: application/json``) to `url`; any answer but 2xx, or no
    answer within `timeout` seconds, raises AnchorError."""

    def __init__(self, url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def publish(self, sth: SignedTreeHead) -> None:
        import httpx  # on first use: loading it at import would cost every audit CLI call

        try:
            resp = httpx.post(self.url, content=sth.to_json(), headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise AnchorError(f"cannot publish the tree head to {self.url}: {exc}") from exc
        if not 200 <= resp.status_code < 300:
            raise AnchorError(f"{self.url} refused the tree head: HTTP {resp.status_code} {resp.text[:200]}")
