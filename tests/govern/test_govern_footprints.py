"""Footprints of Python callables cannot leak: reading a variable by name reads that variable, and every
other way of looking at the state a callable receives reads every variable.

The issue's reproducer: a guard that reads `paid` through the state's text form made pay/ship look
disjoint, the pair was pruned, the obligation went missing and two replicas of one log diverged. Here
every access path is tried: the footprint covers what was read, the obligation is listed, and replicas
delivering the log in reversed order still end where the log order ends.
"""

from __future__ import annotations

import copy
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pytest

import govern
from govern.machine._machine import Machine
from govern.runtime._eventlog import Event, EventLog
from govern.runtime._replica import Replica, fold

Reader = Callable[[Any], bool]

# Each reader returns `paid` (variable 0) without reading it by name.
VALUE_PATHS: dict[str, Reader] = {
    "repr": lambda s: "paid: True" in repr(s),
    "str": lambda s: "paid: True" in str(s),
    "f-string": lambda s: "paid: True" in f"{s}",
    "format": lambda s: "paid: True" in format(s, ""),
    "dict": lambda s: bool(dict(s)["paid"]),
    "unpacking": lambda s: bool({**s}["paid"]),
    "items": lambda s: bool(dict(s.items())["paid"]),
    "values": lambda s: bool(next(iter(s.values()))),
    "equality": lambda s: any(s == {"paid": True, "shipped": x, "other": y} for x in (0, 1) for y in (0, 1)),
    "inequality": lambda s: all(
        s != {"paid": False, "shipped": x, "other": y} for x in (0, 1) for y in (0, 1)
    ),
    "copy": lambda s: bool(copy.copy(s)["paid"]),
    "deepcopy": lambda s: bool(copy.deepcopy(s)["paid"]),
    "pickle": lambda s: bool(pickle.loads(pickle.dumps(s))["paid"]),
    "private attribute": lambda s: s._values[0] == 1,
    "getattr": lambda s: getattr(s, "_values")[0] == 1,  # noqa: B009 - the access path under test
    "__getattribute__": lambda s: s.__getattribute__("_values")[0] == 1,
}

# These cannot tell states apart, but they are not reads by name either: they read every variable.
SHAPE_PATHS: dict[str, Reader] = {
    "len": lambda s: len(s) == 3,
    "iteration": lambda s: list(s) == ["paid", "shipped", "other"],
    "membership": lambda s: "paid" in s,
    "keys": lambda s: "paid" in s.keys(),  # noqa: SIM118 - the access path under test
    "truth": lambda s: bool(s),
    "dir": lambda s: isinstance(dir(s), list),
    "sizeof": lambda s: sys.getsizeof(s) > 0,
    "class": lambda s: s.__class__ is not None,
}


def machine(guard: Reader) -> Machine:
    """pay sets paid; ship's guard reads the state through `guard`; noop touches only `other`. Declaring
    pay/noop independent leaves pay/ship undeclared: an obligation exactly when ship reads paid."""
    r = govern.Registry("leak")
    r.bool("paid")
    r.bool("shipped")
    r.bool("other")
    r.event("pay", guard=lambda s: True, effect=lambda s: {"paid": True})
    r.event("ship", guard=guard, effect=lambda s: {"shipped": True})
    r.event("noop", guard=lambda s: True, effect=lambda s: {"other": True})
    r.independent("pay", "noop")
    return r.build()


@pytest.mark.parametrize("path", sorted(VALUE_PATHS))
def test_a_guard_reading_through_any_path_keeps_its_obligation(path: str) -> None:
    m = machine(VALUE_PATHS[path])
    assert m.report.footprints["ship"] == ("paid", "shipped", "other")
    assert [d.events for d in m.report.obligations] == [("pay", "ship")]
    assert not any({p.a, p.b} == {"pay", "ship"} for p in m.report.pairs_pruned)
    assert m.report.oracle is not None
    assert m.report.oracle["delivery"]["obligations"] == [[0, 1]]


@pytest.mark.parametrize("path", sorted(SHAPE_PATHS))
def test_every_other_access_reads_every_variable(path: str) -> None:
    m = machine(SHAPE_PATHS[path])
    assert m.report.footprints["ship"] == ("paid", "shipped", "other")


def test_a_read_by_name_reads_that_variable_only() -> None:
    m = machine(lambda s: bool(s["paid"]) or bool(s.get("paid")))
    assert m.report.footprints["ship"] == ("paid", "shipped")
    assert m.report.footprints["noop"] == ("other",)
    assert [d.events for d in m.report.obligations] == [("pay", "ship")]


@pytest.mark.parametrize("path", ["repr", "dict", "private attribute"])
def test_replicas_of_the_reproducer_converge(path: str) -> None:
    """The divergence of the issue: the log says pay then ship; delivered reversed, a replica that did
    not know the obligation would end unshipped. The replica waits for pay and ends shipped."""
    m = machine(VALUE_PATHS[path])
    log = EventLog("memory://", machine=m)
    for i, name in enumerate(["pay", "ship"]):
        log.append(Event(id=f"e{i}", machine=m.digest, record="r", event=name, producer="p"))
    stored = log.read()
    expected = fold(m, stored)
    assert m.state_of(expected["r"])["shipped"] is True
    naive = fold(m, reversed(stored))
    assert m.state_of(naive["r"])["shipped"] is False  # what ignoring the obligation gives
    replica = Replica(m, log)
    replica.deliver(list(reversed(stored)))
    assert replica.pending == 0
    assert replica.state_id("r") == expected["r"]


def test_an_effect_copying_the_state_reads_everything() -> None:
    r = govern.Registry("copying")
    r.bool("a")
    r.bool("b")
    r.bool("c")
    r.event("set_a", guard=lambda s: True, effect=lambda s: {"a": True})
    r.event("copy_a_to_b", guard=lambda s: True, effect=lambda s: {"b": dict(s)["a"]})
    r.event("set_c", guard=lambda s: True, effect=lambda s: {"c": True})
    r.independent("set_a", "set_c")
    m = r.build()
    assert m.report.footprints["copy_a_to_b"] == ("a", "b", "c")
    assert ("set_a", "copy_a_to_b") in [d.events for d in m.report.obligations]
