"""Writing a file whole: never half-written, never through a planted symlink, optionally never overwriting."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from ._errors import ConfigError

__all__ = [
    "KEY_FILE_LIMIT",
    "PAIR_LOCK_WAIT_S",
    "SecondNotPlaced",
    "Staged",
    "StillLocked",
    "check_output",
    "hold_directory_lock",
    "hold_lock_file",
    "pair_being_written",
    "pair_locked",
    "read_small_file",
    "remove_leftovers",
    "replace_pair",
    "replaced_file",
    "staged",
    "sync_directory",
    "write_whole",
]

#: Far more than any key file holds (an Ed25519 PEM is about 120 bytes).
KEY_FILE_LIMIT = 64 * 1024


def read_small_file(
    path: str | os.PathLike[str], limit: int = KEY_FILE_LIMIT, *, too_large: str = "not a key file"
) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. Anything else raises OSError saying
    what it is: a pipe with no writer would block forever, a device like /dev/zero never ends, and a file
    of gigabytes is not a key (EFBIG, its message ending in `too_large`). The file is opened once and
    checked and read through that descriptor: a path replaced meanwhile (a save by rename) is read whole,
    old or new, never a mix."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a pipe does not wait for a writer
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a pipe, a device or a directory)")
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit:,} bytes: {too_large}")
        data = bytearray()
        while len(data) <= limit:  # in pieces: a limit of gigabytes allocates no more than the file holds
            piece = f.read(min(1 << 20, limit + 1 - len(data)))
            if not piece:
                break
            data += piece
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit:,} bytes: {too_large}")
    return bytes(data)


def check_output(output: str, *, inputs: Iterable[str | os.PathLike[str]] = (), flag: str = "-o") -> Path:
    """`output` as a Path, once it is known to be writable as a new or replaced file: the file it names (at
    the end of its symlinks, which `write_whole` writes through: `replaced_file`) has a directory that
    exists and is writable, is not itself a directory nor anything else but a regular file (a device, a
    pipe: the rename that writes it would replace `/dev/null` itself), and is not the same file as any of
    `inputs` (by resolved path, and by inode where both exist, so hard links and symlinks count). A link
    owned by another user, or a loop of links, is refused too. Raises ConfigError (a usage error)
    otherwise, before anything has been written."""
    path = Path(output)
    try:
        if output.endswith(("/", os.sep)) or path.is_dir():
            raise ConfigError(f"{flag} {output} is a directory; give the path of a file to write")
        target = replaced_file(path)
        if target.exists() and not target.is_file():
            raise ConfigError(
                f"{flag} {output} is not a regular file (a device or a pipe); give the path of a file"
            )
        directory = target.parent
        if not directory.is_dir():
            raise ConfigError(f"{flag} {output}: the directory {directory} does not exist")
    except PermissionError as exc:  # a link owned by another user (`replaced_file`)
        raise ConfigError(f"{flag} {output}: {exc.strerror or exc}; nothing was written") from None
    except OSError as exc:  # a loop of links, a name longer than the filesystem takes
        why = "a loop of symbolic links" if exc.errno == errno.ELOOP else exc.strerror or exc
        raise ConfigError(f"{flag} {output} cannot be a file here: {why}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {output}: the directory {directory} is not writable")
    resolved = os.path.realpath(target)
    for item in inputs:
        other = Path(item)
        same = resolved == os.path.realpath(other)
        if not same and target.exists() and other.exists():
            same = os.path.samefile(target, other)
        if same:
            raise ConfigError(
                f"{flag} {output} is the input file {os.fspath(other)}; writing there would destroy it"
            )
    refusal = private_key_refusal(target)  # (an input key is named as the input above)
    if refusal is not None:
        raise ConfigError(
            f"{flag} {output} {refusal}; refusing to write over it: give another output path (a key lost "
            "cannot be made again)"
        )
    return path


def private_key_refusal(path: str | os.PathLike[str]) -> str | None:
    """Why an output must not be written over the regular file at `path` (through symlinks), or None: it
    holds a private key (a PEM private key block in its first 64 KiB, as the key files `keygen` writes and
    OpenSSH's and OpenSSL's; or a DER one), or this process cannot read it to tell (another user's key file
    in a directory it may write to). None when nothing, or no regular file, is there."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a pipe there must not block
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EACCES and os.path.isfile(path):
            return "cannot be read to check that it holds no private key (another user's key file?)"
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        head = os.read(fd, _KEY_SCAN_BYTES + 1)
    except OSError:
        return "cannot be read to check that it holds no private key"
    finally:
        os.close(fd)
    # Anywhere in its start, at the start of a line: OpenSSL writes EC parameters, a certificate or bag
    # attributes before the key in some files. (A key quoted in a JSON artifact has its line breaks escaped.)
    if _PEM_PRIVATE_KEY.search(head) is not None or _der_private_key(head):
        return "holds a private key"
    return None


