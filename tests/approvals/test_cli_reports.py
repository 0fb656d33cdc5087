"""What `bide approve` and `bide-audit verify-approvals` say in edge cases: an approval recorded beside a
damaged run whose id starts with this one's is a success (exit 0), and a package that leaves out only
`run:end` never says "before the tool ran"."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.approvals import ApprovalGate
from bide.audit import AuditLog, generate_key
from bide.testing import Call, ScriptedModel, Turn, call, reply

from .helpers import APPROVERS, LOG_KEY, ROOT, approved_run, audit_cli

pytestmark = pytest.mark.slow


def _bide(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", *args], capture_output=True, text=True, cwd=cwd,
        env={**os.environ, "PYTHONPATH": path}, timeout=120,
    )


def _paused_at_a_gate(tmp_path: Path, *runs: str, amounts: tuple[int, ...] = (1,)) -> Path:
    """`bide.db` in `tmp_path` with `runs` paused at a 2-of-2 gate (alice.key, bob.key) on one turn's calls
    wire(amount=N), one per amount of `amounts` (c0.0, c0.1, ...)."""
    keys = {n: generate_key(tmp_path / f"{n}.key") for n in ("alice", "bob")}
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in keys.items()})

    @bide.tool(gate=gate)
    def wire(amount: int) -> str:
        """Wire."""
        return f"sent {amount}"

    db = tmp_path / "bide.db"
    store = bide.open_store(f"sqlite:///{db}")
    try:
        for run in runs:
            with pytest.raises(bide.ApprovalPending):
                calls = tuple(Call("wire", {"amount": n}) for n in amounts)
                model = ScriptedModel([Turn(calls=calls), reply("done")])
                bide.Agent(model, store=store, tools=[wire]).run_sync(run, "go")
    finally:
        store.close()
    return db


def test_approve_succeeds_when_another_run_sharing_its_prefix_is_damaged(tmp_path: Path) -> None:
    db = _paused_at_a_gate(tmp_path, "order-3", "order-30")
    with sqlite3.connect(db) as conn:
        conn.execute("update bide_records set data = cast('{\"damaged\":1}' as blob) "
                     "where run_id = 'order-30' and key = 'run:start'")
    approve = ("approve", "--store", "sqlite:///bide.db", "order-3", "c0.0", "--key", "alice.key")
    done = _bide(*approve, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Recorded the signed approval" in done.stdout
    assert "approved by alice, denied by nobody; waiting for bob" in done.stdout
    again = _bide(*approve, cwd=tmp_path)
    assert again.returncode == 5 and "already decided" in again.stderr


def test_a_damaged_approval_request_is_said_as_damaged_not_a_bug(tmp_path: Path) -> None:
    """A request record without its tool (edited in the database) made `bide pending` exit 3 ("a bug") for
    the whole store, and `bide approve` of another, healthy call of the run exit 3 after it had recorded the
    decision: the record is named as damaged (exit 4), and the healthy call is decided as usual."""
    db = _paused_at_a_gate(tmp_path, "x")
    store = bide.open_store(f"sqlite:///{db}")
    try:
        entries = bide.Journal(store, "x").load().entries()
        [request] = [e for e in entries if e.key.startswith("approval:request:")]
    finally:
        store.close()
    record = json.loads(request.data)
    data = {k: v for k, v in record["data"].items() if k not in ("tool", "arguments_digest")}
    forged = {**record, "key": request.key.replace("c0.0", "c0.9"), "data": {**data, "call_id": "c0.9"}}
    with sqlite3.connect(db) as conn:
        conn.execute(
            "insert into bide_records (run_id, key, data) values ('x', ?, ?)",
            (forged["key"], json.dumps(forged, sort_keys=True, separators=(",", ":")).encode()),
        )
    pending = _bide("pending", "--store", "sqlite:///bide.db", cwd=tmp_path)
    assert pending.returncode == 4, pending.stderr
    assert "call 'c0.9' in run 'x' names no tool" in pending.stderr, pending.stderr
    decide = ("approve", "--store", "sqlite:///bide.db", "x", "c0.0", "--key", "alice.key")
    approve = _bide(*decide, cwd=tmp_path)
    assert approve.returncode == 0, approve.stderr
    assert "Recorded the signed approval" in approve.stdout
    assert "approved by alice, denied by nobody; waiting for bob" in approve.stdout
    damaged = _bide(*decide[:4], "c0.9", "--key", "bob.key", cwd=tmp_path)
    assert damaged.returncode == 4 and "names no tool" in damaged.stderr, damaged.stderr


@pytest.mark.parametrize("edit", ["policy", "call_id", "digest"])
def test_a_request_whose_policy_or_call_was_edited_is_damaged_not_a_custom_gate(
    tmp_path: Path, edit: str
) -> None:
    """A request record whose policy or call id was edited was dropped from what the call waits on: `bide
    approve` said the run "waits at a custom gate" (the call could never be decided) and `bide pending`
    said nothing of it. It is a damaged record now, named by both."""
    db = _paused_at_a_gate(tmp_path, "x")
    with sqlite3.connect(db) as conn:
        [(key, raw)] = conn.execute("select key, data from bide_records where key like 'approval:request:%'")
        record = json.loads(raw)
        if edit == "policy":
            record["data"]["policy"]["need"] = 0
        elif edit == "call_id":
            record["data"]["call_id"] = 7
        else:  # a valid policy, but not the one the key names: the gate would never wait on it
            record["data"]["policy"]["need"] = 1
        conn.execute(
            "update bide_records set data = ? where key = ?",
            (json.dumps(record, sort_keys=True, separators=(",", ":")).encode(), key),
        )
    said = {"policy": "holds no valid policy", "call_id": "is not the request of call 'c0.0'",
            "digest": "holds another policy than the one its key names"}[edit]  # fmt: skip
    decide = ("approve", "--store", "sqlite:///bide.db", "x", "c0.0", "--key", "alice.key")
    approve = _bide(*decide, cwd=tmp_path)
    assert approve.returncode == 4 and said in approve.stderr and key in approve.stderr, approve.stderr
    pending = _bide("pending", "--store", "sqlite:///bide.db", cwd=tmp_path)
    assert pending.returncode == 4 and said in pending.stderr, pending.stderr


def test_a_policy_recorded_with_a_name_the_new_rules_refuse_is_still_decided_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Approver names of new policies are at most 128 characters, without C1 controls; a policy an older
    bide recorded with such a name was refused when read back: its runs could not be approved ("a custom
    gate") and `verify-approvals` failed a package that had verified."""
    from bide.approvals import ApprovalPolicy, _policy

    long = "approver-" + "x" * 140
    with pytest.raises(bide.ConfigError, match="the limit is 128"):
        ApprovalPolicy.of(1, {long: generate_key(tmp_path / "probe.key").public})
    real_check = _policy._check_name
    monkeypatch.setattr(_policy, "_check_name", lambda name: None)  # an older bide, which let it through
    keys = {n: generate_key(tmp_path / f"{i}.key") for i, n in enumerate(("alice", "bob\x85", long))}
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in keys.items()})
    monkeypatch.setattr(_policy, "_check_name", real_check)

    @bide.tool(gate=gate)
    def wire(amount: int) -> str:
        """Wire."""
        return f"sent {amount}"

    def agent(store: bide.Store) -> bide.Agent:
        return bide.Agent(ScriptedModel([call("wire", amount=1), reply("done")]), store=store, tools=[wire])

    assert ApprovalPolicy.from_json(gate.policy.to_json(), recorded=True) == gate.policy  # its own rules
    with pytest.raises(bide.ConfigError, match="the limit is 128"):
        ApprovalPolicy.from_json(gate.policy.to_json())  # a new policy written out by hand is refused
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        with pytest.raises(bide.ApprovalPending):
            agent(store).run_sync("x", "go")
    finally:
        store.close()
    for key_file in ("2.key", "1.key"):
        done = _bide("approve", "--store", url, "x", "c0.0", "--key", key_file, cwd=tmp_path)
        assert done.returncode == 0 and "Recorded the signed approval" in done.stdout, done.stderr
    store = bide.open_store(url)
    try:
        assert agent(store).run_sync("x", "go").answer == "done"
        (tmp_path / "evidence.json").write_bytes(AuditLog(store, LOG_KEY).evidence("x").to_json())
    finally:
        store.close()
    verified = audit_cli("verify-approvals", "evidence.json", "--json", cwd=tmp_path)
    report = json.loads(verified.stdout)
    assert verified.returncode == 0 and report["executed_calls_proven"], verified.stdout + verified.stderr


