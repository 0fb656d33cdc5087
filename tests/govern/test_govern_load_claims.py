"""`Machine.load` hands out no claim nobody checked, and refuses what a build never writes: a file edited
(content hash recomputed, as anyone can) into duplicate enum labels, a report whose guarantee, pairs,
witnesses or oracle verdict were rewritten, or rules that are malformed (a range too large for tables,
JSON nested too deep, duplicate names) raises `MachineFileError`, never another exception."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_govern_build import orders

from govern import Machine, MachineFileError, Registry, max_
from govern.machine._machine import _content_hash

Arrays = dict[str, np.ndarray[Any, Any]]
Doc = dict[str, Any]


def resave(src: Path, dst: Path, edit: Callable[[Arrays], None]) -> Path:
    """Copy a saved machine file (any format) with `edit` applied and a freshly computed content hash."""
    with np.load(io.BytesIO(src.read_bytes()), allow_pickle=False) as z:
        arrays = {k: np.array(z[k]) for k in z.files}
    fmt = arrays.pop("format")
    del arrays["content_sha256"]
    edit(arrays)
    arrays["content_sha256"] = np.frombuffer(bytes.fromhex(_content_hash(arrays)), dtype=np.uint8)
    arrays["format"] = fmt
    with dst.open("wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]
    return dst


def edit_json(key: str, change: Callable[[Doc], None]) -> Callable[[Arrays], None]:
    def edit(arrays: Arrays) -> None:
        doc = json.loads(bytes(arrays[key]).decode())
        change(doc)
        arrays[key] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)

    return edit


def door() -> Machine:
    r = Registry("door")
    state = r.enum("state", ["closed", "open", "locked"])
    r.event("open", guard=state == "closed", effect={state: "open"})
    r.event("close", guard=state == "open", effect={state: "closed"})
    r.event("lock", guard=state == "closed", effect={state: "locked"})
    r.ordered()
    return r.build()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("claims")
    paths = {"door": root / "door.govern", "orders": root / "orders.govern"}
    door().save(paths["door"])
    orders().build().save(paths["orders"])
    return paths


def refused(path: Path, match: str) -> None:
    with pytest.raises(MachineFileError, match=match):
        Machine.load(path)


def test_an_intact_file_loads_with_the_report_it_was_saved_with(saved: dict[str, Path]) -> None:
    built = orders().build()
    loaded = Machine.load(saved["orders"])
    said, found = built.report.to_dict(), loaded.report.to_dict()
    said.pop("timings"), found.pop("timings")
    assert found == said  # the oracle record is the load's own, and the same oracle gives the same


def test_duplicate_enum_labels_in_a_table_file_are_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    path = resave(saved["door"], tmp_path / "labels.govern",
                  edit_json("rules", lambda d: d["variables"][0]["labels"].__setitem__(1, "closed")))
    refused(path, "labels must be at least two distinct strings")


def _every_pair(d: Doc) -> None:
    d["pair_mode"] = "all"
    d["pairs_checked"] = [[a, b] for i, a in enumerate(d["events"]) for b in d["events"][i + 1 :]]


REPORT_EDITS: dict[str, tuple[str, Callable[[Doc], None], str]] = {
    "guarantee": ("door", lambda d: d.__setitem__("guarantee", "Every order converges."), "guarantee"),
    "pair mode": ("door", _every_pair, "pairs"),
    "theorems": ("door", lambda d: d["theorems"].append("Govern.Made.up"), "theorems"),
    "undeclared pairs": ("door", lambda d: d.__setitem__("undeclared_pairs", 0), "undeclared pairs"),
    "invariants": ("door", lambda d: d.__setitem__("invariants", ["always"]), "invariants"),
    "method": ("door", lambda d: d.__setitem__("method", "symbolic"), "method"),
    "trusted callables": ("orders", lambda d: d.__setitem__("trusted_callables", ["event pay"]), "trusted"),
    "CC2 failing events": ("orders", lambda d: d.__setitem__("cc2_failing_events", ["ship"]), "CC2 fails"),
    "oracle theorem": ("orders", lambda d: d["oracle"].__setitem__("theorem", "Govern.X.y"), "oracle"),
    "oracle rules check": ("orders", lambda d: d["oracle"].__setitem__("rules_checked", "checked"), "oracle"),
    "pruned pair reason": ("orders", lambda d: d["pairs_pruned"][0].__setitem__("reason", "ok"), "pruned"),
    "footprint": ("orders", lambda d: d["footprints"].__setitem__("pay", ["nothing"]), "footprints"),
    "obligation witness start": (
        "orders", lambda d: d["obligations"][0]["start"].__setitem__("stock", 2), "the witness step"
    ),
    "obligation witness result": (
        "orders", lambda d: d["obligations"][0]["second"][0].__setitem__("changed", True), "the witness step"
    ),
    "witness of another machine": (
        "orders", lambda d: d["not_idempotent"][0].__setitem__("machine", "other"), "another machine"
    ),
    "CC2 witness repair": (
        "orders",
        lambda d: d["cc2_witness"]["second"][0]["repairs"][0].__setitem__(0, "made_up"),
        "the witness step",
    ),
    "CC2 witness dropped": ("orders", lambda d: d.__setitem__("cc2_witness", None), "is missing"),
}


@pytest.mark.parametrize("edit", sorted(REPORT_EDITS))
def test_a_report_claim_edited_with_the_hash_recomputed_is_refused(
    edit: str, saved: dict[str, Path], tmp_path: Path
) -> None:
    machine, change, match = REPORT_EDITS[edit]
    path = resave(saved[machine], tmp_path / "edited.govern", edit_json("report", change))
    refused(path, match)


def _deep(arrays: Arrays) -> None:
    doc = json.loads(bytes(arrays["rules"]).decode())
    guard = json.dumps(doc["events"][0]["guard"])
    nested = "".join('["not", ' for _ in range(100_000)) + '["lit", 1]' + "]" * 100_000
    text = json.dumps(doc)
    assert guard in text
    arrays["rules"] = np.frombuffer(text.replace(guard, nested, 1).encode(), dtype=np.uint8)


MALFORMED: dict[str, Callable[[Arrays], None]] = {
    "a 2^62 integer range": edit_json(
        "rules", lambda d: d["variables"].append({"kind": "int", "min": 0, "max": 2**62, "name": "x"})
    ),
    "a 10^12 integer range": edit_json(
        "rules", lambda d: d["variables"].append({"kind": "int", "min": 0, "max": 10**12, "name": "x"})
    ),
    "rules nested deeper than JSON reads": _deep,
    "two variables of one name": edit_json(
        "rules", lambda d: d["variables"].append({"kind": "bool", "name": "state"})
    ),
    "two events of one name": edit_json("rules", lambda d: d["events"][1].__setitem__("name", "open")),
    "an enum of one label": edit_json("rules", lambda d: d["variables"][0].__setitem__("labels", ["closed"])),
    "a bool range as text": edit_json(
        "rules", lambda d: d["variables"].append({"kind": "int", "min": "0", "max": 1, "name": "x"})
    ),
}


@pytest.mark.parametrize("edit", sorted(MALFORMED))
def test_malformed_rules_are_a_machine_file_error(edit: str, saved: dict[str, Path], tmp_path: Path) -> None:
    path = resave(saved["door"], tmp_path / "malformed.govern", MALFORMED[edit])
    refused(path, "is inconsistent")


def test_duplicate_enum_labels_in_a_symbolic_file_are_refused(tmp_path: Path) -> None:
    r = Registry("limits")
    limit = r.int("limit", 0, 10**9 - 1)
    mode = r.enum("mode", ["low", "high", "off"])
    r.event("floor_1k", effect={limit: max_(limit, 1000)})
    r.event("go_high", effect={mode: "high"})
    machine = r.build()
    assert machine.report.method == "symbolic"
    machine.save(tmp_path / "limits.govern")
    assert Machine.load(tmp_path / "limits.govern").digest == machine.digest
    assert isinstance(machine.report.solver, dict) and type(machine.report.solver["queries"]) is int
    path = resave(tmp_path / "limits.govern", tmp_path / "labels.govern",
                  edit_json("rules", lambda d: d["variables"][1]["labels"].__setitem__(1, "low")))
    refused(path, "labels must be at least two distinct strings")


def pair() -> Machine:
    """A machine built by its two components."""
    r = Registry("pair")
    a = r.int("a", 0, 3)
    b = r.bool("b")
    r.event("bump", effect={a: max_(a, 1)})
    r.event("flag", effect={b: True})
    return r.build(compose=True)


def test_a_composed_file_with_an_edited_report_is_refused(tmp_path: Path) -> None:
    machine = pair()
    assert len(machine.components) == 2
    machine.save(tmp_path / "pair.govern")
    assert Machine.load(tmp_path / "pair.govern").digest == machine.digest
    path = resave(tmp_path / "pair.govern", tmp_path / "edited.govern",
                  edit_json("report", lambda d: d.__setitem__("guarantee", "Anything goes.")))
    refused(path, "guarantee")


NOT_EXPRESSIONS: dict[str, Callable[[Doc], None]] = {
    "a guard that is a bare name": lambda d: d["events"][0].__setitem__("guard", "closed"),
    "an effect that is not a pair": lambda d: d["events"][0].__setitem__("effect", [None]),
    "a guard of a list of lists": lambda d: d["events"][1].__setitem__("guard", [[0], 0]),
}


@pytest.mark.parametrize("edit", sorted(NOT_EXPRESSIONS))
def test_rules_that_are_not_expressions_are_a_machine_file_error(
    edit: str, saved: dict[str, Path], tmp_path: Path
) -> None:
    # The oracle's rules checker refused them with its own OracleInputError, which escaped Machine.load.
    path = resave(saved["door"], tmp_path / "edited.govern", edit_json("rules", NOT_EXPRESSIONS[edit]))
    refused(path, "altered")


def test_a_composed_file_whose_rules_are_not_expressions_is_a_machine_file_error(tmp_path: Path) -> None:
    # The decomposition checker's input error was reported as OracleUnavailable: "the oracle is missing",
    # where the file had been altered.
    pair().save(tmp_path / "pair.govern")
    path = resave(tmp_path / "pair.govern", tmp_path / "edited.govern",
                  edit_json("rules", lambda d: d["events"][0]["effect"][0].__setitem__(1, "a")))
    refused(path, "altered")


def test_footprints_edited_in_a_file_of_expression_rules_are_refused(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """A footprint outside every checked pair was handed out as the file said ("ship touches nothing"):
    with expression rules the footprints are what the rules give, as every other claim is."""
    path = resave(saved["orders"], tmp_path / "footprint.govern",
                  edit_json("report", lambda d: d["footprints"].__setitem__("ship", [])))
    refused(path, "footprints")


@pytest.mark.parametrize(
    ("field", "value"),
    [("wfc", "no"), ("cc1", "no"), ("cc1", 2**31), ("cc2", 1), ("max_repair_depth", 1.0), ("states", "16")],
)
def test_report_claims_of_another_type_are_refused(
    saved: dict[str, Path], tmp_path: Path, field: str, value: object
) -> None:
    """`wfc: "no"` passed as true, and `cc2: 1` or a count of 1.0 compared equal to the re-check's."""
    path = resave(saved["door"], tmp_path / "typed.govern",
                  edit_json("report", lambda d: d.__setitem__(field, value)))
    with pytest.raises(MachineFileError):
        Machine.load(path)
