"""Policies built to exhaust `verify-approvals` (thousands of keys, each checked to be strong at milliseconds
a key), a package signed at a head before the tool ran, and approver names holding '='."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import bide.audit._keys as keys_module
from bide import ConfigError
from bide.approvals import ApprovalTrust, UntrustedPolicy, verify_approvals
from bide.approvals import _verify as approvals_verify
from bide.approvals._policy import MAX_SEATS, ApprovalPolicy
from bide.audit import AuditLog, SigningKey
from bide.audit._errors import UnreadableInput

from .helpers import APPROVERS, LOG_KEY, approved_run, audit_cli, evidence, records, rewrite


def _trusted() -> ApprovalTrust:
    return ApprovalTrust.of(approvers={n: k.public for n, k in APPROVERS.items()}, need=2)


def _with_seats(seats: int) -> Any:
    """A package whose request lists `seats` made-up approvers (random bytes: none is even read as a key)."""
    store, _ = approved_run()
    policy = {
        "need": 2,
        "approvers": [{"name": f"a{i:05d}", "public_key": os.urandom(32).hex()} for i in range(seats)],
    }

    def change(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key.startswith("approval:request:"):
            rec["data"]["policy"] = policy
        return rec

    return evidence(rewrite(store, change))


def test_a_policy_of_more_seats_than_the_bound_is_refused_before_any_key_is_checked(tmp_path: Path) -> None:
    """10,000 seats (1.3 MB) took 70 s of CPU, 43 s with the policy pinned, before "not verified"."""
    with pytest.raises(UnreadableInput, match=f"a policy has at most {MAX_SEATS}"):
        verify_approvals(_with_seats(MAX_SEATS + 1), LOG_KEY.public)
    (tmp_path / "ev.json").write_bytes(_with_seats(5000).to_json())
    done = audit_cli("verify-approvals", "ev.json", "--pubkey", LOG_KEY.public.hex, cwd=tmp_path)
    assert done.returncode == 4 and "UNREADABLE INPUT" in done.stderr, done.stderr
    assert f"lists a policy of 5000 approvers; a policy has at most {MAX_SEATS}" in done.stderr


def _policies_read(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """`check_keys` of every policy read from now on."""
    read: list[bool] = []
    real = ApprovalPolicy.from_json

    def spy(value: Any, *, recorded: bool = False, check_keys: bool = True) -> ApprovalPolicy:
        read.append(check_keys)
        return real(value, recorded=recorded, check_keys=check_keys)

    monkeypatch.setattr(ApprovalPolicy, "from_json", spy)
    return read


def test_the_approver_names_of_a_package_are_bounded_before_any_policy_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A policy recorded by an older bide may hold names past today's 128 characters, so a made-up one could
    hold a name of millions: 2,000,000 x U+FDFA (8 MB) took 13 s and 350 MB to refuse, each name normalized
    several times. The names' characters are counted first, over the package's distinct policies."""
    store, _ = approved_run()
    bound = approvals_verify.MAX_PACKAGE_NAME_CHARS

    def change(key: str, rec: dict[str, Any]) -> dict[str, Any]:
        if key.startswith("approval:request:"):
            rec["data"]["policy"]["approvers"][0]["name"] += "\ufdfa" * bound
        return rec

    read = _policies_read(monkeypatch)
    with pytest.raises(UnreadableInput, match=f"more than {bound:,} characters of approver names"):
        verify_approvals(evidence(rewrite(store, change)), LOG_KEY.public)
    assert read == []
    verify_approvals(evidence(store), LOG_KEY.public)
    assert read == [False, True]  # once without its keys checked, once with (pins hold): not per gate


def test_a_policy_is_built_and_read_with_at_most_the_bound_of_seats() -> None:
    too_many = {"need": 1, "approvers": [{"name": f"a{i:05d}", "public_key": "00" * 32} for i in range(257)]}
    assert MAX_SEATS == 256
    with pytest.raises(ConfigError, match="at most 256 approvers, this one lists 257"):
        ApprovalPolicy.from_json(too_many, recorded=True)


def test_distinct_keys_across_a_package_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A policy of the most seats, rotated once to all new keys, stays well inside the bound.
    assert approvals_verify.MAX_PACKAGE_KEYS >= 2 * MAX_SEATS
    store, _ = approved_run()
    pkg = evidence(store)
    monkeypatch.setattr(approvals_verify, "MAX_PACKAGE_KEYS", 2)  # the package's policy names 3
    with pytest.raises(UnreadableInput, match="name more than 2 distinct approver keys"):
        verify_approvals(pkg, LOG_KEY.public)
    monkeypatch.setattr(approvals_verify, "MAX_PACKAGE_KEYS", 3)
    verify_approvals(pkg, LOG_KEY.public)


