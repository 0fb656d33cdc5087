"""Composition: machines split into components with disjoint closed footprints (govern.verify._compose,
govern.machine._composed, govern.certificate._composed, rocq/theories/Compose.v).

Random composed machines are built both by components and whole (enumerated), and must agree on the
verdict, the report's figures, every table entry and every replay; machines where a shared reader or
invariant links two parts must not split; certificates round-trip through the CLI and a tampered
decomposition is refused by the extracted checker."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from govern_machines import Spec, specs
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import govern
from govern import GovernError, Registry, Var, implies, max_, min_
from govern.certificate._certificate import compute_digest
from govern.certificate._composed import ComposedCertificate, check_composed
from govern.certificate._encoding import canonical_json
from govern.machine._composed import ComposedMachine
from govern.verify._compose import decompose

ROOT = Path(__file__).resolve().parents[2]


def bookings(copies: int) -> Registry:
    """`copies` independent 32-state records (the benchmark's machine)."""
    reg = Registry("bookings")
    for i in range(copies):
        stage = reg.int(f"stage{i}", 0, 3)
        paid = reg.bool(f"paid{i}")
        seats = reg.int(f"seats{i}", 0, 3)
        reg.invariant(f"booked_paid{i}", holds=implies(stage >= 2, paid), repair={paid: True})
        reg.event(f"hold{i}", effect={stage: max_(stage, 1)})
        reg.event(f"book{i}", effect={stage: max_(stage, 2)})
        reg.event(f"close{i}", effect={stage: 3})
        reg.event(f"pay{i}", effect={paid: True})
        reg.event(f"seat{i}", effect={seats: min_(seats + 1, 3)})
    return reg


def combine(parts: list[Spec]) -> Registry:
    """The parts as one registry: variables, invariants and events interleaved round-robin (so the
    components' variables are not contiguous and invariant order crosses components)."""
    reg = Registry("composed")
    groups: list[list[Var]] = [[] for _ in parts]
    for j in range(max(len(p.vars) for p in parts)):
        for k, p in enumerate(parts):
            if j < len(p.vars):
                name, kind, lo, hi, labels = p.vars[j]
                if kind == "bool":
                    groups[k].append(reg.bool(f"c{k}{name}"))
                elif kind == "enum":
                    groups[k].append(reg.enum(f"c{k}{name}", list(labels)))
                else:
                    groups[k].append(reg.int(f"c{k}{name}", lo, hi))
    for j in range(max(len(p.invariants) for p in parts)):
        for k, p in enumerate(parts):
            if j < len(p.invariants):
                holds, repair = p.invariants[j]
                vs = groups[k]
                reg.invariant(f"c{k}inv{j}", holds=holds(vs), repair={vs[i]: val(vs) for i, val in repair})
    for j in range(max(len(p.events) for p in parts)):
        for k, p in enumerate(parts):
            if j < len(p.events):
                guard, effect = p.events[j]
                vs = groups[k]
                reg.event(f"c{k}ev{j}", guard=guard(vs), effect={vs[i]: val(vs) for i, val in effect})
    for k, p in enumerate(parts):
        for a, b in p.independent or []:
            reg.independent(f"c{k}ev{a}", f"c{k}ev{b}")
    return reg


def _build(reg: Registry, domain: str, compose: bool) -> govern.Machine | type[BaseException]:
    try:
        return reg.build(domain, compose=compose)  # type: ignore[arg-type]
    except GovernError as exc:
        return type(exc)


# Shrinking these nested machines takes minutes; a failure prints the drawn machine as it is.
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=[Phase.generate]
)
@given(parts=st.lists(specs(), min_size=2, max_size=3), data=st.data())
def test_composed_agrees_with_whole_enumeration(parts: list[Spec], data: st.DataObject) -> None:
    reg = combine(parts)
    snap = reg.snapshot()
    n = 1
    for v in snap.vars:
        n *= v.size
    assume(n <= 20_000)
    domain = parts[0].domain
    whole = _build(reg, domain, compose=False)
    composed = _build(reg, domain, compose=True)
    if not isinstance(whole, govern.Machine):
        # Refused both ways; when two components are each refused for a different reason, the two
        # builds may meet a different one first (a repair cycle here, a domain violation there).
        assert isinstance(composed, type) and issubclass(composed, GovernError), composed
        if not isinstance(composed, type) or composed is not whole:
            assert {composed, whole} <= {govern.NotConvergent, govern.DomainViolation, govern.RuleError}
        return
    assert isinstance(composed, govern.Machine), composed
    split = decompose(snap.rules_json(domain))  # type: ignore[arg-type]
    assert split is not None
    if isinstance(composed, ComposedMachine):
        assert len(composed.components) >= 2
    assert composed.n_states == whole.n_states
    assert composed.initial.id == whole.initial.id
    a, b = composed.report, whole.report
    assert (a.valid_states, a.domain_states, a.cc2, a.max_repair_depth) == (
        b.valid_states, b.domain_states, b.cc2, b.max_repair_depth,
    )
    assert sorted(d.events for d in a.obligations) == sorted(d.events for d in b.obligations)
    assert sorted(d.events for d in a.not_idempotent) == sorted(d.events for d in b.not_idempotent)
    # every table entry at some states, and the runtime
    ct, wt = composed.tables(), whole.tables()
    ids = data.draw(st.lists(st.integers(0, whole.n_states - 1), min_size=1, max_size=12))
    for s in ids:
        assert bool(ct.valid[s]) == bool(wt.valid[s])
        assert int(ct.repair[s]) == int(wt.repair[s])
        assert int(ct.nf[s]) == int(wt.nf[s])
        assert composed.in_domain(s) == whole.in_domain(s)
        for e in range(len(whole.events)):
            assert int(ct.apply[e, s]) == int(wt.apply[e, s])
            assert int(ct.step[e, s]) == int(wt.step[e, s])
    streams = data.draw(st.lists(st.lists(st.sampled_from(whole.events), max_size=8), min_size=1, max_size=4))
    assert [s.id for s in composed.replay_many(streams)] == [s.id for s in whole.replay_many(streams)]
    start = ids[0]
    assert composed.replay(streams[0], start) == whole.replay(streams[0], start)
    assert dict(composed.apply(start, whole.events[0])) == dict(whole.apply(start, whole.events[0]))