def _der_private_key(data: bytes) -> bool:
    """`data` is a whole DER private key (PKCS#8, encrypted or not, or a traditional one)."""
    if not data.startswith(b"\x30") or len(data) > _KEY_SCAN_BYTES:  # an ASN.1 SEQUENCE, a key's size
        return False
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        serialization.load_der_private_key(data, password=None)
    except TypeError:  # encrypted: a key all the same
        return True
    except (ValueError, UnsupportedAlgorithm):  # not a key (or one no one here reads)
        return False
    return True


_KEY_SCAN_BYTES = 1 << 16
_PEM_PRIVATE_KEY = re.compile(rb"(?m)^-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----\s*$")


def write_whole(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    overwrite: bool = True,
    before_rename: Callable[[], None] | None = None,
    owner: tuple[int, int] | None = None,
    tidy: bool = True,
) -> None:
    """Write `data` to `path`, all of it or nothing.

    The bytes go to a fresh temporary file beside `path` (`staged`), and then the file is renamed over
    `path` (`overwrite`; a symlink there is written through, see `replaced_file`), or linked to `path`
    exclusively (not `overwrite`: `FileExistsError` when `path` exists, with no window between that check
    and the write). The new directory entry is fsynced too.

    On a filesystem without hard links (some network and object-store mounts) the exclusive write creates
    `path` itself with O_EXCL and writes it there: still never overwriting, but a crash in the middle can
    leave a short file, which a later write of the same bytes then reports as existing with other contents.

    `before_rename` runs once the bytes are staged, before they take the name: what must happen only if the
    file can be written (a full disk fails the staging), and before anyone can read it.

    `owner` (uid, gid) is given to the new file as far as this process may (root: both; its owner: a group
    it belongs to; else neither), so that a file replaced keeps who may read it. A group it could not give
    gets none of `mode`'s group bits: they were meant for the group `owner` names, not this process's.

    `tidy`: first remove the temporaries earlier writers of `path` left when killed (`remove_leftovers`),
    which lists the directory; a writer of many files in one directory, each name written once, passes
    False (listing at each write would cost it time in proportion to the files there).
    """
    if overwrite:
        path = replaced_file(path)
    if tidy:
        remove_leftovers(path)
    # With an owner to give, staged for its owner alone until the group it is for is set (`_give_owner`).
    temp = staged(path, data, mode=mode if owner is None else mode & 0o700)
    tmp = temp.path
    try:
        if owner is not None:
            _give_owner(tmp, owner, mode)
        if before_rename is not None:
            before_rename()
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
        temp.let_go()
    sync_directory(path)


def _give_owner(path: Path, owner: tuple[int, int], mode: int) -> None:
    """Give `path` the owner and group `owner`, or its group alone, or neither, whichever this process may,
    and then `mode`, without its group bits when the group is not `owner`'s."""
    uid, gid = owner
    for wanted in ((uid, gid), (-1, gid)):
        try:
            os.chown(path, *wanted)
        except PermissionError:
            continue
        os.chmod(path, mode)  # a change of owner clears set-id bits; the mode is as asked all the same
        return
    os.chmod(path, mode & ~0o070)  # this process's own group was never chosen to read it


