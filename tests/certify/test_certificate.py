"""Certificates in-process: determinism, what a check establishes, and forgeries a check must refuse.

A forger can always recompute the (unkeyed) digest, so every forgery below does; what must stop it is
the re-check of the claims, or the signature.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from govern import Registry
from govern.certificate._certificate import Certificate, assemble, check_certificate, compute_digest
from govern.certificate._encoding import canonical_json, encode_table
from govern.certificate._errors import CertificateInvalid, CertificateTooLarge, CertificateUnreadable
from govern.certificate._make import certificate_for, certify, tool_version
from govern.certificate._signing import generate_key_pair, load_private_key, load_public_key
from govern.model._space import Space
from govern.verify._tables import build_tables

from .conftest import DIVERGENT, lamp_registry, orders_registry


def forge(certificate: Certificate, mutate: Callable[[dict[str, Any]], None]) -> bytes:
    """The certificate with `mutate` applied to its document and the digest recomputed."""
    document = copy.deepcopy(certificate.document())
    document.pop("signature", None)
    mutate(document)
    document["digest"] = compute_digest(document)
    return canonical_json(document) + b"\n"


def test_certifying_twice_gives_identical_bytes() -> None:
    first = certify(orders_registry()).to_bytes()
    second = certify(orders_registry()).to_bytes()
    assert first == second
    assert first == canonical_json(json.loads(first)) + b"\n"


def test_a_certificate_checks_and_says_what_it_proves(orders_cert: Certificate) -> None:
    result = check_certificate(orders_cert.to_bytes())
    assert result.rules_checked
    assert result.signature is None
    statement = result.statement()
    assert "orders" in statement and orders_cert.digest in statement
    assert "rules as written" in statement
    assert "unsigned" in statement
    assert "Nothing more is claimed" in statement


def test_the_verdict_is_the_engines(orders_cert: Certificate) -> None:
    machine = orders_registry().build()
    report = machine.report
    verdict = orders_cert.model.verdict
    assert verdict.states == report.states == 48
    assert verdict.valid_states == report.valid_states
    assert verdict.max_repair_depth == report.max_repair_depth
    assert verdict.cc2 == report.cc2
    events = list(machine.events)
    checked = [[events[a], events[b]] for a, b in verdict.pairs_checked]
    assert checked == [list(p) for p in report.pairs_checked]
    not_idempotent = sorted(events[e] for e in verdict.not_idempotent)
    assert not_idempotent == sorted(d.events[0] for d in report.not_idempotent)
    assert [sorted([events[a], events[b]]) for a, b in verdict.causal_order_obligations] == sorted(
        sorted(d.events[:2]) for d in report.obligations)
    assert orders_cert.model.machine.model_dump(mode="json") == machine.rules()
    assert orders_cert.model.tool.version == tool_version()


def test_tables_are_the_machines(orders_cert: Certificate) -> None:
    tables = orders_registry().build().tables()
    assert np.array_equal(orders_cert.valid, tables.valid)
    assert np.array_equal(orders_cert.repair, tables.repair)
    assert np.array_equal(orders_cert.apply, tables.apply.reshape(-1))


def test_callable_rules_give_the_weaker_claim(lamp_cert: Certificate) -> None:
    assert not lamp_cert.has_rules
    assert lamp_cert.model.machine.events[0].guard is None
    result = check_certificate(lamp_cert.to_bytes())
    assert not result.rules_checked
    assert "not checked offline" in result.statement()


def test_signed_certificate_verifies_and_binds_the_key(orders_cert: Certificate, tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "ci")
    generate_key_pair(tmp_path / "other")
    signed = orders_cert.signed(load_private_key(tmp_path / "ci"))
    assert signed.digest == orders_cert.digest  # the signature is outside the digest
    result = check_certificate(signed.to_bytes(), public_key=load_public_key(tmp_path / "ci.pub"))
    assert result.signature is not None and result.signature.key_id == signed.model.signature.key_id  # type: ignore[union-attr]
    with pytest.raises(CertificateInvalid, match="not by the key given"):
        check_certificate(signed.to_bytes(), public_key=load_public_key(tmp_path / "other.pub"))
    with pytest.raises(CertificateInvalid, match="not signed"):
        check_certificate(orders_cert.to_bytes(), require_signature=True)
    with pytest.raises(CertificateInvalid, match="not signed"):
        check_certificate(orders_cert.to_bytes(), public_key=load_public_key(tmp_path / "ci.pub"))


def test_forged_signatures_are_rejected(orders_cert: Certificate, tmp_path: Path) -> None:
    generate_key_pair(tmp_path / "ci")
    generate_key_pair(tmp_path / "mallory")
    signed = orders_cert.signed(load_private_key(tmp_path / "ci"))
    mallory = orders_cert.signed(load_private_key(tmp_path / "mallory"))
    genuine = signed.document()

    def variant(**changes: str) -> bytes:
        document = copy.deepcopy(genuine)
        document["signature"].update(changes)
        return canonical_json(document) + b"\n"

    mallory_block = mallory.document()["signature"]
    cases = {
        # Mallory's signature under the CI key's name.
        "value": variant(value=mallory_block["value"]),
        # The CI key's id with Mallory's public key and signature.
        "public_key": variant(public_key=mallory_block["public_key"], value=mallory_block["value"]),
        # Back-dated.
        "signed_at": variant(signed_at="2020-01-01T00:00:00Z"),
    }
    for name, data in cases.items():
        with pytest.raises(CertificateInvalid):
            check_certificate(data)
        with pytest.raises(CertificateInvalid):
            check_certificate(data, public_key=load_public_key(tmp_path / "ci.pub"))
        assert data != signed.to_bytes(), name
    # A signature moved onto another machine's certificate.
    other = certify(lamp_registry()).document() | {"signature": genuine["signature"]}
    with pytest.raises(CertificateInvalid, match="does not verify"):
        check_certificate(canonical_json(other) + b"\n")
    # Mallory signs with her own key: valid as "signed by Mallory", refused when the CI key is required.
    data = mallory.to_bytes()
    check_certificate(data)
    with pytest.raises(CertificateInvalid, match="not by the key given"):
        check_certificate(data, public_key=load_public_key(tmp_path / "ci.pub"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cc2", True),
        ("max_repair_depth", 0),
        ("valid_states", 47),
        ("domain_states", 1),
        ("not_idempotent", []),
        ("causal_order_obligations", []),
        ("pairs_checked", [[0, 2]]),
        ("guarantee", "interleaved-repair"),
        ("pairs", "all"),
    ],
)
def test_a_false_verdict_is_rejected_even_with_a_fresh_digest(
    orders_cert: Certificate, field: str, value: Any
) -> None:
    assert orders_cert.model.verdict.model_dump()[field] != value

    def lie(document: dict[str, Any]) -> None:
        document["verdict"][field] = value

    with pytest.raises(CertificateInvalid):
        check_certificate(forge(orders_cert, lie))


def test_tables_swapped_from_another_machine_are_rejected(orders_cert: Certificate) -> None:
    # Same shape (48 states, 3 events), different behaviour: the orders machine without its invariant.
    registry = orders_registry()
    other = Registry("orders")
    status = other.enum("status", ["pending", "paid", "shipped", "cancelled"])
    paid = other.bool("paid")
    stock = other.int("stock", 0, 5)
    other.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
    other.event("ship", guard=status == "paid", effect={status: "shipped"})
    other.event("restock", guard=stock < 5, effect={stock: stock + 1})
    other.independent("pay", "restock")
    other.independent("ship", "restock")
    other_cert = certify(other)
    assert registry.name == other_cert.name

    def swap(document: dict[str, Any]) -> None:
        document["tables"] = other_cert.document()["tables"]

    with pytest.raises(CertificateInvalid):
        check_certificate(forge(orders_cert, swap))

    # Only the apply table, from a machine whose ship cancels instead: the tables still converge and
    # give the same verdict, so only re-deriving the tables from the rules can notice.
    third = Registry("orders")
    status = third.enum("status", ["pending", "paid", "shipped", "cancelled"])
    paid = third.bool("paid")
    stock = third.int("stock", 0, 5)
    third.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
    third.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
    third.event("ship", guard=status == "paid", effect={status: "cancelled"})
    third.event("restock", guard=stock < 5, effect={stock: stock + 1})
    third.independent("pay", "restock")
    third.independent("ship", "restock")
    third_cert = certify(third)
    assert third_cert.model.verdict == orders_cert.model.verdict

    def swap_apply(document: dict[str, Any]) -> None:
        document["tables"]["apply"] = third_cert.document()["tables"]["apply"]

    with pytest.raises(CertificateInvalid, match="rules checker"):
        check_certificate(forge(orders_cert, swap_apply))


def test_edited_rules_are_caught_by_the_rules_checker(orders_cert: Certificate) -> None:
    # restock adds 2 instead of 1: tables and verdict untouched, so only re-deriving the tables from the
    # rules can notice.
    def edit(document: dict[str, Any]) -> None:
        plus_two = ["min", ["add", ["var", 2], ["lit", 2]], ["lit", 5]]
        document["machine"]["events"][2]["effect"] = [[2, plus_two]]

    with pytest.raises(CertificateInvalid, match="rules checker"):
        check_certificate(forge(orders_cert, edit))


def _raw_tables(source: str, name: str) -> tuple[dict[str, Any], Any]:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    snapshot = namespace[name].snapshot()
    space = Space(snapshot.vars)
    rules = snapshot.rules_json("valid")
    rules["initial"] = [v.lo for v in snapshot.vars]
    return rules, build_tables(snapshot, space)


_DIVERGENT_CLAIM = {
    "wfc": True, "cc1": True, "max_repair_depth": 0, "states": 2, "valid_states": 2, "domain": "valid",
    "domain_states": 2, "pairs": "all", "pairs_checked": [[0, 1]], "cc2": True,
    "causal_order_obligations": [], "not_idempotent": [], "guarantee": "interleaved-repair",
}


def forged_divergent_certificate() -> bytes:
    """A certificate for the non-convergent switch machine whose verdict says it converges."""
    rules, tables = _raw_tables(DIVERGENT, "switch")
    forged = assemble(machine=rules, verdict=_DIVERGENT_CLAIM, valid=tables.valid, repair=tables.repair,
                      apply=np.asarray(tables.apply).reshape(-1), oracle={}, version=tool_version())
    return forged.to_bytes()


def test_a_non_convergent_machine_edited_to_say_certified_is_rejected() -> None:
    with pytest.raises(CertificateInvalid, match="do not commute"):
        check_certificate(forged_divergent_certificate())
    rules, tables = _raw_tables(DIVERGENT, "switch")
    claim = dict(_DIVERGENT_CLAIM)
    # Declaring no pair at all does not help: every pair is then checked.
    rules_declared = rules | {"independent": []}
    claim_declared = claim | {"pairs": "declared", "pairs_checked": [], "causal_order_obligations": [[0, 1]]}
    honest = assemble(machine=rules_declared, verdict=claim_declared, valid=tables.valid,
                      repair=tables.repair,
                      apply=np.asarray(tables.apply).reshape(-1), oracle={}, version=tool_version())
    # With no pair declared independent the claim is true (and weak): it must name the obligation.
    result = check_certificate(honest.to_bytes())
    assert "turn_on/turn_off" in result.statement()
    hidden = forge(honest, lambda d: d["verdict"].update(causal_order_obligations=[]))
    with pytest.raises(CertificateInvalid, match="causal_order_obligations"):
        check_certificate(hidden)


def test_a_repair_cycle_is_rejected() -> None:
    # Two invalid states repairing into each other: WFC fails, whatever the verdict says.
    source = '''
from govern import Registry
loop = Registry("loop")
x = loop.int("x", 0, 2)
loop.event("noop", guard=x == 0, effect={x: 0})
'''
    rules, tables = _raw_tables(source, "loop")
    valid = np.array([1, 0, 0], dtype=np.uint8)
    repair = np.array([0, 2, 1], dtype=np.int32)
    rules["invariants"] = [{"name": "zero", "holds": ["eq", ["var", 0], ["lit", 0]],
                            "repair": [[0, ["ite", ["eq", ["var", 0], ["lit", 1]], ["lit", 2], ["lit", 1]]]]}]
    claim = {
        "wfc": True, "cc1": True, "max_repair_depth": 1, "states": 3, "valid_states": 1, "domain": "valid",
        "domain_states": 1, "pairs": "all", "pairs_checked": [], "cc2": True,
        "causal_order_obligations": [], "not_idempotent": [], "guarantee": "interleaved-repair",
    }
    forged = assemble(machine=rules, verdict=claim, valid=valid, repair=repair,
                      apply=np.asarray(tables.apply).reshape(-1), oracle={}, version=tool_version())
    with pytest.raises(CertificateInvalid, match="WFC"):
        check_certificate(forged.to_bytes())


def test_structurally_wrong_documents_are_unreadable(orders_cert: Certificate) -> None:
    def mutations() -> list[Callable[[dict[str, Any]], None]]:
        return [
            lambda d: d.update(extra=1),
            lambda d: d["verdict"].update(surprise=True),
            lambda d: d["verdict"].update(max_repair_depth="1"),
            lambda d: d["verdict"].update(cc2=1),
            lambda d: d["machine"]["variables"][2].update(min=9),
            lambda d: d["machine"]["events"][0].update(guard=["frob", ["var", 0]]),
            lambda d: d["machine"]["events"][0].update(guard=["var", 7]),
            lambda d: d["machine"]["events"][0].update(guard=["eq", ["var", 0], ["lit", 2**70]]),
            lambda d: d["machine"]["events"][0].update(guard=["eq", ["var", 0]]),
            lambda d: d["machine"]["events"][0].update(effect=[[1, ["lit", 1]], [0, ["lit", 1]]]),
            lambda d: d["machine"].update(independent=[[2, 0]]),
            lambda d: d["machine"].update(initial=[0, 0]),
            lambda d: d["machine"].update(initial=[0, 0, 6]),
            lambda d: d["tables"].update(valid=encode_table(np.zeros(47), "u8")),
            lambda d: d["tables"].update(repair=d["tables"]["repair"][:-8] + "AAAAAAA="),
            lambda d: d.update(format="govern-certificate/2"),
            lambda d: d.update(signature=None),
            lambda d: d.pop("oracle"),
            lambda d: d["machine"]["variables"].append(
                {"name": "big", "kind": "int", "min": 0, "max": 10**9}),
        ]

    for mutate in mutations():
        with pytest.raises(CertificateUnreadable):
            check_certificate(forge(orders_cert, mutate))


def test_certificate_for_a_reachable_domain(tmp_path: Path) -> None:
    machine = orders_registry().build("reachable")
    certificate = certify(machine)
    assert certificate.model.machine.domain == "reachable"
    result = check_certificate(certificate.to_bytes())
    assert "reachable" in result.statement()
    assert certificate_for(machine).to_bytes() == certificate.to_bytes()


def test_document_json_is_the_file(orders_cert: Certificate) -> None:
    assert json.loads(orders_cert.to_bytes()) == orders_cert.document()


def test_a_machine_too_large_for_a_certificate_is_refused_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    import govern.certificate._make as making

    monkeypatch.setattr(making, "MAX_STATES", 47)
    with pytest.raises(CertificateTooLarge, match="48 states"):
        certify(orders_registry())
