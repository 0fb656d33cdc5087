"""One Ed25519 key file serves both packages: `govern keygen` and `bide.audit.generate_key` write the same
formats (PKCS#8 PEM private key, SubjectPublicKeyInfo PEM public key at `<key>.pub`) and compute the same key
id, so an operator signs certificates and tree heads with one key and an auditor holds one public key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bide._files import SecondNotPlaced, replace_pair
from bide.audit import UnreadableInput, generate_key, load_signing_key
from bide.audit import load_public_key as load_audit_public_key
from govern.certificate._signing import SigningKeyError, load_private_key, load_public_key, verify_signature


def test_a_govern_key_signs_and_verifies_for_bide_audit(tmp_path: Path) -> None:
    key = tmp_path / "ops.key"
    done = subprocess.run(
        [sys.executable, "-m", "govern", "keygen", "-o", str(key)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    signer = load_signing_key(key)
    public = load_audit_public_key(Path(str(key) + ".pub"))
    assert signer.key_id == public.key_id == load_private_key(key).key_id
    message = b"bide tree head"
    assert public.verify(signer.sign(message), message)
    assert not public.verify(signer.sign(message), message + b"!")


def test_a_bide_audit_key_signs_and_verifies_for_govern(tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    made = generate_key(key)
    signer = load_private_key(key)  # refuses keys others can read: generate_key writes mode 0600
    assert signer.key_id == made.key_id
    signed_at, value = signer.sign("sha256:" + "ab" * 32)
    public = load_public_key(Path(str(key) + ".pub"))
    assert verify_signature(public, "sha256:" + "ab" * 32, signer.key_id, signed_at, value)
    assert not verify_signature(public, "sha256:" + "cd" * 32, signer.key_id, signed_at, value)


def test_a_key_pair_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    """`replace_pair`, which both keygens use with --force: a pair whose second file cannot be written
    leaves the old pair as it was; one whose second file cannot be renamed into place leaves no new first
    file (never a new private key beside an old public half); no temporary file is left either way."""
    first, second = tmp_path / "k", tmp_path / "k.pub"
    first.write_bytes(b"old private")
    second.write_bytes(b"old public")
    with pytest.raises(FileNotFoundError):  # the second cannot be written: its directory is not there
        replace_pair(first, b"new private", 0o600, tmp_path / "gone" / "k.pub", b"new public", 0o644)
    assert first.read_bytes() == b"old private" and second.read_bytes() == b"old public"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]

    second.unlink()
    second.mkdir()  # a rename of a file over a directory fails
    (second / "inside").write_bytes(b"")
    with pytest.raises(SecondNotPlaced) as refused:
        replace_pair(first, b"new private", 0o600, second, b"new public", 0o644)
    assert isinstance(refused.value, OSError) and isinstance(refused.value.__cause__, OSError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pub"]

    second.joinpath("inside").unlink()
    second.rmdir()
    replace_pair(first, b"new private", 0o600, second, b"new public", 0o644)
    assert first.read_bytes() == b"new private" and second.read_bytes() == b"new public"
    assert first.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]


def test_an_interrupt_between_the_two_renames_leaves_no_new_first_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C after the private key was renamed into place and before its public half was: the new private
    key is removed again, as for a failed rename (never a new private key beside an old public half)."""
    import os

    first, second = tmp_path / "k", tmp_path / "k.pub"
    first.write_bytes(b"old private")
    second.write_bytes(b"old public")
    real_replace, renames = os.replace, []

    def interrupted_second(src: object, dst: object) -> None:
        renames.append(dst)
        if len(renames) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", interrupted_second)
    with pytest.raises(KeyboardInterrupt):
        replace_pair(first, b"new private", 0o600, second, b"new public", 0o644)
    assert not first.exists() and second.read_bytes() == b"old public"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pub"]  # no temporary file left


@pytest.mark.parametrize("prog", ["govern", "bide-audit"])
def test_concurrent_keygens_of_one_file_never_both_succeed(prog: str, tmp_path: Path) -> None:
    """Keys are created exclusively: of several keygens of one FILE at once, one writes the pair and the
    others are refused; the pair on disk is the winner's (its private key matches its .pub)."""
    from concurrent.futures import ThreadPoolExecutor

    module = {"govern": "govern", "bide-audit": "bide.audit._cli"}[prog]
    for round_ in range(4):
        key = tmp_path / f"k{round_}"
        command = [sys.executable, "-m", module, "keygen", str(key)]
        with ThreadPoolExecutor(max_workers=4) as pool:
            runs = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True), [command] * 4))
        assert sorted(r.returncode for r in runs) == [0, 2, 2, 2], [r.stderr for r in runs]
        assert load_private_key(key).key_id == load_audit_public_key(Path(str(key) + ".pub")).key_id


@pytest.mark.parametrize("name", ["", "dir/", "x" * 300])
def test_govern_keygen_refuses_a_name_that_is_no_key_file(name: str, tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "govern", "keygen", name], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]  # nothing written (no default name either)


def test_a_key_that_is_a_pipe_or_a_device_or_huge_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    """A FIFO with no writer would block a plain read forever, /dev/zero never ends: every reader of key
    files refuses what is not a small regular file."""
    import os

    from bide.audit._errors import UnreadableInput
    from govern.certificate._errors import KeyFileUnreadable

    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.key"
    with huge.open("wb") as f:
        f.truncate(10**9)  # sparse: a gigabyte of zeros without the disk space
    for path in (fifo, Path("/dev/zero"), huge):
        with pytest.raises(KeyFileUnreadable):
            load_private_key(path)
        with pytest.raises(KeyFileUnreadable):
            load_public_key(path)
        with pytest.raises(UnreadableInput):
            load_signing_key(path)
        with pytest.raises(UnreadableInput):
            load_audit_public_key(path)


def test_a_public_key_file_holding_hex_says_to_give_the_hex_itself(tmp_path: Path) -> None:
    """A file holding the 64 hex characters of a key was called "neither a PEM public key nor 64 hex
    characters", which it does hold: the message says a key file must be PEM and the hex goes as is."""
    key = generate_key(tmp_path / "log.key")
    (tmp_path / "log.pub").write_text(key.public.hex + "\n")
    with pytest.raises(UnreadableInput, match="holds 64 hex characters, but a key file must be a PEM"):
        load_audit_public_key(tmp_path / "log.pub")
    assert load_audit_public_key(key.public.hex) == key.public


def test_govern_check_given_the_private_key_says_to_pass_the_public_one(tmp_path: Path) -> None:
    """`govern check --pubkey` given the private key (the file beside the .pub) printed the crypto
    library's "Valid PEM but no BEGIN PUBLIC KEY/END PUBLIC KEY delimiters"; bide's loaders named the mix-up.
    Both now say which file to pass, and the private key is not read into the message."""
    key = tmp_path / "ci-key"
    generate_key(key)
    machine = Path(__file__).resolve().parent.parent / "examples" / "orders.py"
    cert = tmp_path / "orders.govern-cert.json"
    certify = [sys.executable, "-m", "govern", "certify", str(machine), "-o", str(cert)]
    made = subprocess.run(certify, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    check = [sys.executable, "-m", "govern", "check", str(cert), "--pubkey", str(key)]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 2, (done.returncode, done.stderr)
    said = done.stderr
    assert f"{key} is a private key, not a public one; pass the public key keygen wrote beside it" in said
    assert "ci-key.pub" in done.stderr and "PRIVATE KEY" not in done.stderr
    with pytest.raises(SigningKeyError, match="is a private key"):
        load_public_key(key)
