"""What a new user meets following docs/bide.md and docs/cli.md, through subprocesses where it is the CLI:

- `bide pending` offers `bide approve|deny` only for calls at an approval gate, and `bide approve` of a call
  at a custom gate says so instead of pointing back to `bide pending`;
- a command people try that is not one (`bide status`) gets a suggestion, like a typo;
- a repeated `bide resolve` says that nothing was written, and refuses (exit 5) other evidence;
- `run_sync`, `send_sync` and `resolve_halt` inside a running event loop raise `ConfigError` and create no
  coroutine;
- `bide worker --help` explains `--app`; a store URL from $BIDE_STORE is named as such in errors; a damaged
  record is one line naming the run and the record (exit 4);
- the docs name only commands that exist, and every halt in bide's error tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import bide
from bide.approvals import ApprovalGate
from bide.audit._keys import generate_key
from bide.testing import Fail, ScriptedModel, call, reply

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    base.pop("BIDE_STORE", None)
    command = [sys.executable, "-m", "bide._cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, cwd=cwd, env={**base, **(env or {})}, timeout=120
    )


def run_all(*calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: run(*args, cwd=cwd), calls))


class ManagerApproval:
    """The custom gate of docs/bide.md "Approval gates"."""

    async def check(self, request: bide.GateRequest) -> bide.GateDecision:
        decision = request.journal.get(f"approval:{request.call_id}")
        if decision is None:
            return bide.Pending("a manager must approve")
        return bide.Approved(evidence=decision) if decision["ok"] else bide.Denied(decision["why"])


def charge_card(customer: str, cents: int) -> str:
    """Charge a card."""
    return "charged"


def _paused(store: bide.Store, run_id: str, gate: bide.Gate) -> None:
    tool = bide.tool(gate=gate)(charge_card)
    model = ScriptedModel([call("charge_card", customer="bob", cents=900), reply("Charged bob.")])
    with contextlib.suppress(bide.ApprovalPending):
        bide.Agent(model, store=store, tools=[tool]).run_sync(run_id, "Charge bob 900 cents")


def test_pending_and_approve_tell_a_custom_gate_from_an_approval_gate(tmp_path: Path) -> None:
    generate_key(str(tmp_path / "m.key"))
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    _paused(store, "order-2", ManagerApproval())
    store.close()

    pending, approved, denied = run_all(
        ("pending", "--store", url),
        ("approve", "order-2", "c0.0", "--key", "m.key", "--store", url),
        ("deny", "order-2", "c0.0", "--key", "m.key", "--store", url),
        cwd=tmp_path,
    )
    assert pending.returncode == 0, pending.stderr
    assert "custom gate: a manager must approve" in pending.stdout
    assert "bide approve|deny" not in pending.stdout  # it cannot open this gate
    assert "run the agent again" in pending.stdout
    for refused in (approved, denied):
        assert refused.returncode == 4, refused.stderr
        assert "call 'c0.0' of run 'order-2' waits at a custom gate, not an approval gate" in refused.stderr
        assert "a manager must approve" in refused.stderr and "see `bide pending`" not in refused.stderr

    store = bide.open_store(url)
    _paused(store, "order-3", ApprovalGate.single("alice", str(tmp_path / "m.key.pub")))
    store.close()
    pending, as_json = run_all(
        ("pending", "--store", url), ("pending", "--store", url, "--json"), cwd=tmp_path
    )
    assert "bide approve|deny RUN CALL --key FILE" in pending.stdout  # order-3 can be approved
    assert {w["run_id"]: w["gate"] for w in json.loads(as_json.stdout)} == {
        "order-2": "custom",
        "order-3": "approval",
    }
    approved = run("approve", "order-3", "c0.0", "--key", "m.key", "--store", url, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr  # an approval gate is not taken for a custom one


def test_a_command_people_try_gets_a_suggestion(tmp_path: Path) -> None:
    status, typo = run_all(("status",), ("shwo", "x"), cwd=tmp_path)
    assert status.returncode == 2 and "did you mean `bide show`?" in status.stderr
    assert typo.returncode == 2 and "did you mean `bide show`?" in typo.stderr


def test_a_repeated_resolve_says_nothing_was_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)

    @bide.tool(timeout=30)
    def send_wire(to: str) -> str:
        """Send a wire."""
        raise OSError("the connection dropped after the request went out")

    def agent() -> bide.Agent[str]:
        # A minute behind: the call's deadline has passed on the wall clock (the resolves below allow no
        # clock skew), while it had all its 30 s to start (a short timeout, waited out, could close before
        # a worker thread started the call on a loaded machine).
        model = ScriptedModel([call("send_wire", to="acme"), reply("Sent.")])
        return bide.Agent(model, store=store, tools=[send_wire], clock=lambda: time.time() - 60)

    with contextlib.suppress(bide.OutcomeUnknown):
        agent().run_sync("wire-2", "Pay acme")
    resolve = ("resolve", "--store", url, "--clock-skew", "0", "wire-2", "c0.0", "--succeeded", '"ok"')
    first = run(*resolve, "--evidence", '{"bank":"A"}', cwd=tmp_path)
    assert first.returncode == 0 and "resolved call c0.0 of run wire-2 as succeeded" in first.stdout
    same = run(*resolve, "--evidence", '{"bank":"A"}', cwd=tmp_path)  # one at a time: each takes the lease
    other = run(*resolve, "--evidence", '{"bank":"B"}', cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert "already resolved as succeeded" in same.stdout and "nothing was written" in same.stdout
    assert '{"bank":"A"}' in same.stdout and "resolved call" not in same.stdout
    assert other.returncode == 5 and other.stdout == ""
    assert (
        "refused" in other.stderr and '{"bank":"A"}' in other.stderr and "nothing was written" in other.stderr
    )

    assert agent().run_sync("wire-2", "Pay acme").answer == "Sent."
    recorded = bide.Journal(store, "wire-2").load().get("result:c0.0")
    assert isinstance(recorded, bide.ToolResult) and recorded.evidence == {"bank": "A"}
    store.close()
    ended = run(*resolve, "--evidence", '{"bank":"A"}', cwd=tmp_path)
    assert ended.returncode == 0 and "nothing was written" in ended.stdout and "has ended" in ended.stdout


def test_sync_helpers_inside_an_event_loop_raise_config_error_and_make_no_coroutine() -> None:
    store = bide.open_store("memory://")
    agent = bide.Agent(ScriptedModel([reply("hi")]), store=store)

    async def inside() -> list[str]:
        said = []
        for attempt in (
            lambda: agent.run_sync("r", "hello"),
            lambda: agent.thread("t").send_sync("hello"),
            lambda: bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started()),
        ):
            with pytest.raises(bide.ConfigError, match="cannot run inside an event loop") as err:
                attempt()
            said.append(str(err.value))
        return said

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = asyncio.run(inside())
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert "await agent.run(" in said[0] and "await thread.send(" in said[1] and "aresolve_halt" in said[2]
    assert agent.run_sync("r", "hello").answer == "hi"  # outside a loop it runs as ever


def test_worker_help_explains_app(tmp_path: Path) -> None:
    helped = run("worker", "--help", cwd=tmp_path)
    text = " ".join(helped.stdout.split())
    assert helped.returncode == 0 and "see bide worker -h" not in text
    assert "an Agent, a list (or tuple) of Agents, or a function(store) returning either" in text


def test_a_store_url_from_bide_store_is_named_in_errors(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    from_env = run("runs", cwd=tmp_path, env={"BIDE_STORE": missing})
    assert from_env.returncode == 4 and "$BIDE_STORE names it" in from_env.stderr
    given = run("runs", "--store", missing, cwd=tmp_path, env={"BIDE_STORE": missing})
    assert given.returncode == 4 and "names it" not in given.stderr
    assert "check the path in --store" in given.stderr
    bad = run("runs", cwd=tmp_path, env={"BIDE_STORE": "mysql://x/y"})
    assert bad.returncode == 2 and "came from $BIDE_STORE" in bad.stderr


def test_a_damaged_record_is_one_line_naming_run_and_record(tmp_path: Path) -> None:
    path = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{path}")
    bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("ok-1", "hello")
    # A run that has not ended (its model went down after a first turn): `bide pending` reads only such runs.
    @bide.tool(safety=bide.ReadOnly)
    def look() -> str:
        """Look."""
        return "seen"

    with pytest.raises(bide.ModelError):
        model = ScriptedModel([call("look"), Fail(bide.ModelError("down"))])
        bide.Agent(model, store=store, tools=[look]).run_sync("wire-1", "hello")
    store.close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE bide_records SET data = ? WHERE run_id = 'wire-1' AND key = 'run:start'", (b"{}",))
    url = f"sqlite:///{path}"
    listed, shown, pending, only_damaged, pending_damaged = run_all(
        ("runs", "--store", url),
        ("show", "--store", url, "wire-1"),
        ("pending", "--store", url),
        ("runs", "--store", url, "--prefix", "wire"),
        ("pending", "--store", url, "--prefix", "wire"),
        cwd=tmp_path,
    )
    line = (
        r"run 'wire-1' cannot be read: its record 'run:start' \(seq \d+\) is damaged "
        r"\(it has no 'kind' field\)"
    )
    for done in (listed, shown, pending, only_damaged, pending_damaged):
        assert done.returncode == 4, done.stderr
        assert re.search(line, done.stderr) and len(done.stderr.splitlines()) == 1, done.stderr
        assert "\\x0a" not in done.stderr and "pydantic" not in done.stderr
    assert "ok-1" in listed.stdout
    assert only_damaged.stdout.strip() == "No readable runs."
    # (It said "No run is waiting at a gate.", though the damaged run may well be.)
    assert pending_damaged.stdout.strip() == "No readable run is waiting at a gate."
    # The commands that write to the run said "store error" with exit 6, which a script retries forever.
    assert run("keygen", "k.key", cwd=tmp_path).returncode == 0
    writes = run_all(
        ("approve", "--store", url, "wire-1", "c0.0", "--key", "k.key"),
        ("deny", "--store", url, "wire-1", "c0.0", "--key", "k.key"),
        ("cancel", "--store", url, "wire-1"),
        ("resolve", "--store", url, "wire-1", "c0.0", "--not-started", "--json"),
        cwd=tmp_path,
    )
    for done in writes:
        assert done.returncode == 4, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(
            "bide: run 'wire-1' cannot be read: its record 'run:start' is damaged (it has no 'kind' field); "
        ), done.stderr
    assert json.loads(writes[3].stdout)["reason"] == "unreadable"
    # A damaged header too (it was refused as a journal format bide does not read: a store error, exit 6).
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE bide_records SET data = ? WHERE run_id = 'ok-1' AND key = '@journal'", (b"[",))
    for done in run_all(("cancel", "--store", url, "ok-1"), ("show", "--store", url, "ok-1"), cwd=tmp_path):
        assert done.returncode == 4, done.stderr
        assert "run 'ok-1' cannot be read: its record '@journal'" in done.stderr, done.stderr
        assert "(it is not JSON)" in done.stderr, done.stderr


def test_docs_name_only_real_commands_and_every_halt() -> None:
    from bide._cli import build_parser

    _, sub = build_parser()
    docs = {p.name: p.read_text() for p in (REPO / "docs").glob("*.md")}
    for name, text in docs.items():
        shown = "\n".join(line for line in text.splitlines() if "did you mean" not in line)  # not mistakes
        for command in re.findall(r"`bide ([a-z][a-z-]*)", shown):
            assert command in sub.choices, f"{name} names `bide {command}`, which is not a command"
    tree = docs["bide.md"].split("## Errors", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    halts = [
        n
        for n in bide.__all__
        if isinstance(getattr(bide, n), type) and issubclass(getattr(bide, n), bide.RunHalted)
    ]
    for halt in halts:
        assert halt in tree, f"bide.md's error tree leaves out {halt}"
    assert "pip install 'bide[otel]' opentelemetry-sdk" in docs["bide.md"]


def test_show_prints_a_record_too_large_for_its_table_whole_after_it(tmp_path: Path) -> None:
    """A tool result of megabytes wrapped in `bide show`'s table cell took time quadratic in its size
    (minutes at 32 MiB; a 100 MiB one had not printed after 14 minutes). A record over 64 Ki characters
    is named in the table and printed whole after it; `--json` is unchanged."""

    @bide.tool(safety=bide.ReadOnly)
    def fetch(n: int) -> str:
        """Fetch."""
        return "x" * n

    store = bide.open_store(f"sqlite:///{tmp_path / 'big.db'}")
    try:
        model = ScriptedModel([call("fetch", n=200_000), reply("done")])
        bide.Agent(model, store=store, tools=[fetch]).run_sync("big", "go")
    finally:
        store.close()
    shown = run("show", "--store", "sqlite:///big.db", "big", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    table, _, after = shown.stdout.partition("characters: below the table)")
    assert "x" * 1000 not in table
    [line] = [line for line in after.splitlines() if line.startswith("record ")]
    assert re.fullmatch(r"record \d+ \(result:c0\.0\): \{.*\}", line) and "x" * 200_000 in line
    as_json = json.loads(run("show", "--store", "sqlite:///big.db", "big", "--json", cwd=tmp_path).stdout)
    assert any("x" * 200_000 in json.dumps(r["record"]) for r in as_json["records"])


def test_pending_lists_every_call_of_a_turn_waiting_at_a_gate_of_either_kind(tmp_path: Path) -> None:
    """One turn's calls: two at a custom gate, one at an approval gate, one ungated. `bide pending` listed
    the call the run is blocked on and the approval-gate ones: the second custom-gated call, which waits
    for the same person, was left out."""
    from bide.approvals import ApprovalGate
    from bide.testing import Call, Turn

    key = generate_key(str(tmp_path / "m.key"))
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    custom = bide.tool(gate=ManagerApproval())(charge_card)

    @bide.tool(gate=ApprovalGate.single("m", key.public))
    def wire(amount: int) -> str:
        """Wire."""
        return "sent"

    @bide.tool(safety=bide.ReadOnly)
    def peek() -> str:
        """Peek."""
        return "seen"

    calls = (
        Call("charge_card", {"customer": "bob", "cents": 900}),
        Call("wire", {"amount": 5}),
        Call("peek", {}),
        Call("charge_card", {"customer": "ann", "cents": 100}),
    )
    store = bide.open_store(url)
    try:
        with pytest.raises(bide.ApprovalPending):
            model = ScriptedModel([Turn(calls=calls), reply("done")])
            bide.Agent(model, store=store, tools=[custom, wire, peek]).run_sync("r", "go")
    finally:
        store.close()
    listing = run("pending", "--store", url, "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    assert [(r["call_id"], r["gate"]) for r in rows] == [
        ("c0.0", "custom"), ("c0.1", "approval"), ("c0.3", "custom")
    ]  # fmt: skip
    assert rows[2]["arguments"] == {"customer": "ann", "cents": 100}