def replaced_file(path: Path) -> Path:
    """The file an overwrite of `path` replaces: `path` itself, or where the symlinks at `path` lead (a
    certificate deployed through a link is updated where it lives; renaming over the link would leave the
    file it points to stale). Only links owned by this user (or root) are followed, as the kernel's
    protected_symlinks does: a link planted by someone else raises PermissionError instead of being
    written through."""
    me = os.geteuid() if hasattr(os, "geteuid") else 0
    for _ in range(40):  # the kernel's own limit on links in a row
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return path
        if not stat.S_ISLNK(info.st_mode):
            return path
        if info.st_uid not in (me, 0):
            raise PermissionError(
                errno.EACCES,
                f"{path} is a symbolic link owned by another user, not written through (give the path of "
                "the file itself)",
            )
        path = path.parent / os.readlink(path)
    raise OSError(errno.ELOOP, f"too many levels of symbolic links at {path}")


class Staged:
    """A temporary file `staged` beside its target, and the descriptor holding its writer's lock on it (an
    exclusive `flock`, taken before the file had its name): `remove_leftovers` removes only temporaries
    whose lock is free, so a live writer's is never taken from under it. `let_go()` once the temporary name
    is gone (renamed over the target, or unlinked)."""

    __slots__ = ("fd", "path")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def let_go(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def staged(path: Path, data: bytes, *, mode: int = 0o644) -> Staged:
    """A fresh temporary file beside `path` holding all of `data`, fsynced, with `mode`: created exclusively
    under an unpredictable name (``.NAME.<12 random hex digits>.tmp``), so a symlink planted there is never
    followed, and locked by this process (`Staged`). The caller renames it into place (then
    `sync_directory`) or removes it, then lets go of it; if writing fails, nothing is left.

    On Linux the bytes are written to an unnamed file (O_TMPFILE) that gets its name only once it is
    whole: a process killed while writing (SIGKILL, or a SIGTERM it does not handle: what `timeout`,
    systemd and `docker stop` send) leaves nothing behind, not a partial hidden file per try. One killed
    after the name was given and before it was renamed or unlinked leaves the named temporary, unlocked:
    the next write of `path` removes it (`remove_leftovers`)."""
    directory = path.parent if str(path.parent) else Path(".")
    unnamed = _written_unnamed(directory, data, mode)
    if unnamed is not None:
        try:
            _lock(unnamed)  # before it has a name: a named temporary of a live writer is always locked
            return Staged(_named(unnamed, directory, path.name), unnamed)
        except OSError:
            os.close(unnamed)  # no /proc to name it through: written again the portable way below
        except BaseException:
            os.close(unnamed)
            raise
    fd, tmp = _created_named(directory, path.name)
    try:
        _lock(fd)  # before its first byte: an empty temporary is never removed (`_remove_if_abandoned`)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        os.close(fd)
        raise
    return Staged(tmp, fd)


def _created_named(directory: Path, name: str) -> tuple[int, Path]:
    """A new empty file beside `name` in `directory`, open for writing, under a fresh temporary name
    (`_temporary_name`) for its owner alone: created exclusively, so nothing already there (a symlink
    planted at the name) is ever opened; a name taken draws another."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = _temporary_name(directory, name)
        try:
            return os.open(tmp, flags | getattr(os, "O_BINARY", 0), 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {name} in {directory}")


def _temporary_name(directory: Path, name: str) -> Path:
    """A fresh unpredictable name for a temporary of `name` in `directory`: ``.NAME.<12 hex digits>.tmp``,
    the one form `remove_leftovers` removes."""
    return directory / f".{name}.{secrets.token_hex(6)}.tmp"


def _lock(fd: int) -> None:
    """Take this process's exclusive lock on the file open as `fd` (none where the system has no `flock`,
    or the filesystem refuses it: then its temporaries are never proved abandoned, only left)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file nobody else can have opened yet: never waits