def test_a_package_without_only_its_run_end_says_what_ran_is_not_proven(tmp_path: Path) -> None:
    store, call_id = approved_run()
    log = AuditLog(store, LOG_KEY)
    keys = [e.key for e in store.load("r") if e.key != "run:end"]
    pkg = log.evidence("r", log.sign_head("r"), keys=keys)
    assert len(pkg.records) == pkg.sth.size - 1
    (tmp_path / "partial.json").write_bytes(pkg.to_json())
    pub = LOG_KEY.public.hex
    text = audit_cli("verify-approvals", "partial.json", "--pubkey", pub, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    proven = text.stdout.split("Not proven:")[0]
    assert "before the tool ran" not in proven
    assert "but the package is partial, so what ran is not proven" in proven
    as_json = audit_cli("verify-approvals", "partial.json", "--pubkey", pub, "--json", cwd=tmp_path)
    out = json.loads(as_json.stdout)
    assert out["complete"] is False and out["calls"][0]["executed_call_proven"] is False
    assert out["calls"][0]["attempts"] and "before the tool ran" not in out["message"]
    assert f"what call {call_id!r} ran with: the package is partial" in out["not_proven"]


def test_a_policy_pipe_with_no_writer_is_refused_and_an_upper_case_approver_key_is_a_key(
    tmp_path: Path,
) -> None:
    store, _ = approved_run()
    (tmp_path / "evidence.json").write_bytes(AuditLog(store, LOG_KEY).evidence("r").to_json())
    os.mkfifo(tmp_path / "policy.json")
    done = audit_cli("verify-approvals", "evidence.json", "--policy", "policy.json", cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert "a pipe with no writer" in done.stderr
    approvers = [f"--approver={n}={k.public.hex.upper()}" for n, k in APPROVERS.items()]
    pinned = audit_cli("verify-approvals", "evidence.json", *approvers, cwd=tmp_path)
    assert pinned.returncode == 0, pinned.stderr
    # The seats are pinned, not how many approvals a gate needs (no --need): the output says which.
    assert "Every gate counted with the approvers you pinned" in pinned.stdout
    assert "the number comes from the package (pin it with --need K)" in pinned.stdout


_KILLED_AFTER_THE_TALLY = r'''
import os, signal, sys
import bide
from bide._gate import GateJournal
from bide.approvals import ApprovalGate
from bide.audit import load_signing_key
from bide.testing import Call, ScriptedModel, Turn, reply

here, outcome = sys.argv[1], sys.argv[2]
gate = ApprovalGate.k_of_n(
    2, {n: load_signing_key(os.path.join(here, f"{n}.key")).public for n in ("alice", "bob")}
)

@bide.tool(gate=gate)
def wire(amount: int) -> str:
    """Wire."""
    open(os.path.join(here, "fired"), "a").write("fired\n")
    return f"sent {amount}"

written = GateJournal.put_all

async def put_all(self, items):
    done = await written(self, items)
    if any(key.startswith("approval:tally:") for key, _ in items):
        os.kill(os.getpid(), signal.SIGKILL)  # the tally is committed; the call is not made
    return done

GateJournal.put_all = put_all
store = bide.open_store(f"sqlite:///{os.path.join(here, 'bide.db')}")
calls = tuple(Call("wire", {"amount": n}) for n in range(1, int(sys.argv[3]) + 1))
model = ScriptedModel([Turn(calls=calls), reply("done")])
bide.Agent(model, store=store, tools=[wire]).run_sync("x", "go")
'''


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_pending_says_a_gate_whose_tally_is_recorded_is_closed(tmp_path: Path, decision: str) -> None:
    """A driver killed between the tally it wrote and the call (or its denial) left the run at its gate,
    and `bide pending` listed it as waiting for every approver, with the pause's "has 0" and the line
    telling them to `bide approve`, which the closed gate refuses (exit 5). It says the gate closed, by whom,
    and that the agent must run again."""
    db = _paused_at_a_gate(tmp_path, "x")
    for name in ("alice", "bob"):
        key = f"{name}.key"
        said = _bide(decision, "--store", f"sqlite:///{db}", "x", "c0.0", "--key", key, cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        if decision == "deny":
            break  # one denial of two needed closes the gate
    script = tmp_path / "drive.py"
    script.write_text(_KILLED_AFTER_THE_TALLY)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    killed = subprocess.run([sys.executable, str(script), str(tmp_path), decision, "1"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": path}, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "fired").exists()

    listing = _bide("pending", "--store", f"sqlite:///{db}", "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    [row] = json.loads(listing.stdout)
    outcome, who = ("approved", ["alice", "bob"]) if decision == "approve" else ("denied", ["alice"])
    assert row["decided"] == {
        "outcome": outcome,
        "approved_by": who if outcome == "approved" else [],
        "denied_by": who if outcome == "denied" else [],
    }
    said = f"approval gate closed (its tally is recorded): {outcome} by {', '.join(who)}, as the tally says"
    assert row["reason"] == said
    text = _bide("pending", "--store", f"sqlite:///{db}", cwd=tmp_path)
    assert "has 0" not in text.stdout and "bide approve|deny" not in text.stdout, text.stdout
    assert "run the agent again" in text.stdout
    later = _bide("approve", "--store", f"sqlite:///{db}", "x", "c0.0", "--key", "bob.key", cwd=tmp_path)
    assert later.returncode == 5 and "is closed" in later.stderr


def test_pending_lists_every_call_of_a_run_waiting_at_a_gate_beside_a_closed_one(tmp_path: Path) -> None:
    """Two gated calls of one turn: the first's gate closed (its driver killed after the tally), the
    second's open. `bide pending` listed the run's first paused call alone, so it said the run waited for
    nobody while the second call waited for both approvers, and dropped the line telling them to decide."""
    db = _paused_at_a_gate(tmp_path, "x", amounts=(1, 2))
    for name in ("alice", "bob"):
        url = f"sqlite:///{db}"
        done = _bide("approve", "--store", url, "x", "c0.0", "--key", f"{name}.key", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    script = tmp_path / "drive.py"
    script.write_text(_KILLED_AFTER_THE_TALLY)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    killed = subprocess.run([sys.executable, str(script), str(tmp_path), "approve", "2"], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": path}, timeout=120)
    assert killed.returncode == -9, killed.stderr
    listing = _bide("pending", "--store", f"sqlite:///{db}", "--json", cwd=tmp_path)
    rows = {row["call_id"]: row for row in json.loads(listing.stdout)}
    assert sorted(rows) == ["c0.0", "c0.1"], rows
    assert rows["c0.0"]["decided"]["outcome"] == "approved" and rows["c0.1"]["decided"] is None
    assert rows["c0.1"]["approval"]["waiting_for"] == ["alice", "bob"]
    assert rows["c0.1"]["arguments"] == {"amount": 2}
    text = _bide("pending", "--store", f"sqlite:///{db}", cwd=tmp_path).stdout
    assert "bide approve|deny" in text and "waiting for alice, bob" in text, text


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_pending_says_a_call_whose_approvers_said_enough_waits_for_a_drive(
    tmp_path: Path, decision: str
) -> None:
    """Both approvals of a 2-of-2 gate in (or one denial, which leaves 2 out of reach), no drive since to
    count them: `bide pending` said "waiting for " with nobody after it, and told approvers to decide. It
    says the decisions are enough and the agent must run again; `bide approve` says so after the decision
    that made it enough."""
    db = _paused_at_a_gate(tmp_path, "x")
    said = None
    for name in ("alice", "bob"):
        key = f"{name}.key"
        said = _bide(decision, "--store", f"sqlite:///{db}", "x", "c0.0", "--key", key, cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        if decision == "deny":
            break
    outcome = "approved" if decision == "approve" else "denied"
    assert said is not None and f"that is enough: the gate will count the call {outcome}" in said.stdout
    assert "waiting for" not in said.stdout, said.stdout  # (bob had not spoken on a denial)
    listing = _bide("pending", "--store", f"sqlite:///{db}", "--json", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    [row] = json.loads(listing.stdout)
    assert row["decided"] is None and row["approval"]["outcome"] == outcome
    text = _bide("pending", "--store", f"sqlite:///{db}", cwd=tmp_path).stdout
    assert "waiting for \n" not in text and "waiting for  " not in text, text
    assert "bide approve|deny" not in text, text
    assert f"enough to be {outcome}" in " ".join(text.split()), text
    assert "run the agent again" in " ".join(text.split()), text
