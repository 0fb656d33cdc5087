"""No printed line of `bide`, `bide-audit` or `govern` carries a control character from its input.

Every string field an attacker controls here holds an escape sequence that would erase the line and print
a fake success, a C1 control, a bidirectional override, a line separator and a bell. Whatever each command
prints (success or refusal, text or JSON) must show them as visible escapes, never emit them.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bide
from bide._terminal import printable
from bide.audit import AuditLog, ProofBundle, SigningKey, parse_artifact
from govern import Registry
from govern.certificate._certificate import compute_digest
from govern.certificate._encoding import canonical_json
from govern.certificate._make import certify

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EVIL = "\x1b[2K\r\x1b[32mVERIFIED\x1b[0m\x9b31m\u202e\u2028\x07"


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERM")}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**env, "PYTHONPATH": path, "COLUMNS": "200"},
        timeout=120,
    )


def _assert_clean(done: subprocess.CompletedProcess[str], what: str) -> None:
    for stream in (done.stdout, done.stderr):
        for line in stream.split("\n"):
            bad = [c for c in line if not c.isprintable()]
            assert not bad, f"{what}: printed {bad!r} in {line!r}"


def _evil_record(key: str, kind: str) -> bytes:
    salt = base64.b64encode(os.urandom(32)).decode()
    return bide.canonical_json({"key": key, "kind": kind, "salt": salt, "note": EVIL})


def test_printable_escapes_what_acts_on_a_terminal() -> None:
    assert printable("plain text, ünïcode") == "plain text, ünïcode"
    shown = printable(EVIL)
    assert shown.isprintable() and "\\x1b[2K" in shown and "\\u202e" in shown and "\\x9b" in shown
    assert printable("a\nb") == "a\\x0ab" and printable("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


def test_bide_audit_prints_no_control_character(tmp_path: Path) -> None:
    key = SigningKey.generate()
    store = bide.MemoryStore()
    run = f"run{EVIL}"
    store.insert_many(run, [("@journal", _evil_record("@journal", "header"))])
    store.insert_many(run, [(f"k{EVIL}", _evil_record(f"k{EVIL}", f"kind{EVIL}"))])
    log = AuditLog(store, key)
    head = log.sign_head(run)
    (tmp_path / "evidence.json").write_bytes(log.evidence(run, head).to_json())
    bundle = log.prove(run, f"k{EVIL}", head)
    (tmp_path / "bundle.json").write_bytes(bundle.to_json())
    forged = bundle.model_copy(update={"sth": bundle.sth.model_copy(update={"key_id": f"ed25519:{EVIL}"})})
    (tmp_path / "forged.json").write_bytes(forged.to_json())
    assert parse_artifact(ProofBundle, forged.to_json()).sth.key_id.endswith(EVIL)
    pub = key.public.hex
    runs = [
        ("verify-evidence", "evidence.json", "--pubkey", pub),
        ("verify-evidence", "evidence.json", "--pubkey", pub, "--json"),
        ("verify", "bundle.json", "--pubkey", pub),
        ("verify", "forged.json", "--pubkey", pub),
        ("verify", "forged.json", "--pubkey", pub, "--json"),
        ("verify-approvals", "evidence.json"),
        ("verify-approvals", "evidence.json", "--call", EVIL),
    ]
    codes = []
    for args in runs:
        done = _run("bide.audit._cli", *args, cwd=tmp_path)
        _assert_clean(done, " ".join(args))
        codes.append(done.returncode)
    assert codes == [0, 0, 0, 1, 1, 1, 1], codes
    shown = _run("bide.audit._cli", "verify-evidence", "evidence.json", "--pubkey", pub, cwd=tmp_path).stdout
    assert "kind\\x1b[2K" in shown  # shown, escaped: the auditor still sees what the file holds


def test_bide_prints_no_control_character(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    run = "run-1"
    journal = bide.Journal(store, run).load()
    journal.write([bide.Start(key="run:start", entry=f"agent:{EVIL}", input=f"hello{EVIL}")])
    journal.write([bide.GateRecord(key="approval:note", data={"x": EVIL})])
    # bide refuses such run ids and keys; a store written around it may hold them anyway.
    store.insert_many(f"run{EVIL}", [("@journal", _evil_record("@journal", "header"))])
    store.insert_many(run, [(f"k{EVIL}", _evil_record(f"k{EVIL}", "gate"))])
    store.close()
    for args in (
        ("runs", "--store", url),
        ("runs", "--store", url, "--json"),
        ("show", "--store", url, run),
        ("show", "--store", url, run, "--json"),
        ("show", "--store", url, f"missing{EVIL}"),
        ("show", "--store", url, f"run{EVIL}"),
        ("pending", "--store", url),
        ("approve", "--store", url, run, f"c{EVIL}", "--key", "absent.key"),
    ):
        done = _run("bide._cli", *args, cwd=tmp_path)
        _assert_clean(done, " ".join(args))
    shown = _run("bide._cli", "show", "--store", url, run, cwd=tmp_path)
    assert shown.returncode == 0 and "hello\\x1b[2K" in shown.stdout and "k\\x1b[2K" in shown.stdout
    decoded: Any = json.loads(_run("bide._cli", "show", "--store", url, run, "--json", cwd=tmp_path).stdout)
    assert decoded["run"]["input"] == f"hello{EVIL}"  # JSON keeps the value, escaped


def _forge(document: dict[str, Any], change: Any) -> bytes:
    document = json.loads(json.dumps(document))
    change(document)
    document["digest"] = compute_digest(document)
    return canonical_json(document) + b"\n"


def test_govern_prints_no_control_character(tmp_path: Path) -> None:
    r = Registry("lights")
    kitchen, hall = r.bool("kitchen"), r.bool("hall")
    r.event("kitchen_on", effect={kitchen: True})
    r.event("hall_on", effect={hall: True})
    r.independent("kitchen_on", "hall_on")
    orders = certify(r).document()

    def evil(document: dict[str, Any]) -> None:
        document["machine"]["name"] = f"orders{EVIL}"
        for event in document["machine"]["events"]:
            event["name"] = f"{event['name']}{EVIL}"
        document["tool"]["version"] = EVIL
        document["oracle"] = {**document["oracle"], f"note{EVIL}": EVIL}

    (tmp_path / "evil.json").write_bytes(_forge(orders, evil))
    (tmp_path / "unreadable.json").write_bytes(_forge(orders, lambda d: d.update({f"x{EVIL}": 1})))
    codes = []
    for args in (
        ("check", "evil.json"),
        ("check", "evil.json", "--json"),
        ("show", "evil.json"),
        ("check", "unreadable.json"),
        ("show", "unreadable.json"),
        ("check", f"missing{EVIL}.json"),
    ):
        done = _run("govern", *args, cwd=tmp_path)
        _assert_clean(done, " ".join(args))
        codes.append(done.returncode)
    assert codes == [0, 0, 0, 4, 4, 4], codes  # a missing input file is 4 (docs/cli.md)
    shown = _run("govern", "check", "evil.json", cwd=tmp_path).stdout
    assert "\\x1b[2K" in shown