def remove_leftovers(path: Path) -> None:
    """Remove the temporaries `staged` left beside `path` by writers killed before renaming or unlinking
    them (SIGKILL, a power cut): files named as `path`'s temporaries are (``.NAME.<12 hex digits>.tmp``),
    not empty, whose writer's lock is free (it is freed when its process ends, however it ends), and owned
    by this user, or, for root, by the owner of the file at `path` (to whom a write as root gives its
    temporary before the rename: `write_whole`'s `owner`). A temporary of a writer still at work is locked,
    and is left alone; so is anything else. Nothing raises here: a leftover that cannot be removed stays."""
    directory = path.parent if str(path.parent) else Path(".")
    prefix = f".{path.name}."
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:  # every step through the directory opened once: a directory swapped for a link meanwhile is not seen
        with os.scandir(dir_fd) as entries:
            found = [e.name for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
        owners = _leftover_owners(path.name, dir_fd)
        for name in found:
            if _TEMPORARY_TAIL.fullmatch(name, len(prefix)) is not None:
                _remove_if_abandoned(name, dir_fd, owners)
    except (OSError, TypeError, NotImplementedError):  # also: no calls by a directory's descriptor here
        return
    finally:
        os.close(dir_fd)


# What `staged` puts between ".NAME." and ".tmp" (`_temporary_name`).
_TEMPORARY_TAIL = re.compile(r"[0-9a-f]{12}\.tmp")


def _leftover_owners(name: str, dir_fd: int) -> frozenset[int]:
    """Whose temporaries of `name` this process may remove: its own; for root, also those of the owner of
    the regular file `name` (its writer gave them that owner, and root replaces that user's file anyway)."""
    me = os.geteuid() if hasattr(os, "geteuid") else -1
    if me != 0:
        return frozenset({me})
    try:
        target = os.lstat(name, dir_fd=dir_fd)
    except OSError:
        return frozenset({me})
    return frozenset({me, target.st_uid}) if stat.S_ISREG(target.st_mode) else frozenset({me})


def _remove_if_abandoned(name: str, dir_fd: int, owners: frozenset[int]) -> None:
    try:
        import fcntl
    except ImportError:
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
    except OSError:
        return
    try:
        info = os.fstat(fd)
        # Empty: maybe a portable temporary between its creation and its writer's lock (see `staged`).
        if not stat.S_ISREG(info.st_mode) or info.st_size == 0 or info.st_uid not in owners:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return  # its writer is at work (or this filesystem has no locks: nothing is proved)
        now = os.lstat(name, dir_fd=dir_fd)
        if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):  # still the file that was locked
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        return
    finally:
        os.close(fd)


def _written_unnamed(directory: Path, data: bytes, mode: int) -> int | None:
    """An open descriptor of an unnamed file in `directory` holding all of `data`, fsynced, with `mode`;
    None where the system or the filesystem has no unnamed files (then nothing was written)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        fd = os.open(directory, flag | os.O_WRONLY, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOTSUP):
            return None
        raise
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        os.close(fd)  # an unnamed file goes with its last descriptor
        raise
    return fd


def _named(fd: int, directory: Path, name: str) -> Path:
    """Give the unnamed file `fd` a fresh unpredictable name beside `name` in `directory` (a link never
    follows a symlink planted at its target: it fails, and another name is drawn)."""
    for _ in range(100):
        tmp = _temporary_name(directory, name)
        try:
            _link_descriptor(fd, tmp)
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {name} in {directory}")


_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000


def _link_descriptor(fd: int, target: Path) -> None:
    """Link the file open as `fd` at `target`: `linkat(fd, "", AT_FDCWD, target, AT_EMPTY_PATH)`, which
    Python's `os.link` cannot express, else through `/proc/self/fd`. Each alone fails somewhere: the
    first without CAP_DAC_READ_SEARCH before Linux 6.10 (ENOENT), the second where /proc's links cross
    devices (EXDEV, seen on some virtual machines' kernels) or there is no /proc."""
    linkat = _libc_linkat()
    if linkat is not None:
        if linkat(fd, b"", _AT_FDCWD, os.fsencode(target), _AT_EMPTY_PATH) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(target))
    os.link(f"/proc/self/fd/{fd}", target, follow_symlinks=True)


