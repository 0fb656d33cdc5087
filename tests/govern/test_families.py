"""Parametric events and ordered delivery: declared once, verified for every instance, carried by name."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from govern_machines import Spec, specs
from hypothesis import given, settings
from hypothesis import strategies as st

import bide
import govern
from bide.testing import Call, ScriptedModel, Turn, reply
from govern import DeclarationError, EventLog, NotConvergent, Registry, Replica, UnknownEvent, min_


def govern_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `govern` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "govern", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


STAFF = ["alice", "bob", "carol"]


def tickets(*, declare_family: bool = True, amounts: tuple[int, ...] = (1, 2, 3)) -> Registry:
    """A ticket with an owner and a budget; `assign(who)` and `deposit(amount)` are families."""
    r = Registry("tickets")
    owner = r.enum("owner", ["nobody", *STAFF])
    budget = r.int("budget", 0, 9)
    if declare_family:
        r.event("assign", params={"who": STAFF}, guard=owner == "nobody", effect=lambda who: {owner: who})
        r.event("release", guard=owner != "nobody", effect={owner: "nobody"})
        r.event(
            "deposit",
            params={"amount": list(amounts)},
            effect=lambda amount: {budget: min_(budget + amount, 9)},
        )
    else:
        for who in STAFF:
            r.event(f"assign(who={who})", guard=owner == "nobody", effect={owner: who})
        r.event("release", guard=owner != "nobody", effect={owner: "nobody"})
        for amount in amounts:
            r.event(f"deposit(amount={amount})", effect={budget: min_(budget + amount, 9)})
    if declare_family:
        r.ordered("assign", "assign")
        r.ordered("assign", "release")
    else:
        for a, b in itertools.combinations(STAFF, 2):
            r.ordered(f"assign(who={a})", f"assign(who={b})")
        for who in STAFF:
            r.ordered(f"assign(who={who})", "release")
    return r


def test_a_family_is_one_ordinary_event_per_instance() -> None:
    machine = tickets().build()
    assert machine.events == (
        "assign(who=alice)",
        "assign(who=bob)",
        "assign(who=carol)",
        "release",
        "deposit(amount=1)",
        "deposit(amount=2)",
        "deposit(amount=3)",
    )
    families = machine.families
    assert list(families) == ["assign", "deposit"]
    assert families["assign"].params[0].values == tuple(STAFF)
    assert families["deposit"].params[0].kind == "int"
    assert machine.event("assign", who="bob") == "assign(who=bob)"
    state = machine.apply(machine.initial, "assign", who="carol")
    assert state["owner"] == "carol"
    assert machine.apply(state, "deposit", amount=3)["budget"] == 3


@given(amounts=st.sets(st.integers(min_value=-3, max_value=12), min_size=1, max_size=3))
@settings(max_examples=10, deadline=None)
def test_a_family_means_exactly_its_instances_declared_by_hand(amounts: set[int]) -> None:
    values = tuple(sorted(amounts))
    try:
        by_family = tickets(amounts=values).build()
    except govern.GovernError as exc:  # a negative deposit can leave the range: both refuse it alike
        with pytest.raises(type(exc)):
            tickets(declare_family=False, amounts=values).build()
        return
    by_hand = tickets(declare_family=False, amounts=values).build()
    assert by_family.digest == by_hand.digest
    assert [w.events for w in by_family.report.obligations] == [w.events for w in by_hand.report.obligations]


def test_unknown_instances_are_refused_with_the_values() -> None:
    machine = tickets().build()
    with pytest.raises(UnknownEvent, match=r"who='dave' is not one of \['alice', 'bob', 'carol'\]"):
        machine.event("assign", who="dave")
    with pytest.raises(UnknownEvent, match="missing: \\['amount'\\]"):
        machine.families["deposit"].instance({})
    with pytest.raises(UnknownEvent, match="no event family 'pay'"):
        machine.apply(machine.initial, "pay", amount=1)
    with pytest.raises(UnknownEvent, match="amount='2' is not one of"):
        machine.event("deposit", amount="2")  # an int parameter takes ints, not their text


def test_declaration_errors_name_the_problem() -> None:
    r = Registry("bad")
    x = r.enum("x", ["a", "b"])
    with pytest.raises(DeclarationError, match="must be a word"):
        r.event("set", params={"to": ["a", "not a word"]}, effect=lambda to: {x: "a"})
    with pytest.raises(DeclarationError, match="function of the parameters"):
        r.event("set", params={"to": ["a", "b"]}, effect={x: "a"})
    with pytest.raises(DeclarationError, match="values must be distinct"):
        r.event("set", params={"to": ["a", "a"]}, effect=lambda to: {x: to})
    with pytest.raises(DeclarationError, match="all labels, all ints or all bools"):
        r.event("set", params={"to": ["a", 1]}, effect=lambda to: {x: to})
    with pytest.raises(DeclarationError, match="family name is a word"):
        r.event("set it", params={"to": ["a"]}, effect=lambda to: {x: to})
    # A failing instance leaves no instance behind: the family is declared whole or not at all.
    with pytest.raises(DeclarationError):
        r.event("set", params={"to": ["a", "b", "zz"]}, effect=lambda to: {x: to})
    r.event("set", params={"to": ["a", "b"]}, effect=lambda to: {x: to})
    with pytest.raises(DeclarationError, match="declared twice"):
        r.event("set", guard=True, effect={x: "a"})
    r.independent("set", "set")
    r.ordered("set", "set")
    with pytest.raises(DeclarationError, match="both independent and ordered"):
        r.build()


def test_families_survive_save_and_load(tmp_path: Path) -> None:
    machine = tickets().build()
    path = tmp_path / "tickets.govern"
    machine.save(path)
    loaded = govern.Machine.load(path)
    assert loaded.families == machine.families
    assert loaded.apply(loaded.initial, "assign", who="alice")["owner"] == "alice"


def test_a_non_commuting_pair_names_the_ways_out() -> None:
    r = Registry("claims")
    owner = r.enum("owner", ["nobody", *STAFF])
    r.event("assign", params={"who": STAFF}, guard=owner == "nobody", effect=lambda who: {owner: who})
    with pytest.raises(NotConvergent) as caught:
        r.build()
    text = str(caught.value)
    assert "r.ordered('assign(who=alice)', 'assign(who=bob)')" in text
    assert "strengthen a guard" in text and "repair" in text


def test_ordered_pairs_become_obligations_and_the_rest_is_still_checked() -> None:
    r = Registry("claims")
    owner = r.enum("owner", ["nobody", *STAFF])
    hits = r.int("hits", 0, 3)
    r.event("assign", params={"who": STAFF}, guard=owner == "nobody", effect=lambda who: {owner: who})
    r.event("hit", effect={hits: min_(hits + 1, 3)})
    r.event("reset", effect={hits: 0})
    r.ordered("assign", "assign")
    with pytest.raises(NotConvergent, match="'hit' and 'reset'"):
        r.build()  # the undeclared pair hit/reset is still checked, and does not commute
    r.ordered("hit", "reset")
    machine = r.build()
    obligations = {w.events for w in machine.report.obligations}
    assert obligations == {
        ("assign(who=alice)", "assign(who=bob)"),
        ("assign(who=alice)", "assign(who=carol)"),
        ("assign(who=bob)", "assign(who=carol)"),
        ("hit", "reset"),
    }


def test_ordered_for_every_event_checks_only_declared_independent_pairs() -> None:
    r = Registry("log")
    n = r.int("n", 0, 4)
    flag = r.bool("flag")
    r.event("bump", effect={n: min_(n + 1, 4)})
    r.event("zero", effect={n: 0})
    r.event("flip", effect={flag: ~flag})
    r.ordered()
    r.independent("bump", "flip")
    machine = r.build()
    assert {w.events for w in machine.report.obligations} == {("bump", "zero")}


@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
@settings(max_examples=20, deadline=None)
def test_replicas_of_a_family_machine_converge_in_any_order_keeping_obligations(seed: int) -> None:
    machine = tickets().build()
    rng = random.Random(seed)
    log = EventLog("memory://")
    log.bind(machine)
    names = machine.events
    previous: dict[str, str] = {}
    for i in range(12):
        event = rng.choice(names)
        # One producer per record keeps every event of a record in causal order (the obligations).
        record = rng.choice(["t1", "t2"])
        deps = (previous[record],) if record in previous else ()
        appended = log.append(
            govern.Event(
                id=f"e{i}", machine=machine.digest, record=record, event=event, producer=record, deps=deps
            )
        )
        previous[record] = appended.event.id
    stored = log.read()
    in_order = Replica(machine, log)
    in_order.deliver(stored)
    shuffled = Replica(machine, log)
    order = list(stored)
    rng.shuffle(order)
    shuffled.deliver(order)
    assert shuffled.pending == 0
    assert shuffled.states() == in_order.states()
    for record in {e.record for e in stored}:
        events = [e.event for e in stored if e.record == record]
        assert in_order.state(record) == dict(machine.replay(events))


def test_an_agent_names_the_instance_through_the_tool_parameters() -> None:
    machine = tickets().build()
    log = EventLog("memory://")
    tool = govern.event_tool(machine, log, "assign")
    assert tool.spec.parameters["properties"]["who"]["enum"] == STAFF
    script = [
        Turn(calls=(Call("assign", {"record": "t1", "who": "dave"}),)),
        Turn(calls=(Call("assign", {"record": "t1", "who": "bob"}),)),
        reply("assigned"),
    ]
    agent = bide.Agent(ScriptedModel(script), store=bide.MemoryStore(), tools=[tool], name="dispatcher")
    assert agent.run_sync("r1", "assign t1").answer == "assigned"
    assert [(e.record, e.event) for e in log.read()] == [("t1", "assign(who=bob)")]
    ctx = bide.CallContext("r2", "c0.0", "assign", "key", 0)
    result = asyncio.run(tool.invoke(tool.validate({"record": "t2", "who": "alice"}), ctx))
    assert result["event"] == "assign(who=alice)" and result["state"]["owner"] == "alice"


@pytest.mark.parametrize("name", ["model_config", "model_dump", "_x", "__class__", "json"])
def test_a_parameter_may_have_a_name_pydantic_reserves(name: str) -> None:
    """The tool's argument model named its fields after the parameters: `model_config` was taken as its
    configuration (every call refused), `model_dump`, `_x` and `__class__` made event_tool raise pydantic's
    own errors."""
    reg = Registry("tags")
    n = reg.int("n", 0, 9)
    reg.event("tag", params={name: ["a", "b"]}, effect=lambda **_: {n: 1})
    log = EventLog("memory://")
    tool = govern.event_tool(reg.build(), log, "tag")
    assert sorted(tool.spec.parameters["properties"]) == sorted(["record", name])
    script = [Turn(calls=(Call("tag", {"record": "o1", name: "b"}),)), reply("tagged")]
    agent = bide.Agent(ScriptedModel(script), store=bide.MemoryStore(), tools=[tool])
    assert agent.run_sync("r1", "tag o1").answer == "tagged"
    assert [(e.record, e.event) for e in log.read()] == [("o1", f"tag({name}=b)")]


def test_a_parameter_named_record_is_refused_unless_the_record_is_fixed() -> None:
    """It took the place of the record key: the model could not name the record, and every event went to
    the record named like the parameter's value."""
    reg = Registry("tags")
    n = reg.int("n", 0, 9)
    reg.event("tag", params={"record": ["a", "b"]}, effect=lambda record: {n: 1})
    machine = reg.build()
    with pytest.raises(DeclarationError, match="parameter named 'record'"):
        govern.event_tool(machine, EventLog("memory://"), "tag")
    fixed = govern.event_tool(machine, EventLog("memory://"), "tag", record="o9")
    assert list(fixed.spec.parameters["properties"]) == ["record"]  # the parameter, the record fixed


