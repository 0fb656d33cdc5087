"""The `bide` command at the edges of operations, on real SQLite files: a resolve of a mistyped run leaves
no trace, a second resolve of a resolved call is refused as such, a call executing under a live driver is
not "halted", one unreadable run does not hide the others, `--limit` keeps the most recently active runs,
and `--debug` is accepted after the subcommand.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.testing import ScriptedModel, call, reply

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


@bide.tool(timeout=30)
def send(to: str) -> str:
    """Send a message (the connection drops after the request went out)."""
    raise OSError("lost after the request went out")


class _Hold:
    def check(self, request: Any) -> bide.Pending:
        return bide.Pending(f"hold for review of {request.tool}")


@bide.tool(gate=_Hold())
def wire(amount: int) -> str:
    """Wire money."""
    return "wired"


def halt(store: bide.Store, run_id: str) -> None:
    """Leave `run_id` halted on call c0.0 (send), its outcome unknown and its deadline past: the agent's
    clock runs a minute behind, so the deadline the marker records has passed on the wall clock, while the
    call had all its 30 s to start (a short timeout, waited out, could close before the marker's commit and
    a worker thread let it start on a loaded machine)."""
    model = ScriptedModel([call("send", to="x"), reply("ok")])
    agent = bide.Agent(model, store=store, tools=[send], clock=lambda: time.time() - 60)
    with contextlib.suppress(bide.OutcomeUnknown):
        agent.run_sync(run_id, "send it")


@pytest.fixture
def db(tmp_path: Path) -> tuple[str, bide.Store]:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    return url, bide.open_store(url)


def test_resolve_of_a_run_that_does_not_exist_leaves_no_lease_row(db: tuple[str, bide.Store]) -> None:
    url, store = db
    halt(store, "stuck")
    store.close()
    done = cli("resolve", "--store", url, "stuk", "c0.0", "--not-started")
    assert done.returncode == 4, done.stderr
    assert "does not exist" in done.stderr
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        assert conn.execute("SELECT run_id FROM bide_runs ORDER BY run_id").fetchall() == [("stuck",)]


def test_a_second_resolve_of_a_resolved_call_is_refused_as_already_resolved(
    db: tuple[str, bide.Store],
) -> None:
    url, store = db
    halt(store, "stuck")
    store.close()
    first = cli("resolve", "--store", url, "stuck", "c0.0", "--not-started", "--clock-skew", "0")
    assert first.returncode == 0, first.stderr
    again = cli("resolve", "--store", url, "stuck", "c0.0", "--not-started", "--clock-skew", "0")
    assert again.returncode == 0, again.stderr  # the same decision again is accepted
    other = cli("resolve", "--store", url, "stuck", "c0.0", "--succeeded", '"sent"', "--clock-skew", "0")
    assert other.returncode == 5, other.stderr
    assert "already resolved as not started" in other.stderr
    missing = cli("resolve", "--store", url, "stuck", "c9.9", "--not-started", "--clock-skew", "0")
    assert missing.returncode == 4, missing.stderr


@contextlib.contextmanager
def live_driver(store: bide.Store, run_id: str) -> Iterator[None]:
    """Run `run_id` in a thread, inside its call c0.0 (a side effect that waits) until the block ends."""
    entered, release = threading.Event(), threading.Event()

    @bide.tool(timeout=60)
    def slow(n: int) -> str:
        """A side effect that takes a while."""
        entered.set()
        release.wait(60)
        return "done"

    agent = bide.Agent(ScriptedModel([call("slow", n=1), reply("fin")]), store=store, tools=[slow])
    driver = threading.Thread(target=agent.run_sync, args=(run_id, "go"))
    driver.start()
    try:
        assert entered.wait(30)
        yield
    finally:
        release.set()
        driver.join(30)


def test_a_call_executing_under_a_live_driver_is_running_not_halted(db: tuple[str, bide.Store]) -> None:
    url, store = db
    with live_driver(store, "live"):
        halted = cli("runs", "--store", url, "--status", "halted", "--json")
        listed = cli("runs", "--store", url, "--json")
        shown = cli("show", "--store", url, "live", "--json")
    store.close()
    assert halted.returncode == 0, halted.stderr
    assert json.loads(halted.stdout) == []
    [row] = json.loads(listed.stdout)
    assert (row["run_id"], row["status"], row["lease_live"]) == ("live", "running", True)
    assert row["call_id"] == "c0.0"
    assert json.loads(shown.stdout)["run"]["status"] == "running"


def test_one_unreadable_run_does_not_hide_the_others(db: tuple[str, bide.Store]) -> None:
    url, store = db
    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("done", "hello")
    halt(store, "stuck")
    held = bide.Agent(ScriptedModel([call("wire", amount=5), reply("ok")]), store=store, tools=[wire])
    with contextlib.suppress(bide.ApprovalPending):
        held.run_sync("held", "wire it")
    store.close()
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        broken = (b"{not json",)
        conn.execute("UPDATE bide_records SET data = ? WHERE run_id = 'done' AND key = 'run:end'", broken)
        conn.commit()
    runs = cli("runs", "--store", url, "--json")
    assert runs.returncode == 4, runs.stderr
    # The failure document every command prints, with what was listed: the rows alone ([...]) looked like
    # a whole listing to a program that reads only stdout.
    doc = json.loads(runs.stdout)
    assert (doc["exit_code"], doc["reason"]) == (4, "unreadable"), doc
    assert sorted(r["run_id"] for r in doc["listed"]) == ["held", "stuck"]
    [damaged] = doc["unreadable"]
    assert damaged["run_id"] == "done" and "run:end" in damaged["problem"]
    assert "run 'done' cannot be read" in runs.stderr and "run:end" in runs.stderr
    # `bide pending` reads only runs that have not ended: 'done' (its run:end damaged) is not read there.
    pending = cli("pending", "--store", url, "--json")
    assert pending.returncode == 0, pending.stderr
    assert [w["run_id"] for w in json.loads(pending.stdout)] == ["held"]
    shown = cli("show", "--store", url, "done")
    assert shown.returncode == 4 and "run 'done' cannot be read" in shown.stderr, shown.stderr
    assert cli("show", "--store", url, "stuck").returncode == 0
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
        conn.execute("UPDATE bide_records SET data = ? WHERE run_id = 'stuck' AND key = 'model:0'", broken)
        conn.commit()
    pending = cli("pending", "--store", url, "--json")
    assert pending.returncode == 4, pending.stderr
    doc = json.loads(pending.stdout)
    assert [w["run_id"] for w in doc["listed"]] == ["held"] and doc["reason"] == "unreadable"
    assert [u["run_id"] for u in doc["unreadable"]] == ["stuck"]


def test_runs_limit_keeps_the_most_recently_active(db: tuple[str, bide.Store]) -> None:
    url, store = db
    halt(store, "b-older")
    time.sleep(0.05)
    halt(store, "a-old")
    time.sleep(0.05)
    halt(store, "m-newest")
    store.close()
    done = cli("runs", "--store", url, "--limit", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["run_id"] for r in json.loads(done.stdout)] == ["m-newest", "a-old"]
    assert "showing the 2 most recently active of 3 runs" in done.stderr
    everything = cli("runs", "--store", url, "--limit", "3", "--json")
    assert len(json.loads(everything.stdout)) == 3 and everything.stderr == ""


def test_runs_limit_keeps_the_most_recent_across_pages_of_runs(db: tuple[str, bide.Store]) -> None:
    """`bide runs` reads the runs in pages (journals 32 at a time) and keeps only the `--limit` most recent
    as it goes (it kept a row per run, 1.5 GB for a million): the most recent runs come first in run-id
    order here, so they must survive every later page of older runs."""
    import asyncio

    url, store = db
    n = 1600

    @bide.tool()
    def charge(cents: int) -> str:
        """Charge a card."""
        return "charged"

    async def make() -> None:
        async def one(i: int) -> None:
            agent = bide.Agent(
                ScriptedModel([call("charge", cents=i), reply("ok")]),
                store=store,
                tools=[charge],
                clock=lambda: 1_800_000_000.0 + i,  # run i acted at second i
            )
            await agent.run(f"r{n - i:05d}", "charge")

        await asyncio.gather(*(one(i) for i in range(n)))

    asyncio.run(make())
    store.close()
    done = cli("runs", "--store", url, "--limit", "3", "--json")
    assert done.returncode == 0, done.stderr
    assert [r["run_id"] for r in json.loads(done.stdout)] == ["r00001", "r00002", "r00003"]
    assert f"showing the 3 most recently active of {n} runs" in done.stderr


def test_debug_is_accepted_after_the_subcommand(db: tuple[str, bide.Store], tmp_path: Path) -> None:
    url, store = db
    halt(store, "stuck")
    store.close()
    for args in (["runs", "--store", url, "--debug"], ["--debug", "runs", "--store", url]):
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        assert "stuck" in done.stdout
    worker = cli("worker", "--store", url, "--app", "nosuchmodule_xyz:build", "--once", "--debug")
    assert worker.returncode == 2
    assert "nosuchmodule_xyz" in worker.stderr and "unrecognized arguments" not in worker.stderr


APP = '''import bide
from bide.testing import ScriptedModel, reply


def build(store):
    return bide.Agent(ScriptedModel([reply("ok")]), store=store, name="a")
'''


def _in(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "bide._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=where, timeout=60)


def test_a_store_path_that_is_no_database_is_no_store_for_every_command_the_worker_included(
    tmp_path: Path,
) -> None:
    """`bide worker` exited 6 ("the store failed", which a cron job retries as an outage) for a --store that
    is a text file, a directory or a pipe, where the other commands exit 4; and `bide runs` called a
    directory or a pipe "the file does not exist". Each is "no bide store" (exit 4), saying what is there,
    and nothing is written to it."""
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "notes.db").write_text("hello, not sqlite\n")
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "pipe")
    said = {
        "notes.db": "the file is not a SQLite database",
        "adir": "it is a directory",
        "pipe": "it is not a regular file (a pipe or a device)",
    }
    for name, why in said.items():
        for command in (("runs",), ("worker", "--app", "app:build", "--once")):
            done = _in(tmp_path, *command, "--store", f"sqlite:///{name}")
            assert done.returncode == 4, (name, command, done.stderr)
            assert "no bide store at" in done.stderr and why in done.stderr, done.stderr
    assert (tmp_path / "notes.db").read_text() == "hello, not sqlite\n"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("__")) == [
        "adir", "app.py", "notes.db", "pipe"
    ]  # fmt: skip


def test_a_worker_whose_app_does_not_import_leaves_another_applications_database_as_it_was(
    tmp_path: Path,
) -> None:
    """A mistyped --app was refused (exit 2) only after the worker had made bide's tables in the database
    and switched it to write-ahead logging for good: the app is imported before the store is opened."""
    path = tmp_path / "crm.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        conn.commit()
    before = path.read_bytes()
    done = _in(tmp_path, "worker", "--store", f"sqlite:///{path}", "--app", "no_such_module:build", "--once")
    assert done.returncode == 2 and "cannot import 'no_such_module'" in done.stderr, done.stderr
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["crm.db"]


def test_resolve_too_early_or_under_a_live_driver_is_not_yet_and_says_when(
    db: tuple[str, bide.Store],
) -> None:
    """A call that may still be running, or a run another driver holds, was exit 5 ("refused", which no
    retry changes), the same code as a call already resolved otherwise, and `bide resolve` had no --json to
    give the time to retry: a script had to parse the English to tell "wait" from "give up". Now both are
    exit 7 ("not yet") with `retry_after`, and --json prints what was resolved."""
    url, store = db
    model = ScriptedModel([call("send", to="x"), reply("ok")])
    with contextlib.suppress(bide.OutcomeUnknown):  # its deadline is 30 s away: it may still be running
        bide.Agent(model, store=store, tools=[send]).run_sync("early", "send it")
    with live_driver(store, "live"):
        early = cli("resolve", "--store", url, "early", "c0.0", "--not-started", "--json")
        live = cli("resolve", "--store", url, "live", "c0.0", "--not-started", "--json")
    for done, said in ((early, "may still be running"), (live, "driven by another driver")):
        assert done.returncode == 7, done.stdout + done.stderr
        doc = json.loads(done.stdout)
        assert (doc["exit_code"], doc["reason"]) == (7, "not yet") and said in doc["message"], doc
        assert doc["retry_after"] > time.time() - 5, doc
        assert "bide: not yet:" in done.stderr
    halt(store, "late")
    store.close()
    resolved = cli("resolve", "--store", url, "late", "c0.0", "--not-started", "--clock-skew", "0", "--json")
    assert resolved.returncode == 0, resolved.stderr
    doc = json.loads(resolved.stdout)
    assert {k: doc[k] for k in ("result", "written", "run", "call", "outcome")} == {
        "result": "resolved", "written": True, "run": "late", "call": "c0.0", "outcome": "not_started"
    }  # fmt: skip
    again = cli("resolve", "--store", url, "late", "c0.0", "--not-started", "--clock-skew", "0", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["written"] is False, again.stdout
    other = cli("resolve", "--store", url, "late", "c0.0", "--failed", "no", "--clock-skew", "0", "--json")
    assert other.returncode == 5 and json.loads(other.stdout)["reason"] == "refused", other.stdout


@pytest.mark.parametrize("bad_id", ["r1\n", "a\x01b", "", "x" * 257])
def test_a_run_id_bide_could_not_have_written_is_a_usage_error(tmp_path: Path, bad_id: str) -> None:
    """A run id with a control character (a trailing newline pasted from a file), an empty one or one past
    the length limit named a run that "cannot be read" (exit 4, the code of a damaged or missing run) in
    `bide show`; every command that takes a run id refuses it as the usage error it is (exit 2), before
    opening the store, and writes nothing."""
    db = tmp_path / "bide.db"
    bide.Agent(ScriptedModel([reply("hi")]), store=bide.open_store(str(db)), tools=[]).run_sync("r1", "hello")
    before = db.read_bytes()
    for command in (["show"], ["show", "--json"], ["cancel"], ["resolve", "--not-started"], ["approve"]):
        extra = ["c0.0"] if command[0] in ("resolve", "approve") else []
        key = ["--key", str(tmp_path / "no-key")] if command[0] == "approve" else []
        done = cli(command[0], "--store", str(db), *command[1:], *key, "--", bad_id, *extra)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "run id" in done.stdout + done.stderr, (command, done.stdout, done.stderr)
    assert db.read_bytes() == before


def test_text_no_store_can_keep_is_a_usage_error_and_writes_nothing(db: tuple[str, bide.Store]) -> None:
    """Bytes that are not UTF-8 on the command line (Python hands them over as lone surrogates), a JSON
    "\\ud800" escape and JSON nested thousands deep: `resolve`, `cancel` and `approve` said "internal
    error ... a bug" (exit 3), and `runs`/`pending --prefix` "the store failed" (exit 6, retry). Each is a
    usage error (exit 2) that names the argument, and the halted run is left as it was."""
    url, store = db
    halt(store, "h")
    before = bide.Journal(store, "h").load().last_seq
    store.close()
    not_utf8 = "\udcff"  # the byte 0xff, as subprocess passes it on
    cases = [
        (("resolve", "h", "c0.0", "--failed", not_utf8), "--failed"),
        (("resolve", "h", "c0.0", "--succeeded", '"\\ud800"'), "--succeeded"),
        (("resolve", "h", "c0.0", "--succeeded", "[" * 3000 + "]" * 3000), "--succeeded"),
        (("resolve", "h", "c0.0", "--succeeded", '"x"', "--evidence", '"\\udcff"'), "--evidence"),
        (("resolve", "h", not_utf8, "--not-started"), "call"),
        (("cancel", "h", "--reason", not_utf8), "--reason"),
        (("runs", "--prefix", not_utf8), "--prefix"),
        (("pending", "--prefix", not_utf8), "--prefix"),
        (("approve", "h", not_utf8, "--key", "no-key"), "call"),
    ]
    for (command, *rest), named in cases:
        done = cli(command, "--store", url, *rest)
        assert done.returncode == 2, (command, rest[:3], done.stderr)
        assert named in done.stderr and "Traceback" not in done.stderr, (command, done.stderr)
    store = bide.open_store(url)
    try:
        assert bide.run_status(store, "h").status == "halted"
        assert bide.Journal(store, "h").load().last_seq == before
    finally:
        store.close()