def test_ten_copies_build_beyond_enumeration_and_run() -> None:
    reg = bookings(10)
    with pytest.raises(govern.StateSpaceTooLarge):
        reg.build(compose=False)
    m = reg.build()
    assert isinstance(m, ComposedMachine)
    assert m.n_states == 32**10
    assert len(m.components) == 20  # stage+paid, and seats, of each copy
    assert m.report.cc2 and not m.report.obligations
    assert m.report.valid_states == 24**10  # stage >= 2 without paid: 2 x 4 invalid states per copy
    s = m.replay(["close3", "seat9", "seat9", "hold0"])
    assert (s["stage3"], s["paid3"], s["seats9"], s["stage0"], s["stage1"]) == (3, True, 2, 1, 0)
    assert m.is_valid(s) and m.in_domain(s)
    bad = m.state(stage5=3, paid5=False)
    assert not m.is_valid(bad)
    assert m.normalize(bad)["paid5"] is True
    assert m.apply(bad, "seat0")["paid5"] is True
    assert m.tables().repair[bad.id] == m.normalize(bad).id


def test_a_replica_runs_a_composed_machine_in_any_delivery_order() -> None:
    from govern import Event, EventLog, Replica

    m = bookings(10).build()
    assert isinstance(m, ComposedMachine)
    log = EventLog("memory://", machine=m)
    names = ["hold3", "seat9", "pay3", "book3", "seat9", "close0", "hold3", "seat0"]
    for i, name in enumerate(names):
        log.append(Event(id=f"e{i}", machine=m.digest, record=f"r{i % 2}", event=name, producer="p"))
    stored = log.read()
    forward, backward = Replica(m, log), Replica(m, log)
    forward.deliver(stored)
    for event in reversed(stored):
        backward.deliver([event])
    for record in ("r0", "r1"):
        expected = m.replay([e.event for e in stored if e.record == record])
        assert forward.state_id(record) == backward.state_id(record) == expected.id
    assert forward.digest() == backward.digest()
    # a log bound through the machine's composed certificate is bound to the same machine
    bound = EventLog("memory://", machine=govern.certify(m))
    bound.append(Event(id="x", machine=m.digest, record="r0", event="hold1", producer="p"))
    assert bound.machine() == m.digest
    third = Replica(m, bound)
    third.deliver(bound.read())
    assert third.state("r0")["stage1"] == 1
    r0, r1 = forward.state("r0"), forward.state("r1")
    assert (r0["stage3"], r0["paid3"], r0["seats9"]) == (1, True, 1)
    assert (r1["stage3"], r1["paid3"], r1["stage0"], r1["seats0"]) == (2, True, 3, 1)  # book3 repaired