def test_certify_and_check_a_family_machine_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "tickets.py").write_text(
        "from govern import Registry, min_\n"
        "r = Registry('tickets')\n"
        "owner = r.enum('owner', ['nobody', 'alice', 'bob'])\n"
        "r.event('assign', params={'who': ['alice', 'bob']}, guard=owner == 'nobody',\n"
        "        effect=lambda who: {owner: who})\n"
        "r.event('release', effect={owner: 'nobody'})\n"
        "r.ordered()\n"
    )
    made = govern_cli("certify", "tickets.py", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    checked = govern_cli("check", "tickets.govern-cert.json", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "valid" in checked.stdout


def test_instance_names_read_back_exactly() -> None:
    from govern.model._families import families_of, instance_name, make_param

    params = [
        make_param("f", "a", ["x", "y_1", "z.2"]),
        make_param("f", "n", range(-2, 3)),
        make_param("f", "b", [False, True]),
    ]
    names = []
    for combo in itertools.product(*(p.values for p in params)):
        names.append(instance_name("f", {p.name: v for p, v in zip(params, combo, strict=True)}))
    family = families_of(names)["f"]
    assert family.params == tuple(params)


@given(specs(), st.data())
@settings(max_examples=25, deadline=None)
def test_ordering_pairs_is_declaring_the_other_pairs_independent(spec: Spec, data: st.DataObject) -> None:
    spec.independent = None
    n = len(spec.events)
    pairs = list(itertools.combinations(range(n), 2))
    ordered = data.draw(st.sets(st.sampled_from(pairs))) if pairs else set()
    by_order = spec.registry()
    for a, b in sorted(ordered):
        by_order.ordered(f"ev{a}", f"ev{b}")
    by_independence = spec.registry()
    for a, b in pairs:
        if (a, b) not in ordered:
            by_independence.independent(f"ev{a}", f"ev{b}")
    if pairs and len(ordered) == len(pairs):
        by_independence.ordered()  # nothing left to declare independent: every event is ordered
    outcomes = []
    for registry in (by_order, by_independence):
        try:
            built = registry.build(spec.domain)  # type: ignore[arg-type]
        except govern.GovernError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append((built.digest, [w.events for w in built.report.obligations]))
    if ordered or not pairs:
        assert outcomes[0] == outcomes[1]


@given(specs())
@settings(max_examples=25, deadline=None)
def test_with_every_event_ordered_no_pair_can_fail_to_converge(spec: Spec) -> None:
    spec.independent = None
    registry = spec.registry()
    registry.ordered()
    try:
        built = registry.build(spec.domain)  # type: ignore[arg-type]
    except NotConvergent as exc:
        assert isinstance(exc.counterexample, govern.RepairCycle)  # only WFC can still fail
    except govern.GovernError:
        pass  # a value out of range, say: not a convergence verdict
    else:
        for witness in built.report.obligations:
            first, second = witness.events
            start = built.state(witness.start)
            assert built.replay([first, second], start) != built.replay([second, first], start)
