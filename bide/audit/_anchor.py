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
from pathlib import Path
from typing import Protocol, runtime_checkable

from .._files import write_whole
from ._errors import AuditError
from ._formats import SignedTreeHead

__all__ = ["AnchorError", "DirectoryPublisher", "HttpPublisher", "Publisher"]


class AnchorError(AuditError):
    """A signed head could not be published; the head is valid, but not anchored: publish it again."""


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
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path_for(self, sth: SignedTreeHead) -> Path:
        """Where `sth` is (or will be) written."""
        return self.path_for_log(sth.log_id) / f"{sth.size:020d}-{sth.timestamp_ns}.json"

    def publish(self, sth: SignedTreeHead) -> None:
        target = self.path_for(sth)
        data = sth.to_json()
        if not self.directory.is_dir():
            what = "is not a directory" if self.directory.exists() else "does not exist"
            raise AnchorError(
                f"cannot publish the tree head: the anchor directory {self.directory} {what}; create it "
                "(DirectoryPublisher never creates it, so a mistyped path cannot hide a head)"
            )
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

    def anchored(self, log_id: str) -> list[tuple[Path, SignedTreeHead]]:
        """The heads of `log_id` already published here, with their files, in name order: each file of the
        run's folder named as `publish` names heads that reads, strictly, as a head of `log_id` (whoever
        signed it: check the signatures that matter). A symbolic link or other non-regular file there, or
        one that does not read as a head, is left out; no folder (or a link or file at its name, which
        `publish` refuses) gives none. Raises AnchorError when the folder cannot be read (an anchor that
        is a drop box, writable but not readable)."""
        folder = self.path_for_log(log_id)
        try:
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                return []
            raise AnchorError(f"cannot read the heads anchored in {folder}: {exc.strerror or exc}") from exc
        try:
            try:
                names = sorted(n for n in os.listdir(fd) if _HEAD_NAME.fullmatch(n))
            except OSError as exc:
                why = exc.strerror or exc
                raise AnchorError(f"cannot read the heads anchored in {folder}: {why}") from exc
            found = []
            for name in names:
                sth = _read_head(fd, name, log_id)
                if sth is not None:
                    found.append((folder / name, sth))
            return found
        finally:
            os.close(fd)

    def path_for_log(self, log_id: str) -> Path:
        """The folder of `log_id`'s heads."""
        return self.directory / hashlib.sha256(log_id.encode()).hexdigest()


_HANDLE = getattr(os, "O_PATH", os.O_RDONLY)
_HEAD_NAME = re.compile(r"[0-9]{20}-[0-9]+\.json")
_MAX_HEAD_FILE = 64 * 1024  # a head is a few hundred bytes (its run id at most 4,096 characters)


def _read_head(folder_fd: int, name: str, log_id: str) -> SignedTreeHead | None:
    """The head in the regular file `name` of the folder open as `folder_fd`, if it reads as one of
    `log_id`; O_NOFOLLOW and O_NONBLOCK: a link is not followed, and a pipe planted there is not waited on."""
    from ._errors import UnreadableInput
    from ._strict import parse_artifact

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb", buffering=0) as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = file.read(_MAX_HEAD_FILE + 1)
    except OSError:
        return None
    if len(data) > _MAX_HEAD_FILE:
        return None
    try:
        sth = parse_artifact(SignedTreeHead, data, what=name)
    except UnreadableInput:
        return None
    return sth if sth.log_id == log_id else None


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
