"""verify-approvals proves the call that ran is the call approved, and whose approval counts (pinning).

The forger here holds the log key: every package is re-signed, so hashes and heads all check out and only
the binding of records to the approval (or the auditor's pins) can tell. Verification runs through the
`bide-audit` command in a subprocess, as an auditor would run it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import bide
from bide.approvals import (
    ApprovalGate,
    ApprovalTrust,
    UntrustedPolicy,
    pending_approvals,
    submit_decision,
    verify_approvals,
)
from bide.audit import NotVerified, SigningKey
from bide.testing import Call, ScriptedModel, Turn, reply

from .helpers import APPROVERS, LOG_KEY, approved_run, audit_cli, evidence, records, rewrite

pytestmark = pytest.mark.slow


def _verify(tmp_path: Path, store: Any, *extra: str) -> tuple[int, dict[str, Any]]:
    (tmp_path / "evidence.json").write_bytes(evidence(store).to_json())
    done = audit_cli("verify-approvals", "evidence.json", "--pubkey", LOG_KEY.public.hex, "--json", *extra,
                     cwd=tmp_path)
    out: dict[str, Any] = json.loads(done.stdout)
    assert out["exit_code"] == done.returncode, done
    return done.returncode, out


@pytest.fixture(scope="module")
def run() -> tuple[Any, str]:
    return approved_run()


def test_an_attempt_with_other_arguments_than_approved_is_forgery(tmp_path: Path, run: Any) -> None:
    store, call_id = run

    def mallory(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key.startswith(f"attempt:{call_id}:"):
            rec["arguments"] = {"amount": 1000000, "to": "mallory"}
        return rec

    code, out = _verify(tmp_path, rewrite(store, mallory))
    assert code == 1 and out["result"] == "not_verified"
    assert "do not hash to the approved digest" in out["message"]
    assert "approved by" not in out["message"]


@pytest.mark.parametrize(
    "what",
    ["attempt tool", "result tool", "model call tool", "result approval", "attempt kind", "pause tool"],
)
def test_every_record_of_the_call_must_name_the_approved_call(tmp_path: Path, run: Any, what: str) -> None:
    store, call_id = run

    def change(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if what == "attempt tool" and key.startswith("attempt:"):
            rec["tool"] = "refund"
        elif what == "attempt kind" and key.startswith("attempt:"):
            rec["kind"] = "note"
        elif what == "result tool" and key == f"result:{call_id}":
            rec["tool"] = "refund"
        elif what == "result approval" and key == f"result:{call_id}":
            rec["approval"] = None
        elif what == "pause tool" and key == f"pause:{call_id}":
            rec["tool"] = "refund"
        elif what == "model call tool" and key == "model:0":
            rec["message"]["tool_calls"][0]["name"] = "refund"
        return rec

    code, out = _verify(tmp_path, rewrite(store, change))
    assert code == 1, out


def test_an_honest_package_proves_the_executed_call_and_names_keys(tmp_path: Path, run: Any) -> None:
    store, call_id = run
    code, out = _verify(tmp_path, store)
    assert code == 0, out
    assert out["complete"] is True and out["executed_calls_proven"] is True and out["pinned"] is False
    [gate] = out["calls"]
    assert gate["call_id"] == call_id and gate["executed_call_proven"] and gate["model_arguments_match"]
    alice, carol = APPROVERS["alice"].public.key_id, APPROVERS["carol"].public.key_id
    assert gate["counted"] == [{"name": "alice", "key_id": alice}, {"name": "carol", "key_id": carol}]
    assert f"alice ({alice}), carol ({carol})" in out["message"]
    assert gate["policy_digest"] in out["message"] and "before the tool ran" in out["message"]
    assert "pin it with --policy-digest" in out["not_proven"]


def test_a_package_without_the_attempt_and_result_proves_less_and_says_so(tmp_path: Path, run: Any) -> None:
    store, call_id = run
    pkg = evidence(store)
    keep = [r for r in pkg.records if b'"kind":"attempt"' not in r.record and b'"kind":"tool_result"'
            not in r.record]
    (tmp_path / "partial.json").write_bytes(pkg.model_copy(update={"records": keep}).to_json())
    pub = LOG_KEY.public.hex
    done = audit_cli("verify-approvals", "partial.json", "--pubkey", pub, "--json", cwd=tmp_path)
    out = json.loads(done.stdout)
    assert done.returncode == 0, out
    assert out["complete"] is False and out["executed_calls_proven"] is False
    assert out["calls"][0]["executed_call_proven"] is False and out["calls"][0]["attempts"] == []
    assert "before the tool ran" not in out["message"]
    assert "what ran is not proven" in out["message"]
    assert f"what call {call_id!r} ran with: the package is partial" in out["not_proven"]
    text = audit_cli("verify-approvals", "partial.json", "--pubkey", LOG_KEY.public.hex, cwd=tmp_path)
    assert text.returncode == 0 and "before the tool ran" not in text.stdout
    assert "Not proven: what call" in text.stdout
    ev = audit_cli("verify-evidence", "partial.json", "--pubkey", LOG_KEY.public.hex, "--json", cwd=tmp_path)
    assert ev.returncode == 0 and json.loads(ev.stdout)["complete"] is False
    (tmp_path / "full.json").write_bytes(pkg.to_json())
    full = audit_cli("verify-evidence", "full.json", "--pubkey", LOG_KEY.public.hex, "--json", cwd=tmp_path)
    assert full.returncode == 0 and json.loads(full.stdout)["complete"] is True


def test_a_tool_safe_to_retry_is_bound_through_the_model_call(tmp_path: Path) -> None:
    import bide

    store, _ = approved_run(safety=bide.Idempotent, run_id="r")
    code, out = _verify(tmp_path, store)
    assert code == 0 and out["executed_calls_proven"], out
    assert out["calls"][0]["attempts"] == [] and out["calls"][0]["results"]

    def other(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key == "model:0":
            rec["message"]["tool_calls"][0]["arguments"] = {"amount": 1000000, "to": "mallory"}
        return rec

    code, out = _verify(tmp_path, rewrite(store, other))
    assert code == 0 and out["executed_calls_proven"] is False, out
    assert "does not carry the approved arguments" in out["not_proven"]


# -- pinning -------------------------------------------------------------------------------------------


def test_pinned_policy_digest_approvers_need_and_policy_file(tmp_path: Path, run: Any) -> None:
    store, _ = run
    _, honest = _verify(tmp_path, store)
    digest = honest["calls"][0]["policy_digest"]
    pins = [f"{n}={k.public.hex}" for n, k in APPROVERS.items()]
    code, out = _verify(tmp_path, store, "--policy-digest", digest)
    assert code == 0 and out["pinned"] is True and "under a policy you pinned" in out["message"]
    assert _verify(tmp_path, store, *[a for p in pins for a in ("--approver", p)], "--need", "2")[0] == 0
    code, out = _verify(tmp_path, store, "--policy-digest", "ab" * 32)
    assert (code, out["result"]) == (5, "untrusted_policy") and digest in out["message"]
    assert _verify(tmp_path, store, "--approver", pins[0], "--approver", pins[1])[0] == 5
    assert _verify(tmp_path, store, *[a for p in pins for a in ("--approver", p)], "--need", "1")[0] == 5
    policy = {"need": 2, "approvers": [{"name": n, "public_key": k.public.hex} for n, k in APPROVERS.items()]}
    (tmp_path / "policy.json").write_text(json.dumps(policy))
    assert _verify(tmp_path, store, "--policy", "policy.json")[0] == 0
    (tmp_path / "lax.json").write_text(json.dumps({**policy, "need": 1}))
    assert _verify(tmp_path, store, "--policy", "lax.json")[0] == 5
    code, out = _verify(tmp_path, store, "--policy-digest", "xyz")
    assert code == 2, out


def test_the_log_key_holder_cannot_gate_a_run_with_their_own_approvers(tmp_path: Path) -> None:
    """Keys named alice, bob and carol, held by the operator: the recount matches, the pins do not."""
    impostors = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
    store, _ = approved_run(impostors)
    pins = [a for n, k in APPROVERS.items() for a in ("--approver", f"{n}={k.public.hex}")]
    assert _verify(tmp_path, store)[0] == 0  # without pins it checks out: the policy is the package's
    code, out = _verify(tmp_path, store, *pins)
    assert code == 5 and "not the ones you pinned" in out["message"]
    pkg = evidence(store)
    with pytest.raises(UntrustedPolicy):
        verify_approvals(pkg, LOG_KEY.public, trust=ApprovalTrust.of(approvers=dict(
            (n, k.public) for n, k in APPROVERS.items())))
    assert issubclass(UntrustedPolicy, NotVerified)  # a library caller catching NotVerified fails closed


def test_forgery_beside_an_untrusted_policy_reports_forgery(tmp_path: Path) -> None:
    impostors = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
    store, call_id = approved_run(impostors)

    def mallory(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key.startswith(f"attempt:{call_id}:"):
            rec["arguments"]["amount"] = 7
        return rec

    pins = [a for n, k in APPROVERS.items() for a in ("--approver", f"{n}={k.public.hex}")]
    assert _verify(tmp_path, rewrite(store, mallory), *pins)[0] == 1



@pytest.mark.parametrize(
    "pins",
    [
        pytest.param(["--approver", "carol=missing.pub", "--approver", "alice=@a"], id="key-missing-first"),
        pytest.param(["--approver", "alice=@a", "--approver", "carol=missing.pub"], id="key-missing-last"),
        pytest.param(["--policy", "missing.json", "--need", "2"], id="policy-missing"),
        pytest.param(["--need", "2", "--policy", "truncated.json"], id="policy-truncated"),
        pytest.param(["--pubkey", "missing.pub", "--need", "2"], id="log-key-missing"),
    ],
)
def test_an_unreadable_pin_never_hides_a_forgery(tmp_path: Path, run: Any, pins: list[str]) -> None:
    """Exit 1 when the package is forged, whichever pin is unreadable; exit 4 naming it when it is not."""
    store, call_id = run
    (tmp_path / "truncated.json").write_text('{"need":2,"approvers":[')
    pins = [a.replace("@a", APPROVERS["alice"].public.hex) for a in pins]
    key = [] if "--pubkey" in pins else ["--pubkey", LOG_KEY.public.hex]

    def mallory(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key.startswith(f"attempt:{call_id}:"):
            rec["arguments"]["amount"] = 7
        return rec

    (tmp_path / "forged.json").write_bytes(evidence(rewrite(store, mallory)).to_json())
    (tmp_path / "genuine.json").write_bytes(evidence(store).to_json())
    done = audit_cli("verify-approvals", "forged.json", *key, *pins, "--json", cwd=tmp_path)
    out = json.loads(done.stdout)
    assert (done.returncode, out["result"]) == (1, "not_verified"), done
    assert "do not hash to the approved digest" in out["message"]
    done = audit_cli("verify-approvals", "genuine.json", *key, *pins, "--json", cwd=tmp_path)
    out = json.loads(done.stdout)
    assert (done.returncode, out["result"]) == (4, "unusable_input"), done
    unreadable = next(a for a in pins if "missing" in a or "truncated" in a).rpartition("=")[2]
    assert unreadable in out["message"] and "shows no forgery" in out["message"], out
    # The package itself unreadable, with every pin readable: exit 4 naming the package.
    done = audit_cli("verify-approvals", "nothing.json", "--need", "2", "--json", cwd=tmp_path)
    assert done.returncode == 4 and "nothing.json" in json.loads(done.stdout)["message"], done


def _eleven_call_run() -> bide.MemoryStore:
    """One model turn makes 11 calls (c0.0 .. c0.10); c0.1 and c0.10 go to a gated tool, both approved."""
    alice = APPROVERS["alice"]
    gate = ApprovalGate.single("alice", alice.public)

    @bide.tool(gate=gate)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        return f"sent {amount} to {to}"

    @bide.tool
    def look(n: int) -> str:
        """Look something up."""
        return f"looked {n}"

    calls = tuple(
        Call("wire", {"amount": 100 + i, "to": "acme"}) if i in (1, 10) else Call("look", {"n": i})
        for i in range(11)
    )
    store = bide.MemoryStore()
    for _ in range(3):
        agent = bide.Agent(ScriptedModel([Turn(calls=calls), reply("done")]), store=store, tools=[wire, look])
        try:
            assert agent.run_sync("r", "go").answer == "done"
            return store
        except bide.ApprovalPending:
            for c in ("c0.1", "c0.10"):
                if any(p.call_id == c for p in pending_approvals(store, prefix="r")):
                    submit_decision(store, "r", c, alice, approve=True)
    raise AssertionError("the run did not complete")


def test_a_call_id_that_starts_with_another_is_not_taken_for_it() -> None:
    # c0.1 owns pause:c0.1, attempt:c0.1:<gen>, result:c0.1; never pause:c0.10 or attempt:c0.10:<gen>.
    store = _eleven_call_run()
    keys = [k for k, _ in records(store)]
    assert "pause:c0.10" in keys and "result:c0.10" in keys
    pkg = evidence(store)
    for c in ("c0.1", "c0.10"):
        facts = verify_approvals(pkg, LOG_KEY.public, call_id=c).facts
        assert facts["calls"][0]["call_id"] == c and facts["executed_calls_proven"] is True
    assert verify_approvals(pkg, LOG_KEY.public).facts["executed_calls_proven"] is True

    # Exact matching still binds each call's own records: a pause of c0.10 naming another tool is forgery.
    def mallory(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key == "pause:c0.10":
            rec["tool"] = "look"
        return rec

    with pytest.raises(NotVerified, match=r"pause record of call 'c0\.10'"):
        verify_approvals(evidence(rewrite(store, mallory)), LOG_KEY.public, call_id="c0.10")
    verify_approvals(evidence(rewrite(store, mallory)), LOG_KEY.public, call_id="c0.1")