def _calls(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[bytes]:
    """The arguments `module.name` (a function of bytes) is called with from now on."""
    seen: list[bytes] = []
    real = getattr(module, name)

    def spy(data: bytes) -> Any:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(module, name, spy)
    return seen


def _checked_keys(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The keys checked to be strong from now on."""
    return _calls(monkeypatch, keys_module, "is_strong_public_key")


def test_pins_are_compared_before_the_keys_of_a_policy_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy the pins do not match is refused without checking its keys; a pinned one's are checked."""
    impostors = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
    theirs, ours = evidence(approved_run(approvers=impostors)[0]), evidence(approved_run()[0])
    trust = _trusted()
    their_keys = {k.public.raw for k in impostors.values()}
    our_keys = {k.public.raw for k in APPROVERS.values()}
    checked = _checked_keys(monkeypatch)
    with pytest.raises(UntrustedPolicy):
        verify_approvals(theirs, LOG_KEY.public, trust=trust)
    assert not their_keys & set(checked)
    verify_approvals(ours, LOG_KEY.public, trust=trust)
    assert our_keys <= set(checked)


def test_a_package_of_a_head_before_the_tool_ran_says_so_and_proves_no_executed_call() -> None:
    """It said "the tool has not run" and `executed_calls_proven: true` for a package signed at a head before
    the attempt, while the tool had run since; and dropped that the head may not be the latest."""
    store, call_id = approved_run()
    log = AuditLog(store, LOG_KEY)
    size = [key for key, _ in records(store)].index(f"attempt:{call_id}:0")
    package = log.evidence("r", log.sign_head("r", size=size))
    older = verify_approvals(package, LOG_KEY.public, trust=_trusted())
    assert older.facts["complete"] is True
    assert f"the tool had not run as of the signed head of size {size}" in older.proven
    assert "has not run" not in older.proven
    assert older.facts["executed_calls_proven"] is False
    assert older.facts["calls"][0]["executed_call_proven"] is False
    assert f"what call {call_id!r} runs with: it had not run as of the signed head of size {size}" in (
        older.not_proven
    )
    assert "that this head is the latest or was anchored" in older.not_proven
    latest = verify_approvals(evidence(store), LOG_KEY.public, trust=_trusted())
    assert latest.facts["executed_calls_proven"] is True and "before the tool ran" in latest.proven
    assert "that this head is the latest or was anchored" in latest.not_proven


def test_an_approver_name_holding_equals_is_refused_for_a_new_policy() -> None:
    """`--approver NAME=KEY` splits at the first '=': such a seat could be built but never pinned by name."""
    key = SigningKey.generate().public
    with pytest.raises(ConfigError, match="approver name 'ops=1' holds '='"):
        ApprovalPolicy.of(1, {"ops=1": key})
    recorded = ApprovalPolicy.from_json(
        {"need": 1, "approvers": [{"name": "ops=1", "public_key": key.hex}]}, recorded=True
    )
    assert recorded.names == ["ops=1"]  # an older bide's policy is still read
    with pytest.raises(UnreadableInput, match="pin its policy with --policy FILE or --policy-digest"):
        ApprovalTrust.of(approvers=[f"ops=1={key.hex}"])
    assert ApprovalTrust.of(approvers={"ops=1": key}).problem(recorded) is None


def test_a_policys_digests_hash_its_seats_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tally checks each decision against the policy's digests, which hashed every seat's name anew: a
    recorded name of 262,000 characters cost about 5 ms a decision, 3,000 made-up decisions 15 s."""
    from bide.approvals import _policy

    policy = ApprovalPolicy.from_json(
        {"need": 1, "approvers": [{"name": "alice", "public_key": APPROVERS["alice"].public.hex}]}
    )
    hashed = _calls(monkeypatch, _policy, "field")
    digests = {(policy.approvers_digest, policy.digest) for _ in range(100)}
    assert len(digests) == 1 and len(hashed) == 2  # the one seat's name and key, once


def test_a_policy_file_that_is_not_json_is_named_by_the_path_given(tmp_path: Path) -> None:
    """`--policy /dev/null` was called 'null' in the refusal, the file's last name alone."""
    from bide.approvals._trust import policy_from_file

    (tmp_path / "policy.json").write_text("{not json")
    for path in ("/dev/null", str(tmp_path / "policy.json")):
        with pytest.raises(UnreadableInput) as refused:
            policy_from_file(path)
        assert repr(path) in str(refused.value), str(refused.value)
