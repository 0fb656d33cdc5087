"""A 2-of-3 gate end to end, across processes: pause, signed decisions through `bide approve|deny`, resume
in a new process, evidence verified by `bide-audit` in a subprocess; and tampering that recount catches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.approvals import ApprovalGate, ApprovalRecordsInvalid, submit_decision, verify_approvals
from bide.approvals._tally import tally_key
from bide.audit import AuditLog, NotVerified, SigningKey, generate_key, load_public_key

pytestmark = pytest.mark.slow

DRIVER = r'''
import json, sys
from pathlib import Path
import bide
from bide.approvals import ApprovalGate
from bide.audit import load_public_key
from bide.testing import ScriptedModel, call, reply

store_url, keydir, run_id, fired = sys.argv[1:5]
names = ("alice", "bob", "carol")
gate = ApprovalGate.k_of_n(2, {n: load_public_key(f"{keydir}/{n}.key.pub") for n in names})

@bide.tool(gate=gate)
def pay(amount: int) -> str:
    """Pay someone."""
    with open(fired, "a") as f:
        f.write(f"{amount}\n")
    return f"paid {amount}"

def answer(request):
    last = request.messages[-1]
    return reply(f"tool said: {last.content}")

store = bide.open_store(store_url)
agent = bide.Agent(ScriptedModel([call("pay", amount=5), answer]), store=store, tools=[pay])
try:
    result = agent.run_sync(run_id, "pay five")
    print(json.dumps({"status": "completed", "answer": result.answer}))
except bide.ApprovalPending as exc:
    print(json.dumps({"status": exc.status, "call_id": exc.call_id, "reason": exc.reason}))
finally:
    store.close()
'''


def _py(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    keydir = tmp_path / "keys"
    keydir.mkdir()
    for name in ("alice", "bob", "carol", "log"):
        generate_key(keydir / f"{name}.key")
    (tmp_path / "driver.py").write_text(DRIVER)
    return {
        "dir": tmp_path,
        "keys": keydir,
        "url": f"sqlite:///{tmp_path / 'runs.db'}",
        "fired": tmp_path / "fired.txt",
    }


def _drive(w: dict[str, Any], run_id: str) -> dict[str, Any]:
    p = _py("driver.py", w["url"], str(w["keys"]), run_id, str(w["fired"]), cwd=w["dir"])
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def _bide(w: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return _py("-m", "bide._cli", *args, cwd=w["dir"])


def _audit(w: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return _py("-m", "bide.audit._cli", *args, cwd=w["dir"])


def test_two_of_three_with_a_deny_resumes_after_restart_and_verifies(world: dict[str, Any]) -> None:
    w = world
    first = _drive(w, "order-1")
    assert first["status"] == "awaiting_approval" and "2 of 3" in first["reason"]
    call_id = first["call_id"]
    pending = _bide(w, "pending", "--store", w["url"], "--json")
    assert pending.returncode == 0, pending.stderr
    [waiting] = json.loads(pending.stdout)
    assert (waiting["run_id"], waiting["call_id"], waiting["approval"]["need"]) == ("order-1", call_id, 2)
    assert waiting["approval"]["waiting_for"] == ["alice", "bob", "carol"]
    assert waiting["arguments"] == {"amount": 5}  # approvers see what they sign

    deny = _bide(w, "deny", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "bob.key"))
    assert deny.returncode == 0, deny.stderr
    again = _bide(w, "approve", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "bob.key"))
    assert again.returncode == 5 and "already decided" in again.stderr
    stranger = _bide(
        w, "approve", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "log.key")
    )
    assert stranger.returncode == 5 and "not the key of any approver" in stranger.stderr
    nocall = _bide(
        w, "approve", "--store", w["url"], "order-1", "c9.9", "--key", str(w["keys"] / "alice.key")
    )
    assert nocall.returncode == 4
    # A key file that is not there is a missing input (4); one that holds no key is a usage error (2),
    # however large (one over the 64 KiB a key file may hold was exit 4, as if it were not there).
    (w["dir"] / "not-a-key").write_text("not a key\n")
    (w["dir"] / "huge-not-a-key").write_bytes(b"x" * 70_000)
    nokey, badkey, hugekey = (
        _bide(w, "approve", "--store", w["url"], "order-1", call_id, "--key", name)
        for name in ("alice.key", "not-a-key", "huge-not-a-key")
    )
    assert nokey.returncode == 4 and "alice.key" in nokey.stderr, nokey.stderr
    assert badkey.returncode == 2 and "not an unencrypted PEM private key" in badkey.stderr, badkey.stderr
    assert hugekey.returncode == 2 and "larger than 65,536 bytes" in hugekey.stderr, hugekey.stderr
    ok = _bide(w, "approve", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "alice.key"))
    assert ok.returncode == 0, ok.stderr

    # a new process, a new Agent object, the same SQLite file: still one approval short
    second = _drive(w, "order-1")
    assert second["status"] == "awaiting_approval" and "waiting for carol" in second["reason"]
    assert not w["fired"].exists()

    ok = _bide(w, "approve", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "carol.key"))
    assert ok.returncode == 0, ok.stderr
    done = _drive(w, "order-1")
    assert done == {"status": "completed", "answer": "tool said: paid 5"}
    assert w["fired"].read_text() == "5\n"
    closed = _bide(w, "deny", "--store", w["url"], "order-1", call_id, "--key", str(w["keys"] / "carol.key"))
    assert closed.returncode == 5 and "closed" in closed.stderr
    assert _drive(w, "order-1")["status"] == "completed" and w["fired"].read_text() == "5\n"

    exp = _audit(
        w,
        "export",
        "--store",
        w["url"],
        "--run",
        "order-1",
        "-o",
        "evidence.json",
        "--key",
        str(w["keys"] / "log.key"),
    )
    assert exp.returncode == 0, exp.stderr
    pub = str(w["keys"] / "log.key.pub")
    ev = _audit(w, "verify-evidence", "evidence.json", "--pubkey", pub)
    assert ev.returncode == 0, ev.stderr
    assert "all of its records" in ev.stdout and "Not proven" in ev.stdout
    ap = _audit(w, "verify-approvals", "evidence.json", "--pubkey", pub)
    assert ap.returncode == 0, ap.stderr
    alice, carol = (load_public_key(str(w["keys"] / f"{n}.key.pub")).key_id for n in ("alice", "carol"))
    assert f"approved by alice ({alice}), carol ({carol}) under the 2-of-3 policy" in ap.stdout
    assert "before the tool ran" in ap.stdout and "pin it with --policy-digest" in ap.stdout
    assert _audit(w, "verify-approvals", "evidence.json").returncode == 0  # hashes only, says so
    wrong = _audit(w, "verify-approvals", "evidence.json", "--pubkey", str(w["keys"] / "bob.key.pub"))
    assert wrong.returncode == 1


def test_denial_is_final_and_the_model_is_told(world: dict[str, Any]) -> None:
    w = world
    call_id = _drive(w, "order-2")["call_id"]
    for name in ("alice", "carol"):
        r = _bide(w, "deny", "--store", w["url"], "order-2", call_id, "--key", str(w["keys"] / f"{name}.key"))
        assert r.returncode == 0, r.stderr
    done = _drive(w, "order-2")
    assert done["status"] == "completed"
    assert "tool call denied" in done["answer"] and "alice, carol" in done["answer"]
    assert not w["fired"].exists()
    store = bide.open_store(w["url"])
    try:
        key = SigningKey.generate()
        pkg = AuditLog(store, key).evidence("order-2")
        v = verify_approvals(pkg, key.public)
        assert "was denied by alice (" in v.proven and "carol (" in v.proven
        assert v.facts["calls"][0]["outcome"] == "denied" and v.facts["executed_calls_proven"]
    finally:
        store.close()


# -- tampering an operator could try, caught by the offline recount --------------------------------------


def _gated_run(
    store: bide.Store, keys: dict[str, SigningKey], decide: dict[str, bool]
) -> tuple[ApprovalGate, str]:
    from bide.testing import ScriptedModel, call, reply

    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in keys.items()})

    @bide.tool(gate=gate)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    def agent() -> bide.Agent:
        return bide.Agent(ScriptedModel([call("pay", amount=1), reply("ok")]), store=store, tools=[pay])

    with pytest.raises(bide.ApprovalPending) as exc:
        agent().run_sync("r", "go")
    for name, approve in decide.items():
        submit_decision(store, "r", exc.value.call_id, keys[name], approve=approve)
    agent().run_sync("r", "go")
    return gate, exc.value.call_id


def _forge(store: bide.Store, replace: dict[str, Any]) -> bide.MemoryStore:
    """Copy a run into a new store, replacing the data of some gate records (an operator rewriting history
    and re-signing: the hashes all match, only the recount can tell)."""
    forged = bide.MemoryStore()
    for e in store.load("r"):
        data = e.data
        if e.key in replace:
            rec = json.loads(data)
            rec["data"] = replace[e.key](rec["data"])
            data = bide.canonical_json(rec)
        if e.key not in replace or replace[e.key] is not None:
            forged.insert_many("r", [(e.key, data)])
    return forged


KEYS3 = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}


def test_recount_catches_a_forged_tally_an_omitted_decision_and_a_changed_policy() -> None:
    store = bide.MemoryStore()
    _, call_id = _gated_run(store, KEYS3, {"bob": False, "alice": True, "carol": True})
    log_key = SigningKey.generate()
    honest = AuditLog(store, log_key).evidence("r")
    assert verify_approvals(honest, log_key.public).proven
    tkey = tally_key(call_id)
    entries = {e.key: json.loads(e.data) for e in store.load("r")}
    bob_key = next(k for k in entries if k.startswith(f"approval:decision:{call_id}:bob:"))

    # 1. the tally claims bob approved too
    forged = _forge(store, {tkey: lambda d: {**d, "approved_by": ["alice", "bob", "carol"], "denied_by": []}})
    with pytest.raises(NotVerified, match="recount"):
        verify_approvals(AuditLog(forged, log_key).evidence("r"), log_key.public)

    # 2. bob's denial is dropped from the tally's record list (the outcome would be the same)
    forged = _forge(
        store, {tkey: lambda d: {**d, "records": [k for k in d["records"] if k != bob_key], "denied_by": []}}
    )
    with pytest.raises(NotVerified, match="omitted decision"):
        verify_approvals(AuditLog(forged, log_key).evidence("r"), log_key.public)

    # 3. the package omits a decision the tally names
    pkg = AuditLog(store, log_key).evidence("r")
    idx = next(i for i, r in enumerate(pkg.records) if bob_key.encode() in r.record)
    partial = pkg.model_copy(update={"records": [r for i, r in enumerate(pkg.records) if i != idx]})
    with pytest.raises(NotVerified, match="omitted decision"):
        verify_approvals(partial, log_key.public)

    # 4. the policy is changed after the fact (need lowered to 1 in the tally)
    forged = _forge(store, {tkey: lambda d: {**d, "need": 1}})
    with pytest.raises(NotVerified, match="another policy"):
        verify_approvals(AuditLog(forged, log_key).evidence("r"), log_key.public)

    # 5. the request's policy is swapped for a laxer one (a different approver set)
    rkey = next(k for k in entries if k.startswith(f"approval:request:{call_id}:"))
    mallory = SigningKey.generate()
    forged = _forge(
        store,
        {
            rkey: lambda d: {
                **d,
                "policy": {
                    "need": 2,
                    "approvers": [
                        *d["policy"]["approvers"][:2],
                        {"name": "carol", "public_key": mallory.public.hex},
                    ],
                },
            }
        },
    )
    with pytest.raises(NotVerified, match="policy"):
        verify_approvals(AuditLog(forged, log_key).evidence("r"), log_key.public)

    # 6. the request shows approvers other arguments than the ones whose digest they signed
    forged = _forge(store, {rkey: lambda d: {**d, "arguments": {"amount": 1000}}})
    with pytest.raises(NotVerified, match="arguments"):
        verify_approvals(AuditLog(forged, log_key).evidence("r"), log_key.public)


def test_one_of_one_gate_denial_and_a_policy_change_after_the_fact() -> None:
    from bide.testing import ScriptedModel, call, reply

    boss = SigningKey.generate()
    fired: list[int] = []

    def agent(gate: ApprovalGate, store: bide.Store) -> bide.Agent:
        @bide.tool(gate=gate)
        def pay(amount: int) -> str:
            """Pay."""
            fired.append(amount)
            return "paid"

        return bide.Agent(ScriptedModel([call("pay", amount=9), reply("ok")]), store=store, tools=[pay])

    store = bide.MemoryStore()
    single = ApprovalGate.single("boss", boss.public)
    with pytest.raises(bide.ApprovalPending) as exc:
        agent(single, store).run_sync("r", "go")
    submit_decision(store, "r", exc.value.call_id, boss, approve=False)
    assert agent(single, store).run_sync("r", "go").answer == "ok"
    assert fired == []
    # A gate acts on a tally only once it recounted it under its own policy: one whose code now names a
    # laxer policy refuses the tally (nothing runs), and the run, whose call has its result, is not touched.
    import asyncio

    lax = ApprovalGate.k_of_n(1, {"boss": boss.public, "intern": SigningKey.generate().public})
    args = {"amount": 9}
    request = bide.GateRequest(
        "r",
        exc.value.call_id,
        "pay",
        args,
        *bide.GateRequest.digest_of(args),
        bide.GateJournal(bide.Journal(store, "r").load()),
    )
    with pytest.raises(ApprovalRecordsInvalid, match="not this gate's 1-of-2 policy"):
        asyncio.run(lax.check(request))
    assert isinstance(asyncio.run(single.check(request)), bide.Denied)
    assert agent(lax, store).run_sync("r", "go").answer == "ok" and fired == []
    log_key = SigningKey.generate()
    v = verify_approvals(AuditLog(store, log_key).evidence("r"), log_key.public)
    assert f"was denied by boss ({boss.key_id}) under the 1-of-1 policy" in v.proven