@functools.cache
def _libc_linkat() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        linkat: Any = ctypes.CDLL(None, use_errno=True).linkat
    except (OSError, AttributeError):
        return None
    linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    linkat.restype = ctypes.c_int
    return cast(Callable[..., int], linkat)


class SecondNotPlaced(OSError):
    """`replace_pair` placed the first file but could not place the second, and removed the first again
    (its cause is the rename's error)."""


def replace_pair(first: Path, first_data: bytes, first_mode: int, second: Path, second_data: bytes,
                 second_mode: int) -> None:  # fmt: skip
    """Write two files that belong together (a private key and its public half), replacing any there, so
    that no failure leaves a new first file beside an old second one.

    Both are written in full to temporary files beside their targets (`staged`) before either is renamed
    into place: a write that fails (a full disk) raises OSError and leaves the old files as they were. If
    the second rename fails once the first is done, the new first file is removed again and
    `SecondNotPlaced` is raised. The whole write holds the pair's lock (`pair_locked`; `StillLocked`, an
    OSError, when another writer keeps it too long): two writers of one pair at once take turns, so the
    pair left is one writer's, never one's first file beside the other's second. A process killed outright
    between the two renames still leaves the new first file beside the old second one: whoever reads the
    pair compares the two (`bide.audit.load_signing_key` does). The caller fsyncs the directory afterwards
    (`sync_directory`): an error there comes once the new pair is in place, so it is not one of these.
    """
    with pair_locked(first):
        _replace_pair_locked(first, first_data, first_mode, second, second_data, second_mode)


def _replace_pair_locked(first: Path, first_data: bytes, first_mode: int, second: Path, second_data: bytes,
                         second_mode: int) -> None:  # fmt: skip
    temps: list[Staged] = []
    remove_leftovers(first)
    remove_leftovers(second)
    try:
        temps.append(staged(first, first_data, mode=first_mode))
        temps.append(staged(second, second_data, mode=second_mode))
        os.replace(temps[0].path, first)
        try:
            os.replace(temps[1].path, second)
        except BaseException as exc:  # Ctrl-C between the renames too: never a new first beside an old second
            first.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise SecondNotPlaced(exc.errno, exc.strerror) from exc
            raise
    finally:
        for tmp in temps:
            tmp.path.unlink(missing_ok=True)
            tmp.let_go()


#: How long a writer of a pair of files (`pair_locked`) waits for another writer of the same pair.
PAIR_LOCK_WAIT_S = 30.0


@contextlib.contextmanager
def pair_locked(first: Path, *, wait: float | None = None) -> Iterator[None]:
    """Hold the lock of the pair of files named after `first` (a key file and its .pub) meanwhile: an
    exclusive `flock` on the lock file ``.NAME.lock`` beside `first` (made for the while and removed after,
    as the anchor directory's lock file is: see `hold_lock_file`), or, where that file cannot be made, on
    the directory itself. Waits up to `wait` seconds (default `PAIR_LOCK_WAIT_S`) for another writer of
    the pair, then raises `StillLocked`; where neither can be locked (a file system without locks) the
    block runs unlocked."""
    directory = first.parent if str(first.parent) else Path(".")
    lock = _pair_lock_file(first)
    limit = PAIR_LOCK_WAIT_S if wait is None else wait
    with contextlib.ExitStack() as stack:
        try:
            if not hold_lock_file(lock, time.monotonic() + limit, stack):
                hold_directory_lock(directory, time.monotonic() + limit, stack)
        except StillLocked:
            raise StillLocked(
                errno.EAGAIN,
                f"another process writing {first} (a keygen) held its lock {lock} for {limit:g} s (paused or "
                "stuck); try again once it is done",
            ) from None
        yield


