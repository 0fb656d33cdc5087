"""Ed25519 keys and the domain-separated signature that binds a certificate digest to a signer.

A signature covers exactly these bytes (UTF-8):

    govern-certificate-signature-v1\\n<digest>\\n<key_id>\\n<signed_at>

so it cannot be replayed onto another certificate, another key id, or another time, and it can never
be confused with a signature made for any other purpose with the same key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from bide._files import (
    SecondNotPlaced,
    StillLocked,
    pair_being_written,
    pair_locked,
    read_small_file,
    replace_pair,
    sync_directory,
    write_whole,
)

from ._errors import KeyFileUnreadable, SigningKeyError

__all__ = [
    "SIGNATURE_DOMAIN",
    "Signer",
    "generate_key_pair",
    "is_signing_time",
    "is_strong_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_key_from_raw",
    "raw_public_key",
    "signed_bytes",
    "verify_signature",
]

SIGNATURE_DOMAIN: Final = "govern-certificate-signature-v1"
_TIME: Final = re.compile(r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\Z")


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of an Ed25519 public key (RFC 8032)."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_from_raw(raw: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 raw bytes; `ValueError` if they are not one."""
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def is_strong_key(key: Ed25519PublicKey) -> bool:
    """True when the key encodes, canonically, a point of the prime-order subgroup (not the identity).

    A small-order key (8 points) lets anyone make signatures that verify under it, and OpenSSL does not
    refuse them; bide's audit log refuses the same keys with the same check (shared, not copied)."""
    from bide.audit._ed25519 import is_strong_public_key

    return is_strong_public_key(raw_public_key(key))


def key_id(key: Ed25519PublicKey) -> str:
    """The key id: `ed25519:` and the lowercase hex SHA-256 of the raw public key."""
    return "ed25519:" + hashlib.sha256(raw_public_key(key)).hexdigest()


def signed_bytes(digest: str, key: str, signed_at: str) -> bytes:
    """The exact bytes an Ed25519 certificate signature is computed over."""
    return f"{SIGNATURE_DOMAIN}\n{digest}\n{key}\n{signed_at}".encode()


def is_signing_time(text: str) -> bool:
    """True when `text` is a UTC time written `YYYY-MM-DDTHH:MM:SSZ` that exists on the calendar."""
    if not _TIME.match(text):
        return False
    try:
        datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Signer:
    """A private key ready to sign certificate digests."""

    private_key: Ed25519PrivateKey

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self.private_key.public_key()

    @property
    def key_id(self) -> str:
        """`ed25519:` and the hex SHA-256 of the raw public key."""
        return key_id(self.public_key)

    def sign(self, digest: str, *, now: datetime | None = None) -> tuple[str, str]:
        """Sign `digest` now; returns (signed_at, base64 signature)."""
        moment = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
        signed_at = moment.strftime("%Y-%m-%dT%H:%M:%SZ")
        value = self.private_key.sign(signed_bytes(digest, self.key_id, signed_at))
        return signed_at, base64.b64encode(value).decode("ascii")


def verify_signature(public: Ed25519PublicKey, digest: str, key: str, signed_at: str, value: str) -> bool:
    """True when `value` (base64) is `public`'s signature over `signed_bytes(digest, key, signed_at)`."""
    try:
        signature = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return False
    if len(signature) != 64 or base64.b64encode(signature).decode("ascii") != value:
        return False
    try:
        public.verify(signature, signed_bytes(digest, key, signed_at))
    except InvalidSignature:
        return False
    return True


