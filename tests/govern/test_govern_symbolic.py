"""The symbolic route (CP-SAT on the rules' AST) against enumeration, and machines of 10^9 values.

Differential: for random small machines (every rule an expression, checked domain "valid") the
symbolic route, forced on domains small enough to enumerate, reaches the verdict enumeration reaches:
the same error kind (domain violation of the same rule, repair cycle, the same failing pair), or the
same initial state, repair depth, CC2 failures, obligations and not-idempotent events, and a runtime
whose every step equals the step table's. Every counterexample it reports really diverges.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from govern_machines import Spec, specs
from hypothesis import HealthCheck, given, settings
from symbolic_corpus import limits
from symbolic_corpus import outcome as _outcome

from govern import (
    CertificateInvalid,
    Divergence,
    DomainViolation,
    Event,
    EventLog,
    Machine,
    NotConvergent,
    Registry,
    RepairCycle,
    Replica,
    Report,
    StateSpaceTooLarge,
    certify,
    check_certificate,
    max_,
    min_,
)
from govern.certificate._certificate import compute_digest
from govern.certificate._encoding import canonical_json
from govern.certificate._symbolic import SymbolicCertificate
from govern.machine._build import build_machine
from govern.machine._symbolic import SymbolicMachine, build_symbolic

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ints(m: Machine, state: dict[str, Any]) -> tuple[int, ...]:
    return tuple(v.encode(state[v.name]) for v in m.variables)


@SETTINGS
@given(specs())
def test_symbolic_verdict_equals_enumeration(spec: Spec) -> None:
    snap = spec.registry().snapshot()
    n = 1
    for v in snap.vars:
        n *= v.size
    kind_e, enum = _outcome(lambda: build_machine(snap, "valid", method="enumerate"))
    kind_s, sym = _outcome(lambda: build_symbolic(snap, "valid", max_depth=n + 1))
    assert kind_s == kind_e, (enum, sym)
    if kind_e == "domain":
        assert sym.rule == enum.rule
        return
    if kind_e == "cycle":
        return  # the cycle was replayed through the concrete semantics before it was reported
    if kind_e == "diverge":
        assert sym.counterexample.events == enum.counterexample.events
        assert sym.counterexample.first_result != sym.counterexample.second_result
        return
    assert isinstance(sym, SymbolicMachine)
    re, rs = enum.report, sym.report
    assert sym.initial.id == enum.initial.id
    assert rs.max_repair_depth == re.max_repair_depth
    assert rs.cc2 == re.cc2 and rs.cc2_failing_events == re.cc2_failing_events
    assert [d.events for d in rs.obligations] == [d.events for d in re.obligations]
    assert [d.events for d in rs.not_idempotent] == [d.events for d in re.not_idempotent]
    step = enum.tables().step
    for s in range(enum.n_states):
        assert sym.is_valid(s) == enum.is_valid(s)
        assert sym.normalize(s).id == enum.normalize(s).id
        for e, name in enumerate(enum.events):
            assert sym.apply(s, name).id == int(step[e, s])
    for d in (*rs.obligations, *rs.not_idempotent, *([rs.cc2_witness] if rs.cc2_witness else [])):
        assert d.first_result != d.second_result
        assert enum.apply(enum.state(d.start), d.events[0]) is not None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_symbolic_certificates_of_random_machines_check(spec: Spec) -> None:
    snap = spec.registry().snapshot()
    try:
        kind, sym = _outcome(lambda: build_symbolic(snap, "valid"))
    except StateSpaceTooLarge:  # repair deeper than the default bound of 32: not decided, by design
        return
    if kind != "ok":
        return
    result = check_certificate(certify(sym).to_bytes())
    assert result.solver is not None and result.statement().startswith("Verified, resting on CP-SAT")


_balance = limits  # the corpus's machine of one 10^9-value limit


def test_a_billion_values_build_symbolically_and_run() -> None:
    m = _balance(False).build()
    assert isinstance(m, SymbolicMachine)
    rep = m.report
    assert rep.method == "symbolic" and rep.solver and rep.solver["name"] == "CP-SAT"
    assert rep.states == 10**9 and rep.cc2 and not rep.obligations and not rep.not_idempotent
    assert rep.max_repair_depth == 1
    assert "rests on CP-SAT" in rep.text() and "rests on CP-SAT" in rep.guarantee
    assert dict(m.initial) == {"limit": 10}
    s = m.replay(["floor_1k", "cap_900m", "floor_1m"])
    assert dict(s) == {"limit": 1_000_000}
    assert dict(m.apply(m.state(limit=999_999_999), "cap_900m")) == {"limit": 900_000_000}
    assert dict(m.normalize(m.state(limit=3))) == {"limit": 10}
    assert m.tables().step[2, 999_999_999] == 900_000_000
    ids = m.replay_ids(
        __import__("numpy").array([[0, 1], [2, -1]]), __import__("numpy").array([5, 999_999_999])
    )
    assert ids.tolist() == [1_000_000, 900_000_000]


def test_non_commuting_pair_counterexample_is_concrete() -> None:
    with pytest.raises(NotConvergent) as info:
        _balance(True).build()
    cx = info.value.counterexample
    assert isinstance(cx, Divergence) and cx.condition == "CC1"
    assert "add_300m" in cx.events
    assert cx.first_result != cx.second_result
    text = str(info.value)
    assert "results differ" in text and "start: {limit:" in text


def test_declared_pairs_give_obligations_with_witnesses() -> None:
    r = _balance(True)
    r.independent("floor_1k", "floor_1m")
    m = r.build()
    pairs = {d.events for d in m.report.obligations}
    assert ("cap_900m", "add_300m") in pairs
    assert all(d.first_result != d.second_result for d in m.report.obligations)
    assert [d.events for d in m.report.not_idempotent] == [("add_300m",)]


def test_large_domain_errors_are_replayed() -> None:
    r = Registry("spill")
    x = r.int("x", 0, 10**9)
    r.event("bump", effect={x: x + 1})
    with pytest.raises(DomainViolation) as dv:
        r.build()
    assert dv.value.state == {"x": 10**9} and dv.value.value == 10**9 + 1
    r = Registry("loop")
    x = r.int("x", 0, 10**9)
    flag = r.bool("flag")
    r.invariant("a", holds=flag, repair={flag: True})
    r.invariant("b", holds=x <= 5, repair={flag: False})
    r.event("e", effect={flag: False})
    with pytest.raises(NotConvergent) as nc:
        r.build()
    assert isinstance(nc.value.counterexample, RepairCycle)


def test_symbolic_route_refuses_what_it_cannot_decide() -> None:
    r = Registry("reach")
    x = r.int("x", 0, 10**9)
    r.event("e", effect={x: 0})
    reach = r.build("reachable")  # the reachable domain is decided too (runs from the initial state)
    assert reach.report.method == "symbolic" and reach.report.domain == "reachable"
    r = Registry("slow")
    x = r.int("x", 0, 10**9)
    r.invariant("small", holds=x <= 0, repair={x: x - 1})  # repair chains of 10^9 steps
    r.event("e", effect={x: 0})
    with pytest.raises(StateSpaceTooLarge, match="neither shown nor refuted"):
        r.build()


def test_replicas_fold_a_symbolic_machine(tmp_path: Path) -> None:
    r = _balance(True)
    r.independent("floor_1k", "floor_1m")
    tier = r.enum("tier", ["basic", "silver", "gold", "platinum"])  # 4 * 10^9 states: ids beyond 32 bits
    r.event("upgrade", guard=tier == "basic", effect={tier: "gold"})
    m = r.build()
    assert m.n_states == 4 * 10**9
    log = EventLog(f"sqlite:///{tmp_path}/events.db", machine=m)
    rng = random.Random(1)
    in_order = Replica(m, log)
    for batch in range(2):  # the second fold starts from states whose ids exceed 32 bits
        log.append_many(
            [
                Event(
                    id=f"e{i}",
                    machine=m.digest,
                    record=f"acct{i % 3}",
                    event="upgrade" if i < 3 else rng.choice(m.events),
                    producer="p",
                )
                for i in range(20 * batch, 20 * batch + 20)
            ]
        )
        in_order.sync()
    assert in_order.state("acct0")["tier"] == "gold"
    shuffled = Replica(m, log)
    arrivals = log.read()
    arrivals = arrivals + arrivals[:5]
    rng.shuffle(arrivals)
    shuffled.deliver(arrivals)  # obligations held back, duplicates dropped
    assert shuffled.pending == 0 and shuffled.digest() == in_order.digest()
    for record in ("acct0", "acct1", "acct2"):
        expected = m.replay([e.event for e in log.read() if e.record == record])
        assert in_order.state(record) == dict(expected)


def test_symbolic_certificate_checks_and_states_the_weaker_claim() -> None:
    r = _balance(True)
    r.independent("floor_1k", "floor_1m")
    cert = certify(r.build())
    assert isinstance(cert, SymbolicCertificate)
    doc = cert.document()
    assert doc["format"] == "govern-symbolic-certificate/1" and "tables" not in doc
    assert doc["solver"]["name"] == "CP-SAT" and doc["solver"]["version"]
    assert doc["verdict"]["causal_order_obligations"] and doc["verdict"]["not_idempotent"] == [3]
    result = check_certificate(cert.to_bytes())
    assert result.solver is not None and result.tables_verdict is None
    statement = result.statement()
    assert statement.startswith("Verified, resting on CP-SAT") and "no proof-derived checker ran" in statement
    # A verdict that lies is caught by re-deciding it; an edit without a new digest by the digest.
    for field, value in (("not_idempotent", []), ("cc2", True), ("max_repair_depth", 0)):
        forged = json.loads(cert.to_bytes())
        forged["verdict"][field] = value
        forged["digest"] = compute_digest(forged)
        with pytest.raises(CertificateInvalid, match="does not match the rules"):
            check_certificate(canonical_json(forged) + b"\n")
    forged = json.loads(cert.to_bytes())
    forged["machine"]["events"][3]["effect"][0][1] = ["add", ["var", 0], ["lit", 1]]
    with pytest.raises(CertificateInvalid, match="digest mismatch"):
        check_certificate(canonical_json(forged) + b"\n")
    # `govern check` on such a file, valid and forged, through a subprocess:
    # tests/certify/test_cli.py::test_symbolic_and_composed_machines_certify_check_and_draw


def test_when_the_symbolic_route_is_taken() -> None:
    # A cap the user set is respected: no fallback.
    with pytest.raises(StateSpaceTooLarge, match="max_states"):
        _balance(False).build(max_states=1000)
    # Many booleans are not a large integer domain: enumeration's refusal stands.
    r = Registry("flags")
    flags = [r.bool(f"f{i}") for i in range(40)]
    r.event("e", effect={flags[0]: True})
    with pytest.raises(StateSpaceTooLarge, match="states"):
        r.build()
    # Callables cannot be encoded: the refusal says why the symbolic route does not apply.
    r = Registry("callable")
    x = r.int("x", 0, 10**9)
    r.event("e", guard=lambda s: s["x"] > 3, effect={x: 0})
    with pytest.raises(StateSpaceTooLarge, match="needs every rule as an expression"):
        r.build()
    # A small machine still enumerates, and the report survives a round trip with its method.
    small = Registry("small")
    y = small.int("y", 0, 9)
    small.event("e", effect={y: 0})
    report = small.build().report
    assert report.method == "enumeration" and report.solver is None and report.oracle
    sym = _balance(False).build().report
    again = Report.from_dict(sym.to_dict())
    assert again.method == "symbolic" and again.solver == sym.solver and again.text() == sym.text()


def test_an_agent_records_events_on_a_symbolic_machine(tmp_path: Path) -> None:
    import bide
    from bide.testing import ScriptedModel, call, reply
    from govern import event_tool

    m = _balance(False).build()
    log = EventLog(f"sqlite:///{tmp_path}/events.db", machine=m)
    store = bide.open_store(f"sqlite:///{tmp_path}/journal.db")
    tools = [event_tool(m, log, e) for e in m.events]
    model = ScriptedModel([call("floor_1m", record="acct"), call("floor_1k", record="acct"), reply("done")])
    bide.Agent(model, store=store, tools=tools, name="teller").run_sync("run-1", "raise acct")
    results = [
        r.result for r in bide.Journal(store, "run-1").load().records() if isinstance(r, bide.ToolResult)
    ]
    assert [r["outcome"] for r in results] == ["applied", "no-op"]
    assert results[1]["state"] == {"limit": 1_000_000}


def test_parametric_events_on_a_symbolic_machine() -> None:
    r = Registry("wallet")
    cents = r.int("cents", 0, 10**9 - 1)
    r.event(
        "top_up",
        params={"to": [1_000, 50_000, 2_000_000]},
        effect=lambda to: {cents: max_(cents, to)},
    )
    r.event("cap", effect={cents: min_(cents, 900_000_000)})
    m = r.build()
    assert isinstance(m, SymbolicMachine) and len(m.events) == 4
    s = m.apply(m.initial, "top_up", to=50_000)
    assert dict(m.apply(s, "top_up", to=1_000)) == {"cents": 50_000}


def _rewrite(path: Path, out: Path, edit: Any) -> None:
    """The saved machine at `path` with `edit(rules, report)` applied, written to `out` with its content
    hash recomputed, as anyone editing the file can."""
    import numpy as np

    from govern.machine._machine import write_machine_file
    from govern.machine._symbolic import SYMBOLIC_FORMAT

    with np.load(path) as z:
        rules = json.loads(bytes(z["rules"]).decode())
        report = json.loads(bytes(z["report"]).decode())
    edit(rules, report)
    write_machine_file(out, SYMBOLIC_FORMAT, {
        "rules": np.frombuffer(json.dumps(rules).encode(), dtype=np.uint8),
        "report": np.frombuffer(json.dumps(report).encode(), dtype=np.uint8),
    })


def test_a_symbolic_machine_saves_and_loads_only_after_deciding_it_again(tmp_path: Path) -> None:
    from govern import MachineFileError

    r = _balance(True)
    r.independent("floor_1k", "floor_1m")
    m = r.build()
    path = tmp_path / "limits.govern"
    m.save(path)
    again = Machine.load(path, digest=m.digest)
    assert isinstance(again, SymbolicMachine) and again.digest == m.digest
    assert again.report.obligations == m.report.obligations and again.report.solver
    assert dict(again.replay(["floor_1k", "add_300m"])) == dict(m.replay(["floor_1k", "add_300m"]))

    def refused(edit: Any, match: str, *, digest: str | None = None) -> None:
        _rewrite(path, tmp_path / "edited.govern", edit)
        with pytest.raises(MachineFileError, match=match):
            Machine.load(tmp_path / "edited.govern", digest=digest)

    def drop_obligations(rules: Any, report: Any) -> None:
        report["obligations"] = []

    def flip_cc2(rules: Any, report: Any) -> None:
        report["cc2"] = not report["cc2"]

    def unguard(rules: Any, report: Any) -> None:  # add_300m may now leave the domain
        rules["events"][3]["guard"] = ["lit", 1]

    def raise_floor(rules: Any, report: Any) -> None:  # another machine, as consistent as the first
        rules["events"][0]["effect"][0][1][2] = ["lit", 2000]

    refused(drop_obligations, "causal-order obligations: the file says")
    refused(flip_cc2, "CC2: the file says")
    refused(lambda rules, report: rules.__setitem__("domain", "reachable"), "checked domain: the file says")
    refused(unguard, "deciding its rules again gives no machine")
    _rewrite(path, tmp_path / "other.govern", raise_floor)
    assert Machine.load(tmp_path / "other.govern").digest != m.digest  # only a pin tells them apart
    refused(raise_floor, "not the expected", digest=m.digest)
    # Hostile rules are refused before anything is decided.
    hostile = [
        lambda rules, report: rules["events"][0]["effect"][0].__setitem__(0, -1),  # a position from the end
        lambda rules, report: rules["events"][0]["effect"][0][1].__setitem__(2, ["lit", True]),
        lambda rules, report: rules["invariants"][0].__setitem__("holds", ["exec", ["lit", 1]]),
        lambda rules, report: rules.__setitem__("extra", 1),
        lambda rules, report: rules["events"][0].__setitem__("guard", None),  # a "callable"
    ]
    for edit in hostile:
        refused(edit, "is inconsistent")
    reach = r.build("reachable")  # a machine checked on the reachable domain saves and loads as one
    reach.save(tmp_path / "reach.govern")
    loaded = Machine.load(tmp_path / "reach.govern", digest=reach.digest)
    assert loaded.report.domain == "reachable" and loaded.report.obligations == reach.report.obligations
    (tmp_path / "cut.govern").write_bytes(path.read_bytes()[:-30])
    with pytest.raises(MachineFileError):
        Machine.load(tmp_path / "cut.govern")
