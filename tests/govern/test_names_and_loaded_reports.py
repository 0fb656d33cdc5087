"""Text that cannot be written, and saved files that claim what no build writes.

A name holding a lone surrogate ("go\\ud800") was accepted when declared, and `build()` ran the whole
engine and oracle before failing with a bare UnicodeEncodeError (not a `GovernError`) while digesting the
rules. It is a `DeclarationError` where it is declared now, for every kind of name and label. And
`Machine.load`, which trusts nothing a file says, accepted a report whose phase timings were not numbers
(printing the report then failed), an initial-state array with extra entries, rules naming things with
such text, and a symbolic machine's literal guard `["lit", 2]` that no build writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_govern_load_claims import Arrays, Doc, edit_json, resave

from govern import DeclarationError, Machine, MachineFileError, Registry, max_, min_

LONE = "go\ud800"


def _lights() -> Registry:
    r = Registry("lights")
    r.bool("kitchen")
    return r


DECLARATIONS: dict[str, Callable[[], object]] = {
    "registry name": lambda: Registry(LONE),
    "bool name": lambda: _lights().bool(LONE),
    "int name": lambda: _lights().int(LONE, 0, 3),
    "enum name": lambda: _lights().enum(LONE, ["a", "b"]),
    "enum label": lambda: _lights().enum("mode", ["a", LONE]),
    "invariant name": lambda: _lights().invariant(LONE, holds=True, repair={"kitchen": True}),
    "event name": lambda: _lights().event(LONE, effect={"kitchen": True}),
    "event family name": lambda: _lights().event(
        LONE, params={"n": range(2)}, effect=lambda n: {"kitchen": True}
    ),
    "family label": lambda: _lights().event(
        "set", params={"who": ["ann", LONE]}, effect=lambda who: {"kitchen": True}
    ),
}


@pytest.mark.parametrize("what", sorted(DECLARATIONS))
def test_a_name_with_a_lone_surrogate_is_refused_where_it_is_declared(what: str) -> None:
    with pytest.raises(DeclarationError) as caught:
        DECLARATIONS[what]()
    assert "ud800" in str(caught.value)


def test_a_name_with_a_lone_surrogate_never_reaches_the_build() -> None:
    r = Registry("orders")
    x = r.bool("x")
    with pytest.raises(DeclarationError, match="not valid text: it holds a lone surrogate"):
        r.event(LONE, effect={x: True})
    r.event("go", effect={x: True})  # the refused declaration left nothing behind
    assert r.build().events == ("go",)


def test_other_unicode_names_are_still_accepted() -> None:
    r = Registry("café ☕")
    heat = r.enum("température", ["froid", "chaud", ""])
    r.event("réchauffer 🔥", effect={heat: "chaud"})
    assert r.build().events == ("réchauffer 🔥",)


# -- loading --------------------------------------------------------------------------------------------


def _plain() -> Machine:
    r = Registry("door")
    state = r.enum("state", ["closed", "open"])
    r.event("open", guard=state == "closed", effect={state: "open"})
    r.event("close", guard=state == "open", effect={state: "closed"})
    r.ordered()
    return r.build()


def _composed() -> Machine:
    r = Registry("rooms")
    for room in ("hall", "den"):
        on = r.bool(f"{room}_on")
        r.event(f"{room}_switch", effect={on: True})
    machine = r.build(compose=True)
    assert len(machine.components) == 2
    return machine


def _symbolic() -> Machine:
    r = Registry("limits")
    limit = r.int("limit", 0, 10**9 - 1)
    r.invariant("at_least_ten", holds=limit >= 10, repair={limit: 10})
    r.event("floor_1k", effect={limit: max_(limit, 1000)})
    r.event("cap_900m", effect={limit: min_(limit, 900_000_000)})
    machine = r.build()
    assert machine.report.method == "symbolic"
    return machine


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loaded")
    paths = {"plain": root / "plain.govern", "composed": root / "composed.govern"}
    _plain().save(paths["plain"])
    _composed().save(paths["composed"])
    return paths


def _set_timings(timings: Any) -> Callable[[Doc], None]:
    def change(report: Doc) -> None:
        report["timings"] = timings

    return change


BAD_TIMINGS: list[Any] = [
    {"build": "slow"},
    {"build": float("nan")},
    {"build": float("inf")},
    {"build": -1.0},
    {"build": True},
    {"build": 10**400},
    {"build": None},
]


@pytest.mark.parametrize("kind", ["plain", "composed"])
@pytest.mark.parametrize("timings", BAD_TIMINGS, ids=repr)
def test_a_report_whose_timings_are_not_seconds_is_refused(
    saved: dict[str, Path], tmp_path: Path, kind: str, timings: Any
) -> None:
    path = resave(saved[kind], tmp_path / "edited.govern", edit_json("report", _set_timings(timings)))
    with pytest.raises(MachineFileError, match="timing"):
        Machine.load(path)


@pytest.mark.parametrize("kind", ["plain", "composed"])
def test_a_report_with_plausible_timings_loads_and_prints(
    saved: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    path = resave(saved[kind], tmp_path / "edited.govern", edit_json("report", _set_timings({"build": 2})))
    assert "build 2000.0 ms" in Machine.load(path).report.text(witnesses=False)


def test_an_initial_state_array_with_extra_entries_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    def extra(arrays: Arrays) -> None:
        arrays["initial"] = np.array([int(arrays["initial"][0]), 1], dtype=np.int64)

    with pytest.raises(MachineFileError, match="initial"):
        Machine.load(resave(saved["plain"], tmp_path / "initial.govern", extra))


def _respell(old: str, new: str) -> Callable[[Arrays], None]:
    """Write the JSON string `old` as `new` throughout the rules and the report (so that they agree)."""

    def edit(arrays: Arrays) -> None:
        for key in ("rules", "report"):
            text = bytes(arrays[key]).replace(json.dumps(old).encode(), json.dumps(new).encode())
            arrays[key] = np.frombuffer(text, dtype=np.uint8)

    return edit


@pytest.mark.parametrize("name", ["door", "open", "closed"])
def test_rules_naming_things_with_a_lone_surrogate_are_refused(
    saved: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """JSON can spell a lone surrogate (`"\\ud800"`): a file whose machine, event or label was so named
    (in its rules and report alike) loaded, and digesting its rules failed with a bare UnicodeEncodeError."""
    path = resave(saved["plain"], tmp_path / "named.govern", _respell(name, LONE))
    with pytest.raises(MachineFileError, match="text"):
        Machine.load(path).digest  # noqa: B018 (the digest is what failed)
    same = resave(saved["plain"], tmp_path / "renamed.govern", _respell(name, "go"))
    assert Machine.load(same).digest  # the same edit with a name that is text loads


def test_a_symbolic_machine_with_a_literal_guard_no_build_writes_is_refused(tmp_path: Path) -> None:
    """A build writes True as ["lit", 1]; ["lit", 2] read as true, loading as a machine of another digest."""
    machine = _symbolic()
    machine.save(tmp_path / "ok.govern")

    def guard_two(rules: Doc) -> None:
        assert rules["events"][0]["guard"] == ["lit", 1]
        rules["events"][0]["guard"] = ["lit", 2]

    path = resave(tmp_path / "ok.govern", tmp_path / "two.govern", edit_json("rules", guard_two))
    with pytest.raises(MachineFileError, match="a literal condition"):
        Machine.load(path)
    assert Machine.load(tmp_path / "ok.govern").digest == machine.digest
