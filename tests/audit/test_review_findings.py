"""Reading and key-handling defects an adversarial review found in `bide-audit` and bide's key files, each
checked through the commands in subprocesses: exit codes as documented, forgery never hidden behind a read
error, private keys kept private, anchored heads never overwritten."""

from __future__ import annotations

import base64
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.audit import (
    AnchorError,
    AuditLog,
    DirectoryPublisher,
    SignedTreeHead,
    SigningKey,
    generate_key,
    parse_artifact,
    sign_head,
)

from .conftest import write_run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _cli("bide.audit._cli", *args, cwd=cwd)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    key = SigningKey.generate()
    store = bide.MemoryStore()
    write_run(store, "run", 3)
    log = AuditLog(store, key)
    old = log.sign_head("run")
    write_run(store, "run", 2)
    new = log.sign_head("run")
    (tmp_path / "evidence.json").write_bytes(log.evidence("run", new).to_json())
    (tmp_path / "old.json").write_bytes(old.to_json())
    (tmp_path / "new.json").write_bytes(new.to_json())
    (tmp_path / "proof.json").write_bytes(log.consistency("run", old.size).to_json())
    (tmp_path / "pub").write_text(key.public.hex)
    return tmp_path


def _huge(text: bytes, member: bytes) -> bytes:
    """`member`'s integer value replaced by one of 5,000 digits (more than Python converts by default)."""
    start = text.index(member) + len(member)
    end = start
    while text[end : end + 1].isdigit():
        end += 1
    return text[:start] + b"9" * 5000 + text[end:]


def test_an_integer_too_long_to_read_is_unreadable_input(files: Path) -> None:
    pub = (files / "pub").read_text()
    (files / "huge.json").write_bytes(_huge((files / "evidence.json").read_bytes(), b'"size":'))
    done = audit("verify-evidence", "huge.json", "--pubkey", pub, cwd=files)
    assert done.returncode == 4, done.stderr
    assert "UNREADABLE INPUT" in done.stderr and "INTERNAL" not in done.stderr
    assert "too long to read" in done.stderr and "sys.set_int_max_str_digits" not in done.stderr
    done = audit("verify-approvals", "huge.json", "--json", cwd=files)
    assert done.returncode == 4 and '"unusable_input"' in done.stdout


def test_a_forged_head_beside_an_integer_too_long_is_reported_as_forgery(files: Path) -> None:
    pub = (files / "pub").read_text()
    (files / "proof-huge.json").write_bytes(_huge((files / "proof.json").read_bytes(), b'"new_size":'))
    head = parse_artifact(SignedTreeHead, (files / "old.json").read_bytes())
    # The trusted key's id, another key's signature: well formed, and forged.
    forged = head.model_copy(update={"signature": SigningKey.generate().sign(b"anything")})
    (files / "old-forged.json").write_bytes(forged.to_json())
    done = audit("verify-consistency", "old-forged.json", "new.json", "proof-huge.json", "--pubkey", pub,
                 cwd=files)
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert "NOT VERIFIED" in done.stderr
    honest = audit("verify-consistency", "old.json", "new.json", "proof-huge.json", "--pubkey", pub,
                   cwd=files)
    assert honest.returncode == 4, honest.stderr


def test_pubkey_refuses_a_private_key_file(files: Path) -> None:
    generate_key(files / "log.key")
    done = audit("verify-evidence", "evidence.json", "--pubkey", "log.key", cwd=files)
    assert done.returncode == 4 and "private key" in done.stderr, done.stderr


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    write_run(store, "run", 2)
    store.close()
    generate_key(tmp_path / "log.key")
    os.chmod(tmp_path / "log.key", 0o644)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    done = audit("export", "--store", url, "--run", "run", "-o", "e.json", "--key", "log.key", cwd=tmp_path)
    assert done.returncode == 4 and "chmod 600" in done.stderr, done.stderr
    assert not (tmp_path / "e.json").exists()
    approve = _cli("bide._cli", "approve", "--store", url, "run", "c0.0", "--key", "log.key", cwd=tmp_path)
    assert approve.returncode == 2 and "chmod 600" in approve.stderr, approve.stderr
    os.chmod(tmp_path / "log.key", 0o600)
    done = audit("export", "--store", url, "--run", "run", "-o", "e.json", "--key", "log.key", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_keygen_does_not_follow_a_planted_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "k.pub.tmp").symlink_to(victim)
    done = audit("keygen", "k", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert (tmp_path / "k.pub").is_file() and not (tmp_path / "k.pub").is_symlink()
    assert (tmp_path / "k.pub").read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


def _publish(directory: str, root: bytes, barrier: object, out: object) -> None:
    head = sign_head(SigningKey.generate(), "run", 5, root, timestamp_ns=1_700_000_000_000_000_000)
    barrier.wait()  # type: ignore[attr-defined]
    try:
        DirectoryPublisher(directory).publish(head)
        out.put((root, "published"))  # type: ignore[attr-defined]
    except Exception as exc:
        out.put((root, type(exc).__name__))  # type: ignore[attr-defined]


def test_concurrent_publishers_never_overwrite_an_anchored_head(tmp_path: Path) -> None:
    """Heads of one run, size and time but other roots, published at once: exactly one is accepted and
    that one is what the file holds; every other publisher is refused (none is told it anchored a head
    that was then overwritten)."""
    ctx = multiprocessing.get_context("fork")
    for attempt in range(12):
        directory = str(tmp_path / f"anchor{attempt}")
        os.mkdir(directory)
        n = 6
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(target=_publish, args=(directory, bytes([i]) * 32, barrier, out)) for i in range(n)
        ]
        for p in procs:
            p.start()
        got = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(60)
        published = [root for root, what in got if what == "published"]
        assert len(published) == 1, got
        assert sorted(what for _, what in got).count("AnchorError") == n - 1, got
        [written] = list(Path(directory).rglob("*.json"))
        assert f'"root":"{base64.b64encode(published[0]).decode()}"' in written.read_text()


def test_publishing_without_hard_links_still_never_overwrites(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mount that refuses hard links (EPERM): the head is created exclusively in place instead."""
    import errno

    def no_links(src: object, dst: object, **_: object) -> None:
        raise PermissionError(errno.EPERM, "hard links not supported here")

    monkeypatch.setattr(os, "link", no_links)
    key = SigningKey.generate()
    first = sign_head(key, "run", 5, b"\x01" * 32, timestamp_ns=1_700_000_000_000_000_000)
    other = sign_head(key, "run", 5, b"\x02" * 32, timestamp_ns=1_700_000_000_000_000_000)
    publisher = DirectoryPublisher(tmp_path)
    publisher.publish(first)
    publisher.publish(first)  # the same bytes again: accepted
    with pytest.raises(AnchorError, match="other contents"):
        publisher.publish(other)
    assert publisher.path_for(first).read_bytes() == first.to_json()
    assert [p.name for p in publisher.path_for(first).parent.iterdir()] == [publisher.path_for(first).name]
