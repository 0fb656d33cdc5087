"""A command that records or writes something, run with a standard output that cannot be written
(`> /dev/full`), exits 2 (docs/cli.md: "a standard output that cannot be written") and said only that its
output could not be written: a script read 2 as "nothing was done" while the cancel request was journaled,
the key pair, the evidence or the certificate written. The message now says that the command finished,
with the code it finished with, and what it did stands; with `--json` too (the document is what was lost,
so standard error says it). Both with Python's output buffered and unbuffered (`PYTHONUNBUFFERED`): a write
fails where it is made, or only when the output is flushed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bide

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {"bide": "bide._cli", "bide-audit": "bide.audit._cli", "govern": "govern"}

MACHINE = '''\
from govern import Registry

lamp = Registry("lamp")
on = lamp.bool("on")
level = lamp.int("level", 0, 3)
lamp.event("switch_on", effect={on: True})
lamp.event("brighten", guard=level < 3, effect={level: level + 1})
'''


@pytest.fixture(params=["unbuffered", "buffered"])
def env(request: pytest.FixtureRequest) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("PYTHONUNBUFFERED", None)
    if request.param == "unbuffered":
        env["PYTHONUNBUFFERED"] = "1"
    return env


def run(prog: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", COMMANDS[prog], *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def to_full_disk(prog: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command whose standard output is a full disk (`cmd > /dev/full`)."""
    with open("/dev/full", "w") as full:
        command = [sys.executable, "-m", COMMANDS[prog], *args]
        return subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                              timeout=300)  # fmt: skip


def assert_finished_with_output_lost(
    done: subprocess.CompletedProcess[str], code: int, why: str = "No space left on device"
) -> None:
    """Exit 2, and standard error says once that the output is lost (`why`) and that the command finished
    with `code`, what it did standing."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count(f"the output could not be written ({why})") == 1, done.stderr
    assert f"the command itself finished (exit {code})" in done.stderr, done.stderr
    assert "what it recorded or wrote stands; only its printed output is lost" in done.stderr, done.stderr


def test_a_cancel_whose_output_is_lost_is_journaled(tmp_path: Path, env: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        bide.Journal(store, "r1").load().write([bide.Start(key="run:start", entry="agent:test", input="go")])
    finally:
        store.close()
    lost = to_full_disk("bide", "cancel", "r1", "--store", url, "--reason", "changed my mind", cwd=tmp_path,
                        env=env)  # fmt: skip
    assert_finished_with_output_lost(lost, 0)
    again = run("bide", "cancel", "r1", "--store", url, cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert "already has a cancel request" in again.stdout, again.stdout


@pytest.mark.parametrize("prog", sorted(COMMANDS))
def test_a_key_pair_whose_output_is_lost_is_written(prog: str, tmp_path: Path, env: dict[str, str]) -> None:
    assert_finished_with_output_lost(to_full_disk(prog, "keygen", "k.key", cwd=tmp_path, env=env), 0)
    assert (tmp_path / "k.key").is_file() and (tmp_path / "k.key.pub").is_file()
    again = run(prog, "keygen", "k.key", cwd=tmp_path, env=env)
    assert again.returncode == 2 and "exists" in again.stdout + again.stderr, again.stdout + again.stderr


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_evidence_whose_output_is_lost_is_written_and_verifies(
    tmp_path: Path, env: dict[str, str], json_mode: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        journal = bide.Journal(store, "r1").load()
        journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
        journal.write([bide.GateRecord(key="approval:note:0", data={"i": 0})])
    finally:
        store.close()
    assert run("bide-audit", "keygen", "log.key", cwd=tmp_path, env=env).returncode == 0
    export = ["export", "--store", url, "--run", "r1", "--key", "log.key", "-o", "evidence.json"]
    lost = to_full_disk("bide-audit", *export, *(["--json"] if json_mode else []), cwd=tmp_path, env=env)
    assert_finished_with_output_lost(lost, 0)
    verify = ["verify-evidence", "evidence.json", "--pubkey", "log.key.pub"]
    verified = run("bide-audit", *verify, cwd=tmp_path, env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_a_certificate_whose_output_is_lost_is_written_and_checks(
    tmp_path: Path, env: dict[str, str], json_mode: bool
) -> None:
    (tmp_path / "lamp.py").write_text(MACHINE)
    certify = ["certify", "lamp.py:lamp", "-o", "lamp.json", *(["--json"] if json_mode else [])]
    assert_finished_with_output_lost(to_full_disk("govern", *certify, cwd=tmp_path, env=env), 0)
    checked = run("govern", "check", "lamp.json", cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_failure_whose_json_document_is_lost_says_its_own_code(tmp_path: Path, env: dict[str, str]) -> None:
    """With `--json` a failure prints its document on standard output too: lost, the message gives the code
    the command failed with (4: nothing found, nothing done), as it gives 0 for one that did its work."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    store.close()
    assert run("bide-audit", "keygen", "k", cwd=tmp_path, env=env).returncode == 0
    for prog, args, code in [
        ("bide", ("show", "no-such-run", "--store", url, "--json"), 4),
        ("bide-audit", ("verify", "missing.json", "--pubkey", "k.pub", "--json"), 4),
        ("govern", ("check", "missing.json", "--json"), 4),
        ("bide", ("runs", "--json", "--limit", "abc"), 2),
        ("bide-audit", ("verify", "x", "--json", "--max-input-bytes", "abc"), 2),
        ("govern", ("check", "x", "--json", "--max-size", "abc"), 2),
    ]:
        assert_finished_with_output_lost(to_full_disk(prog, *args, cwd=tmp_path, env=env), code)
        shown = run(prog, *args, cwd=tmp_path, env=env)  # what was lost: one document with that code
        assert shown.returncode == code and json.loads(shown.stdout)["exit_code"] == code, (prog, args)


