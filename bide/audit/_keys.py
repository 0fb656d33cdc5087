"""Ed25519 key files and key ids.

A signing key file is PKCS#8 PEM, created with mode 0600; its public half is written beside it as
`<file>.pub` (SubjectPublicKeyInfo PEM). A key id is `"ed25519:" + hex(SHA-256(raw 32-byte public key))`.
A pair is written under its lock (`bide._files.pair_locked`), and read back as a pair: a private key whose
`.pub` beside it holds another key is refused (`KeyPairMismatch`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .._errors import ConfigError
from .._files import (
    SecondNotPlaced,
    StillLocked,
    pair_being_written,
    pair_locked,
    read_small_file,
    replace_pair,
    sync_directory,
    write_whole,
)
from ._ed25519 import is_strong_public_key
from ._errors import UnreadableInput

__all__ = [
    "KeyFileExists",
    "KeyPairMismatch",
    "PublicKey",
    "SigningKey",
    "generate_key",
    "key_id",
    "load_public_key",
    "load_signing_key",
]

ALG = "ed25519"
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_KEY_ID = re.compile(r"ed25519:[0-9a-fA-F]{64}")
# A key id is 64 hex characters too (of the key's SHA-256): one pasted as a key reads as a (usually weak) key.
KEY_ID_HINT = (
    "a key id (ed25519:<64 hex>, as bide-audit prints it: a hash of the key, which cannot be turned back "
    "into it) may have been given where a public key is needed: give the public key file (the .pub written "
    "beside the private key by keygen, or the one the anchor's operator gave you) or its 64 hex characters"
)


def key_id(public_key: bytes) -> str:
    """`"ed25519:" + hex(SHA-256(public_key))` for a raw 32-byte Ed25519 public key."""
    return f"{ALG}:{hashlib.sha256(public_key).hexdigest()}"


@dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key: verifies signatures; `raw` is the 32-byte encoding, `key_id` its id."""

    raw: bytes
    _key: Ed25519PublicKey = field(repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw: bytes) -> PublicKey:
        """The key with this 32-byte encoding; raises UnreadableInput when it is not one, or is weak (see
        `_ed25519`: only canonical keys of the prime-order subgroup name a single signer)."""
        if len(raw) != 32:
            raise UnreadableInput(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
        if not is_strong_public_key(bytes(raw)):
            raise UnreadableInput(
                "refusing a weak Ed25519 public key (small-order, mixed-order or non-canonical): signatures "
                "under it do not identify one signer"
            )
        try:
            return cls(raw, Ed25519PublicKey.from_public_bytes(raw))
        except ValueError as exc:
            raise UnreadableInput(f"not an Ed25519 public key: {exc}") from exc

    @classmethod
    def from_raw_unchecked(cls, raw: bytes) -> PublicKey:
        """The key with this 32-byte encoding, without the check that it is strong (`from_raw`'s slow part,
        milliseconds per key): only for a key whose signatures decide nothing, as in a policy that is
        refused anyway. Raises UnreadableInput when it is not 32 bytes."""
        if len(raw) != 32:
            raise UnreadableInput(f"an Ed25519 public key is 32 bytes, got {len(raw)}")
        try:
            return cls(bytes(raw), Ed25519PublicKey.from_public_bytes(raw))
        except ValueError as exc:
            raise UnreadableInput(f"not an Ed25519 public key: {exc}") from exc

    @property
    def key_id(self) -> str:
        """This key's id."""
        return key_id(self.raw)

    @property
    def hex(self) -> str:
        """The raw key in lower-case hex (64 characters)."""
        return self.raw.hex()

    def verify(self, signature: bytes, message: bytes) -> bool:
        """True when `signature` is this key's Ed25519 signature over `message`."""
        if len(signature) != 64:
            return False
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def pem(self) -> bytes:
        """SubjectPublicKeyInfo PEM."""
        return self._key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass(frozen=True)
class SigningKey:
    """An Ed25519 private key: signs; `public` is its public half."""

    _key: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh random key (not saved; see `generate_key`)."""
        return cls(Ed25519PrivateKey.generate())

    @property
    def public(self) -> PublicKey:
        """The public half."""
        raw = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return PublicKey.from_raw(raw)

    @property
    def key_id(self) -> str:
        """The public key's id."""
        return self.public.key_id

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature over `message`."""
        return self._key.sign(message)

    def pem(self) -> bytes:
        """Unencrypted PKCS#8 PEM."""
        return self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


class KeyFileExists(ConfigError):
    """A key file (or its .pub) is already there and `overwrite` was not asked for; nothing was written."""


class KeyPairMismatch(UnreadableInput):
    """The `.pub` beside a private key file is not its public half (a keygen killed between writing the
    two files, or another .pub put there): the key is not used, since what verifiers pin would not verify
    what it signs. Make a new pair (`keygen --force FILE`), or put back the key's own .pub."""


def _check_targets(text: str, target: Path, *, overwrite: bool) -> Path:
    """The public key's path, once both key files can be written (OSError when a name is unusable)."""
    if text.endswith(("/", os.sep)) or target.is_dir():
        raise ConfigError(f"{text} is a directory; give the path of a key file to create")
    pub = target.with_name(target.name + ".pub")
    if pub.is_dir():
        raise ConfigError(f"{pub} is a directory; give the path of a key file to create")
    if not target.parent.is_dir():
        raise ConfigError(f"the directory {target.parent} of the key file {target} does not exist")
    if not overwrite:
        for name in (target, pub):
            if os.path.lexists(name):
                raise KeyFileExists(f"{name} already exists; refusing to overwrite a key file")
    return pub


def generate_key(path: str | os.PathLike[str], *, overwrite: bool = False) -> SigningKey:
    """Create a new key file at `path` (mode 0600) and its public key at `path.pub`, both or neither.

    Raises KeyFileExists when either file exists, unless `overwrite` (then both are replaced), and
    ConfigError when the directory is missing or a target is a directory; those are checked before anything
    is written. If the .pub cannot be written, the new private key is removed again: never a key without
    its public half. The pair is written under its lock (`pair_locked`: two keygens of one file at once
    take turns, so the pair left is one key's; one kept waiting 30 s is a ConfigError, nothing written). A
    first keygen killed outright between the two files leaves only the .pub (written first), which no key
    loads from: keygen then refuses it as existing until it is removed (or `overwrite`). One with
    `overwrite` killed between them leaves a mismatched pair, which `load_signing_key` refuses
    (`KeyPairMismatch`) until keygen is run again."""
    text, target = os.fspath(path), Path(path)
    try:
        pub = _check_targets(text, target, overwrite=overwrite)
    except OSError as exc:  # a name longer than the filesystem takes, say
        raise ConfigError(f"{text} cannot be a key file here: {exc.strerror or exc}") from None
    key = SigningKey.generate()
    if overwrite:
        _replace_pair(target, pub, key)
        return key
    try:
        with pair_locked(target):
            _create_pair(target, pub, key)
    except StillLocked as exc:
        why = exc.strerror or exc
        raise ConfigError(f"cannot write the key pair {target}: {why}; nothing was written") from exc
    return key


def _create_pair(target: Path, pub: Path, key: SigningKey) -> None:
    """Create the key pair at `target` and `pub`, neither replacing a file already there."""
    # Both through a fresh temporary file: a symlink planted at either name is never followed, and each is
    # linked into place exclusively (a file that appears meanwhile is not replaced). The public key first:
    # a process killed between the two leaves a .pub alone, which no loader takes for a key, never a private
    # key without its .pub (which loaders could not check).
    try:
        write_whole(pub, key.public.pem(), overwrite=False)
    except FileExistsError as exc:
        raise KeyFileExists(f"{pub} already exists; refusing to overwrite a key file") from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot write the public key {pub}: {exc.strerror or exc}; nothing was written"
        ) from exc
    try:
        write_whole(target, key.pem(), mode=0o600, overwrite=False)
    except BaseException as exc:  # Ctrl-C too: both or neither
        with contextlib.suppress(OSError):
            pub.unlink()
        if isinstance(exc, FileExistsError):
            raise KeyFileExists(f"{target} already exists; refusing to overwrite a key file") from exc
        if isinstance(exc, OSError):
            raise ConfigError(
                f"cannot write the key file {target}: {exc.strerror or exc}; the public key was not kept "
                "either"
            ) from exc
        raise