def generate_key_pair(private_path: Path, *, overwrite: bool = False) -> tuple[Path, str]:
    """Write a new Ed25519 key pair: `private_path` (PKCS#8 PEM, mode 0600) and `private_path.pub`.

    Returns the public key path and the key id. Refuses to replace an existing file unless
    `overwrite`. Both files are written in full to temporary files before either is renamed into place:
    when writing fails (a full disk), SigningKeyError says so, no key file is left behind, and existing
    key files keep their content.
    """
    try:
        public_path = _check_targets(private_path, overwrite=overwrite)
    except OSError as exc:  # a name longer than the filesystem takes, say
        raise SigningKeyError(f"{private_path} cannot be a key file here: {exc.strerror or exc}") from None
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if not overwrite:
        try:
            with pair_locked(private_path):  # the lock `--force` (replace_pair) takes: one keygen at a time
                _create_pair(private_path, private_pem, public_path, public_pem)
        except StillLocked as exc:
            raise SigningKeyError(
                f"cannot write the key pair {private_path}: {exc.strerror or exc}; no key file was written"
            ) from exc
        return public_path, key_id(key.public_key())
    try:
        replace_pair(private_path, private_pem, 0o600, public_path, public_pem, 0o644)
    except SecondNotPlaced as exc:
        # Never a private key without its public half (or beside another key's).
        raise SigningKeyError(
            f"cannot write the public key {public_path}: {exc.strerror or exc}; the new private key "
            f"{private_path} was removed again: run keygen again"
        ) from exc
    except OSError as exc:
        raise SigningKeyError(
            f"cannot write the key pair {private_path}: {exc.strerror or exc}; no key file was written"
        ) from exc
    sync_directory(private_path)
    return public_path, key_id(key.public_key())


def _check_targets(private_path: Path, *, overwrite: bool) -> Path:
    """The public key's path, once both key files can be written (OSError when a name is unusable)."""
    if private_path.name in ("", ".", "..") or private_path.is_dir():
        raise SigningKeyError(f"{private_path} is a directory; name a key file (FILE, then FILE.pub)")
    public_path = private_path.with_name(private_path.name + ".pub")
    if not private_path.parent.is_dir():
        raise SigningKeyError(f"{private_path.parent}: no such directory")
    if public_path.is_dir():
        raise SigningKeyError(f"{public_path} is a directory; the public key is written there")
    if not overwrite:
        for existing in (private_path, public_path):
            if os.path.lexists(existing):  # a dangling symlink too
                raise SigningKeyError(f"{existing} already exists; pass --force to replace it")
    return public_path


def _create_pair(private_path: Path, private_pem: bytes, public_path: Path, public_pem: bytes) -> None:
    """Create both key files exclusively (a keygen racing this one, or a file that appears meanwhile, is
    never replaced): the public key first, removed again if the private one cannot be placed. A process
    killed between the two leaves a .pub alone, which nothing signs with, never a private key without its
    .pub (which a loader could not check)."""
    try:
        write_whole(public_path, public_pem, overwrite=False)
    except FileExistsError:
        raise SigningKeyError(f"{public_path} already exists; pass --force to replace it") from None
    except OSError as exc:
        raise SigningKeyError(
            f"cannot write the public key {public_path}: {exc.strerror or exc}; no key file was written"
        ) from exc
    try:
        write_whole(private_path, private_pem, mode=0o600, overwrite=False)
    except BaseException as exc:  # Ctrl-C too: both or neither
        public_path.unlink(missing_ok=True)
        if isinstance(exc, FileExistsError):
            raise SigningKeyError(f"{private_path} already exists; pass --force to replace it") from None
        if isinstance(exc, OSError):
            raise SigningKeyError(
                f"cannot write the key pair {private_path}: {exc.strerror or exc}; no key file was written"
            ) from exc
        raise


def _unreadable(path: Path, what: str, error: OSError) -> KeyFileUnreadable:
    if isinstance(error, FileNotFoundError):
        return KeyFileUnreadable(f"{path}: no such file; give the path of a {what} file (`govern keygen` "
                                 "writes one)")
    return KeyFileUnreadable(f"{path}: cannot read the {what} ({error.strerror or error})")