def test_forty_copies_have_a_state_id_beyond_64_bits() -> None:
    m = bookings(40).build()
    assert m.n_states == 32**40
    s = m.replay(["close39", "pay39"])
    assert s.id > 2**63 and s["stage39"] == 3 and s["paid39"] is True
    assert m.state_of(s.id) == s


def test_a_shared_reader_links_two_parts() -> None:
    reg = Registry("pay_ship")
    paid, shipped = reg.bool("paid"), reg.bool("shipped")
    reg.event("pay", effect={paid: True})
    reg.event("ship", guard=paid, effect={shipped: True})  # reads paid: one component
    split = decompose(reg.snapshot().rules_json("valid"))
    assert split is not None and len(split.components) == 1
    # Split on written variables alone, each part would converge; whole, the orders diverge.
    with pytest.raises(govern.NotConvergent):
        reg.build(compose=True)


def test_a_shared_invariant_links_two_parts() -> None:
    reg = Registry("linked")
    a, b = reg.int("a", 0, 3), reg.int("b", 0, 3)
    reg.invariant("sum", holds=a + b <= 4, repair={b: 0})
    reg.event("inc_a", effect={a: min_(a + 1, 3)})
    reg.event("inc_b", effect={b: min_(b + 1, 3)})
    split = decompose(reg.snapshot().rules_json("valid"))
    assert split is not None and len(split.components) == 1


def test_only_a_shared_read_only_variable_links_too() -> None:
    reg = Registry("readers")
    mode, x, y = reg.bool("mode"), reg.int("x", 0, 2), reg.int("y", 0, 2)
    reg.event("bump_x", guard=mode, effect={x: min_(x + 1, 2)})
    reg.event("bump_y", guard=~mode, effect={y: min_(y + 1, 2)})
    split = decompose(reg.snapshot().rules_json("valid"))
    assert split is not None and len(split.components) == 1


def test_callables_are_not_decomposed() -> None:
    reg = Registry("opaque")
    a, b = reg.bool("a"), reg.bool("b")
    reg.event("set_a", effect=lambda s: {"a": True})
    reg.event("set_b", effect={b: True})
    del a
    assert decompose(reg.snapshot().rules_json("valid")) is None
    assert not isinstance(reg.build(compose=True), ComposedMachine)


def test_a_cross_component_declared_pair_needs_no_table() -> None:
    reg = bookings(2)
    reg.independent("hold0", "hold1")
    reg.independent("hold0", "book0")
    m = reg.build(compose=True)
    assert isinstance(m, ComposedMachine)
    pruned = {(p.a, p.b) for p in m.report.pairs_pruned}
    assert ("hold0", "hold1") in pruned
    cert = govern.certify(m)
    assert isinstance(cert, ComposedCertificate)
    checked = [p for c in cert.components for p in c.model.verdict.pairs_checked]
    assert checked == [[0, 1]]  # hold0/book0 in component 0; hold0/hold1 has no table at all


def test_composed_certificate_refuses_a_wrong_decomposition() -> None:
    cert = govern.certify(bookings(2).build(compose=True))
    assert isinstance(cert, ComposedCertificate)
    document = json.loads(cert.to_bytes())
    # Claim event hold0 (it writes stage0, of component 0) belongs to component 2 (stage1, paid1), and
    # recompute the digest: the partition still holds, but the extracted checker refuses it.
    comps = document["components"]
    assert comps[0]["events"] == [0, 1, 2, 3] and comps[2]["events"] == [5, 6, 7, 8]
    comps[0]["events"] = [1, 2, 3]
    comps[2]["events"] = [0, 5, 6, 7, 8]
    document["digest"] = compute_digest(document)
    with pytest.raises(govern.CertificateInvalid, match="decomposition checker rejects"):
        check_composed(canonical_json(document) + b"\n")