def test_a_standard_error_that_cannot_be_written_leaves_every_command_its_own_code(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """`2> /dev/full`: a message to standard error raised an OSError nothing caught, and bide and govern
    exited 1 ("found wanting") whatever their own code (a missing certificate 1, not 4); bide-audit took it
    for a lost standard output (2). Standard error drops what it cannot take; the exit code stays."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    try:
        bide.Journal(store, "a").load().write([bide.Start(key="run:start", entry="agent:x", input="go")])
    finally:
        store.close()
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    cases = [
        (("bide", "show", "nope", "--store", url), 4),
        (("bide", "runs", "--store", url, "--json"), 0),
        (("bide", "runs", "--limit", "x"), 2),
        (("govern", "check", "missing.json"), 4),
        (("bide-audit", "verify", "missing.json", "--pubkey", "k.pub"), 4),
    ]
    for (prog, *args), code in cases:
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", COMMANDS[prog], *args], stdout=subprocess.PIPE,
                                  stderr=full, text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip
        assert done.returncode == code, (prog, args, done.returncode)
        if code == 0:
            assert json.loads(done.stdout)[0]["run_id"] == "a"


def test_an_output_the_disk_takes_only_part_of_is_a_lost_output(tmp_path: Path, env: dict[str, str]) -> None:
    """A disk that fills in the middle of a write takes part of it (a short write), then fails. Unbuffered
    (PYTHONUNBUFFERED, as many container images set it), Python's text layer dropped the rest of a short
    write: `govern check` wrote 1,024 of its 1,545 bytes and exited 0, saying nothing. A file size limit
    stands in for the disk here."""
    import resource

    (tmp_path / "lamp.py").write_text(MACHINE)
    assert run("govern", "certify", "lamp.py:lamp", "-o", "lamp.json", cwd=tmp_path, env=env).returncode == 0
    whole = run("govern", "check", "lamp.json", cwd=tmp_path, env=env).stdout.encode()
    assert len(whole) > 1024
    with open(tmp_path / "out.txt", "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "govern", "check", "lamp.json"], stdout=out, stderr=subprocess.PIPE,
            text=True, cwd=tmp_path, env=env, timeout=300,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024)),
        )  # fmt: skip
    assert (tmp_path / "out.txt").stat().st_size == 1024
    assert_finished_with_output_lost(done, 0, "File too large")