def _replace_pair(target: Path, pub: Path, key: SigningKey) -> None:
    """Replace the key pair at `target` and `pub` with `key`'s (`replace_pair`): a write that fails (a full
    disk) leaves the old pair as it was."""
    try:
        replace_pair(target, key.pem(), 0o600, pub, key.public.pem(), 0o644)
    except SecondNotPlaced as exc:
        raise ConfigError(
            f"cannot place the public key {pub}: {exc.strerror or exc}; the new private key was removed "
            "again: run keygen again"
        ) from exc
    except OSError as exc:
        raise ConfigError(
            f"cannot write the key pair {target}: {exc.strerror or exc}; the existing key files were kept"
        ) from exc
    sync_directory(target)


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return read_small_file(path)
    except OSError as exc:
        raise UnreadableInput(f"cannot read key file {os.fspath(path)!r}: {exc.strerror or exc}") from exc


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """Load a signing key file written by `generate_key` (PKCS#8 PEM, Ed25519, unencrypted); refuses a
    file that other users may read or write (as `govern` does): such a key may already be someone else's.
    A public key file given instead is named as such."""
    text = os.fspath(path)
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UnreadableInput(f"cannot read key file {text!r}: {exc.strerror or exc}") from exc
    data = _read(path)
    # Parsed before the mode is judged: a .pub is meant to be readable by all, and "run chmod 600" on it
    # would send the user the wrong way.
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        if b"PUBLIC KEY-----" in data:
            raise UnreadableInput(
                f"{text!r} is a public key, not a PEM private key; pass the private key file it was made "
                f"beside (without .pub)"
            ) from exc
        raise UnreadableInput(f"{text!r} is not an unencrypted PEM private key") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UnreadableInput(
            f"the private key {text!r} is accessible to other users (mode "
            f"{stat.S_IMODE(mode):o}); run `chmod 600 {text}`"
        )
    if not isinstance(key, Ed25519PrivateKey):
        raise UnreadableInput(f"{text!r} holds a {type(key).__name__}, not an Ed25519 key")
    signing = SigningKey(key)
    _check_public_half(text, signing, data)
    return signing