def test_certificate_round_trip_through_the_cli(tmp_path: Path) -> None:
    source = tmp_path / "bookings.py"
    source.write_text(
        textwrap.dedent(
            """
            from govern import Registry, implies, max_, min_

            reg = Registry("bookings")
            for i in range(10):
                stage = reg.int(f"stage{i}", 0, 3)
                paid = reg.bool(f"paid{i}")
                seats = reg.int(f"seats{i}", 0, 3)
                reg.invariant(f"booked_paid{i}", holds=implies(stage >= 2, paid), repair={paid: True})
                reg.event(f"hold{i}", effect={stage: max_(stage, 1)})
                reg.event(f"pay{i}", effect={paid: True})
                reg.event(f"seat{i}", effect={seats: min_(seats + 1, 3)})
            """
        )
    )
    out = tmp_path / "bookings.cert.json"
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    made = subprocess.run(
        [sys.executable, "-m", "govern", "certify", str(source), "-o", str(out)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    checked = subprocess.run(
        [sys.executable, "-m", "govern", "check", "--json", str(out)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    result = json.loads(checked.stdout)
    assert result["valid"] and result["verdict"]["components"] == 20
    assert result["verdict"]["states"] == 32**10
    assert any("Govern.Compose.check_decomposition_sound" in s for s in result["steps"])
    shown = subprocess.run(
        [sys.executable, "-m", "govern", "show", str(out)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "20 components" in shown.stdout and "stage9, paid9" in shown.stdout
    # a component's table altered (and the digests recomputed): refused
    document = json.loads(out.read_bytes())
    part = document["components"][0]["certificate"]
    part["verdict"]["max_repair_depth"] += 1
    part["digest"] = compute_digest(part)
    document["digest"] = compute_digest(document)
    out.write_bytes(canonical_json(document) + b"\n")
    refused = subprocess.run(
        [sys.executable, "-m", "govern", "check", str(out)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert refused.returncode != 0
    assert "component 0" in refused.stdout + refused.stderr


def test_a_composed_certificate_is_signed_and_checked_against_its_key(tmp_path: Path) -> None:
    from govern.certificate._signing import generate_key_pair, load_public_key

    key = tmp_path / "key"
    public, _ = generate_key_pair(key)
    cert = govern.certify(bookings(3).build(compose=True), sign_with=key)
    assert isinstance(cert, ComposedCertificate) and cert.signature is not None
    result = check_composed(cert.to_bytes(), public_key=load_public_key(public), require_signature=True)
    assert result.signature is not None and "signed by" in result.statement()
    document = json.loads(cert.to_bytes())
    document["verdict"]["max_repair_depth"] += 1  # the digest no longer matches, nor the signature
    with pytest.raises(govern.CertificateInvalid):
        check_composed(canonical_json(document) + b"\n", public_key=load_public_key(public))
    with pytest.raises(govern.CertificateInvalid, match="not signed"):
        check_composed(govern.certify(bookings(2).build(compose=True)).to_bytes(), require_signature=True)


def test_a_composed_machine_saves_and_loads_rechecked(tmp_path: Path) -> None:
    m = bookings(10).build()
    assert isinstance(m, ComposedMachine)
    path = tmp_path / "bookings.npz"
    m.save(path)
    loaded = govern.Machine.load(path, digest=m.digest)
    assert isinstance(loaded, ComposedMachine) and loaded.digest == m.digest
    stream = ["close3", "seat9", "hold0", "pay7"]
    assert loaded.replay(stream).id == m.replay(stream).id
    assert loaded.report.to_dict()["valid_states"] == m.report.valid_states
    with pytest.raises(govern.MachineFileError):
        govern.Machine.load(path, digest="0" * 64)
    # A decomposition altered in the file (its unkeyed content hash recomputed) is refused by the
    # extracted checker: event hold0 claimed by the component of stage1/paid1.
    import numpy as np

    from govern.machine._machine import _content_hash

    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    comps = json.loads(bytes(arrays["decomposition"]).decode())
    comps[0]["events"].remove(0)
    comps[2]["events"] = sorted([0, *comps[2]["events"]])
    arrays["decomposition"] = np.frombuffer(canonical_json(comps), dtype=np.uint8)
    del arrays["format"], arrays["content_sha256"]
    arrays["content_sha256"] = np.frombuffer(bytes.fromhex(_content_hash(arrays)), dtype=np.uint8)
    arrays["format"] = np.frombuffer(b"govern.machine.composed.v1", dtype=np.uint8)
    altered = tmp_path / "altered.npz"
    with altered.open("wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(govern.MachineFileError, match="decomposition"):
        govern.Machine.load(altered)