def load_private_key(path: Path) -> Signer:
    """Read a private key written by `govern keygen`; refuses one that others can read (SigningKeyError),
    and raises KeyFileUnreadable when the file is missing or cannot be read."""
    try:
        info = path.stat()
        data = read_small_file(path)
    except OSError as exc:
        raise _unreadable(path, "signing key", exc) from None
    # Named before the mode is judged: a .pub is meant to be readable by all, and "run chmod 600" on it
    # would send the user the wrong way.
    if b"PUBLIC KEY-----" in data and b"PRIVATE KEY-----" not in data:
        raise SigningKeyError(
            f"{path} is a public key, not a PEM private key; pass the private key file it was made beside "
            "(without .pub)"
        )
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SigningKeyError(
            f"{path}: the private key is accessible to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run `chmod 600 {path}`"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SigningKeyError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path}: not an Ed25519 key (create one with `govern keygen`)")
    signer = Signer(key)
    _check_public_half(path, signer, data)
    return signer


def _check_public_half(path: Path, signer: Signer, read: bytes) -> None:
    """Raise SigningKeyError unless each public key file beside the private key file `path` (`path.pub`, and
    the .pub beside the file a symbolic link there leads to) holds `signer`'s public half: a keygen killed
    between writing the two files leaves another key's .pub, and certificates signed then would not verify
    with the key their checkers pin. A private key without a .pub is not checked. A mismatch seen while a
    keygen of the pair is at work (`read`, the private key's bytes, replaced since, or the pair's lock held)
    is told as such: try again once it is done."""
    for key_file in dict.fromkeys([str(path), os.path.realpath(path)]):
        pub = Path(f"{key_file}.pub")
        if not os.path.lexists(pub):
            continue
        fix = (
            f"The key was not used. Run `govern keygen --force {path}` for a new matching pair (and give its "
            ".pub to whoever checks), or put back the .pub written with this key"
        )
        try:
            found = load_public_key(pub)
        except SigningKeyError as exc:
            raise SigningKeyError(
                f"the private key {path} ({signer.key_id}) cannot be checked against its public key file "
                f"{pub}: {exc}. {fix}"
            ) from exc
        if raw_public_key(found) == raw_public_key(signer.public_key):
            continue
        if pair_being_written(Path(key_file), read):
            raise SigningKeyError(
                f"the private key {path} is {signer.key_id}, but {pub} beside it holds {key_id(found)}: a "
                f"keygen of {key_file} is replacing the pair right now. The key was not used: try again once "
                "it is done"
            )
        raise SigningKeyError(
            f"the private key {path} is {signer.key_id}, but {pub} beside it holds {key_id(found)}: "
            "not a pair (a keygen killed between writing the two files, or another .pub put there). "
            + fix
        )


def load_public_key(path: Path) -> Ed25519PublicKey:
    """Read a public key: the `.pub` PEM file `govern keygen` writes, or 32 raw bytes in base64. Raises
    KeyFileUnreadable when the file is missing or cannot be read, SigningKeyError when it holds no usable
    key."""
    try:
        data = read_small_file(path)
    except OSError as exc:
        raise _unreadable(path, "public key", exc) from None
    if b"PRIVATE KEY-----" in data:
        raise SigningKeyError(
            f"{path} is a private key, not a public one; pass the public key keygen wrote beside it "
            f"({path.name}.pub), and keep the private key to the signer"
        )
    if data.lstrip().startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as exc:
            raise SigningKeyError(f"{path}: not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(f"{path}: not an Ed25519 public key")
    else:
        try:
            key = public_key_from_raw(base64.b64decode(data.strip(), validate=True))
        except (binascii.Error, ValueError):
            raise SigningKeyError(
                f"{path}: neither a PEM public key nor 32 base64-encoded bytes "
                "(use the .pub file from keygen)"
            ) from None
    if not is_strong_key(key):
        raise SigningKeyError(
            f"{path}: a weak Ed25519 key (small-order or mixed-order): it identifies no signer"
        )
    return key