def pair_being_written(first: Path, read: bytes) -> bool:
    """True when a writer of the pair named after `first` (`pair_locked`) is at work on it: `first` no
    longer holds `read` (its bytes as read a moment ago: replaced since), or the writer holds the pair's
    lock file now. A pair read meanwhile may be half replaced, and is whole once that writer is done. Never
    waits and never makes the lock file (one a killed writer left is not held)."""
    try:
        if read_small_file(first) != read:
            return True
    except OSError:  # gone since it was read
        return True
    try:
        import fcntl
    except ImportError:  # not a POSIX system: `pair_locked` locks nothing there either
        return False
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(_pair_lock_file(first), flags)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # let go at once, as the file is closed
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def _pair_lock_file(first: Path) -> Path:
    """The lock file of the pair named after `first` (`pair_locked`): ``.NAME.lock`` beside it."""
    directory = first.parent if str(first.parent) else Path(".")
    return directory / f".{first.name}.lock"


class StillLocked(OSError):
    """A lock (`hold_lock_file`, `hold_directory_lock`) another process held past the time allowed to
    wait for it."""


def hold_lock_file(path: Path, until: float, stack: contextlib.ExitStack) -> bool:
    """Take an exclusive `flock` on the lock file `path` (made if missing, never through a symbolic link),
    waiting until the monotonic time `until` (then `StillLocked`); `stack` removes the file and lets go
    of it. False when it cannot be made, opened or locked (a file system that locks no files), or is no
    regular file (`_open_lock_file`). A lock file left by a process killed outright is taken over."""
    while True:
        fd = _open_lock_file(path)
        if fd is None:
            return False
        try:
            locked = _flock_by(fd, until)
        except BaseException:
            os.close(fd)
            raise
        if locked and _same_file(fd, path):
            stack.callback(os.close, fd)  # last: the file is removed while still locked
            stack.callback(_remove_lock_file, path)
            return True
        os.close(fd)
        if not locked:
            return False
        # The process that held it removed it as it let go: lock the one there now (or make it).


def _open_lock_file(path: Path) -> int | None:
    """A descriptor open on the regular file at `path` (made if missing, readable by every user whatever the
    umask, so that another user's process can lock it too), or None when there is none to be had: a FIFO,
    device or directory planted there is never opened for good (O_NONBLOCK: opening a FIFO to read would
    wait for a writer for ever)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    except OSError:
        try:  # one another user's process made and holds: theirs to write, ours to lock
            fd = os.open(path, os.O_RDONLY | flags)
        except OSError:
            return None
    held = os.fstat(fd)
    if not stat.S_ISREG(held.st_mode):
        os.close(fd)
        return None
    ours = held.st_uid == os.geteuid() and held.st_size == 0 and held.st_nlink == 1
    if ours and held.st_mode & 0o044 != 0o044:
        # Made under a umask such as 077: a process of another user could not open it, nor take over one a
        # killed process left, and would lock only the directory. Only an empty file of one name: never a
        # file of this user's that another linked there.
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o644)
    return fd


def _same_file(fd: int, path: Path) -> bool:
    """`fd` is open on the file at `path` (not on one removed from there since)."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _remove_lock_file(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def hold_directory_lock(directory: Path, until: float, stack: contextlib.ExitStack) -> bool:
    """Take an exclusive `flock` on `directory` itself, as `hold_lock_file` does on a file; False when it
    cannot be opened (a directory this user may not list) or locked."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    stack.callback(os.close, fd)
    return _flock_by(fd, until)


def _flock_by(fd: int, until: float) -> bool:
    """Take an exclusive `flock` on `fd`, waiting until the monotonic time `until` (then `StillLocked`);
    False when the file system cannot lock it (no waiting is of use then)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system: nothing to lock with
        return False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= until:
                raise StillLocked(errno.EAGAIN, "locked by another process") from None
            time.sleep(0.05)
        except OSError:  # ENOLCK, EBADF: locks this file system does not take on this kind of file
            return False


def sync_directory(path: Path) -> None:
    """Fsync the directory holding `path`, so that a rename or link into it survives a crash."""
    dir_fd = os.open(path.parent if str(path.parent) else Path("."), os.O_RDONLY)
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