def _check_public_half(text: str, key: SigningKey, read: bytes) -> None:
    """Raise `KeyPairMismatch` unless each public key file beside the private key file `text` (`text.pub`,
    and the .pub beside the file a symbolic link there leads to: keygen writes it beside the name it was
    given) holds `key`'s public half. A private key without a .pub is not checked. A mismatch seen while a
    keygen of the pair is at work (`read`, the private key's bytes, replaced since, or the pair's lock held)
    is told as such: try again once it is done."""
    for key_file in dict.fromkeys([text, os.path.realpath(text)]):
        pub = f"{key_file}.pub"
        if not os.path.lexists(pub):
            continue
        try:
            found = load_public_key(pub)
        except UnreadableInput as exc:
            raise KeyPairMismatch(
                f"the private key {text!r} ({key.key_id}) cannot be checked against its public key file "
                f"{pub}, which verifiers pin: {exc}. The key was not used. Put back the .pub written with "
                f"this key, or run `bide-audit keygen --force {text}` for a new matching pair"
            ) from exc
        if found.raw == key.public.raw:
            continue
        if pair_being_written(Path(key_file), read):
            raise KeyPairMismatch(
                f"the private key {text!r} is {key.key_id}, but {pub} beside it holds {found.key_id}: a "
                f"keygen of {key_file} is replacing the pair right now. The key was not used: try again once "
                "it is done"
            )
        raise KeyPairMismatch(
            f"the private key {text!r} is {key.key_id}, but {pub} beside it, which verifiers pin, holds "
            f"{found.key_id}: not a pair (a keygen killed between writing the two files, or another .pub "
            f"put there). The key was not used. Run `bide-audit keygen --force {text}` for a new "
            "matching pair (and give its .pub to whoever verifies), or put back the .pub written with "
            "this key"
        )


def load_public_key(spec: str | os.PathLike[str]) -> PublicKey:
    """A public key from 64 hex characters (never opened as a file), or a PEM file holding an Ed25519
    public key. A private key file is refused: a verifier never needs one, and passing it is a mistake
    that spreads the secret (give the `.pub` file)."""
    text = os.fspath(spec)
    if _KEY_ID.fullmatch(text):
        raise UnreadableInput(f"{text!r} is a key id, not a public key: {KEY_ID_HINT}")
    if _HEX_KEY.fullmatch(text):
        try:
            return PublicKey.from_raw(bytes.fromhex(text))
        except UnreadableInput as exc:
            raise UnreadableInput(f"{exc}; {KEY_ID_HINT}") from exc
    data = _read(text)
    if b"PRIVATE KEY-----" in data:
        raise UnreadableInput(f"{text!r} is a private key file; pass its public key ({text}.pub) instead")
    try:
        pub = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        if _HEX_KEY.fullmatch(data.strip().decode("ascii", "replace")):
            raise UnreadableInput(
                f"the file {text!r} holds 64 hex characters, but a key file must be a PEM public key: give "
                "the 64 hex characters themselves as the argument instead of the file's name"
            ) from exc
        raise UnreadableInput(f"{text!r} is neither a PEM public key nor 64 hex characters") from exc
    if not isinstance(pub, Ed25519PublicKey):
        raise UnreadableInput(f"{text!r} holds a {type(pub).__name__}, not an Ed25519 public key")
    return PublicKey.from_raw(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
