"""How `bide-audit` reads its inputs: a named pipe with no writer is refused at once (exit 4) rather than
waited on forever, while a pipe with a writer (a process substitution) is read; a size limit up to 1 TiB
reads only what is there, and a larger one is a usage error (exit 2); a public key of 64 hex characters is
the key in either case, never a file name. End to end through subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.audit import AuditLog, SigningKey

from .conftest import write_run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _audit(*args: str, cwd: Path, shell: bool = False) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    argv = [sys.executable, "-m", "bide.audit._cli", *args]
    if shell:  # bash, for a process substitution written in the arguments
        argv = ["bash", "-c", " ".join(argv)]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    """bundle.json (a proof bundle), evidence.json, head.json, and the log key's public key as log.pub."""
    key = SigningKey.generate()
    store = bide.MemoryStore()
    write_run(store, "r", 2)
    log = AuditLog(store, key)
    (tmp_path / "bundle.json").write_bytes(log.prove("r", "run:start").to_json())
    (tmp_path / "evidence.json").write_bytes(log.evidence("r").to_json())
    (tmp_path / "head.json").write_bytes(log.sign_head("r").to_json())
    (tmp_path / "log.pub").write_bytes(key.public.pem())
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "fifo", "--pubkey", "log.pub"),
        ("verify-evidence", "fifo", "--pubkey", "log.pub"),
        ("verify-consistency", "fifo", "fifo", "fifo", "--pubkey", "log.pub"),
        ("verify-approvals", "fifo"),
    ],
)
def test_a_pipe_with_no_writer_is_refused_not_waited_on(args: tuple[str, ...], signed: Path) -> None:
    done = _audit(*args, cwd=signed)
    assert done.returncode == 4, done.stderr
    assert "a pipe with no writer" in done.stderr


def test_a_process_substitution_is_read(signed: Path) -> None:
    done = _audit("verify", "<(sleep 0.5; cat bundle.json)", "--pubkey", "log.pub", cwd=signed, shell=True)
    assert done.returncode == 0, done.stderr
    assert "Record 'run:start'" in done.stdout


@pytest.mark.parametrize("limit", [str(2**40), "1000000"])
def test_a_large_size_limit_reads_only_what_is_there(limit: str, signed: Path) -> None:
    done = _audit("verify", "bundle.json", "--pubkey", "log.pub", "--max-input-bytes", limit, cwd=signed)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("limit", [str(2**40 + 1), str(2**63 - 2), str(10**20)])
def test_a_size_limit_over_one_tebibyte_is_a_usage_error(limit: str, signed: Path) -> None:
    done = _audit("verify", "bundle.json", "--pubkey", "log.pub", "--max-input-bytes", limit, cwd=signed)
    assert done.returncode == 2, done.stderr
    assert "usage error: argument --max-input-bytes: the size limit can be at most" in done.stderr


def test_an_input_over_the_limit_is_refused(signed: Path) -> None:
    done = _audit("verify", "bundle.json", "--pubkey", "log.pub", "--max-input-bytes", "100", cwd=signed)
    assert done.returncode == 4 and "over the 100-byte limit" in done.stderr


def test_a_public_key_in_upper_case_hex_is_the_key_not_a_file_name(signed: Path) -> None:
    from bide.audit import load_public_key

    upper = load_public_key(signed / "log.pub").hex.upper()
    assert not (signed / upper).exists()
    done = _audit("verify", "bundle.json", "--pubkey", upper, cwd=signed)
    assert done.returncode == 0, done.stderr
    assert load_public_key(upper).hex == upper.lower()
