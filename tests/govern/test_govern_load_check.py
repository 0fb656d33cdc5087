"""`Machine.load` re-checks what it loads: a saved file whose tables, normal forms, domain, rules or report
claims (depth, CC2, obligations, not-idempotent events) were edited, with the content hash recomputed so
the file looks intact, is refused with a message that says what differs."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_govern_build import orders

from govern import Machine, MachineFileError, Registry
from govern.machine._machine import FILE_FORMAT, _content_hash

Arrays = dict[str, np.ndarray[Any, Any]]


def resave(src: Path, dst: Path, edit: Callable[[Arrays], None]) -> None:
    """Copy a saved machine with `edit` applied to its arrays, and a freshly computed content hash."""
    with np.load(io.BytesIO(src.read_bytes()), allow_pickle=False) as z:
        arrays = {k: np.array(z[k]) for k in z.files}
    del arrays["format"], arrays["content_sha256"]
    edit(arrays)
    arrays["content_sha256"] = np.frombuffer(bytes.fromhex(_content_hash(arrays)), dtype=np.uint8)
    arrays["format"] = np.frombuffer(FILE_FORMAT.encode(), dtype=np.uint8)
    with dst.open("wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]


def edit_json(key: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Arrays], None]:
    def edit(arrays: Arrays) -> None:
        doc = json.loads(bytes(arrays[key]).decode())
        change(doc)
        arrays[key] = np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8)

    return edit


def set_entry(key: str, index: tuple[int, ...], value: Callable[[Any], int]) -> Callable[[Arrays], None]:
    def edit(arrays: Arrays) -> None:
        arrays[key][index] = value(arrays[key][index])

    return edit


def callable_machine() -> Machine:
    """Callables only: set_b copies a into b, so set_a/set_b is an obligation; set_c is independent."""
    r = Registry("copy")
    r.bool("a")
    r.bool("b")
    r.bool("c")
    r.event("set_a", effect=lambda s: {"a": True})
    r.event("set_b", effect=lambda s: {"b": s["a"]})
    r.event("set_c", effect=lambda s: {"c": True})
    r.independent("set_a", "set_c")
    return r.build()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("saved")
    paths = {"data": root / "orders.govern", "callables": root / "copy.govern"}
    orders().build().save(paths["data"])
    callable_machine().save(paths["callables"])
    return paths


def test_an_intact_file_loads_and_can_be_pinned_by_digest(saved: dict[str, Path]) -> None:
    for path in saved.values():
        m = Machine.load(path)
        assert Machine.load(path, digest=m.digest).digest == m.digest
        with pytest.raises(MachineFileError, match="not the expected"):
            Machine.load(path, digest="0" * 64)


EDITS: dict[str, tuple[str, Callable[[Arrays], None], str]] = {
    # (which machine, the edit, what the refusal names)
    "apply entry (data rules)": ("data", set_entry("apply", (2, 0), lambda x: x + 1), "re-check"),
    "repair entry": ("data", set_entry("repair", (np.s_[-1]), lambda x: 0), "re-check"),
    "normal form": ("callables", set_entry("nf", (0,), lambda x: 1), "re-check"),
    "domain ids": ("callables", set_entry("domain_ids", (0,), lambda x: x + 1), "domain"),
    "initial state": ("callables", set_entry("initial", (0,), lambda x: 1), "initial"),
    "report depth": ("data", edit_json("report", lambda r: r.update(max_repair_depth=3)), "max repair depth"),
    "report CC2": ("data", edit_json("report", lambda r: r.update(cc2=True)), "CC2"),
    "report domain size": ("data", edit_json("report", lambda r: r.update(domain_states=1)), "domain size"),
    "report obligations": (
        "callables", edit_json("report", lambda r: r.update(obligations=[])), "obligations"
    ),
    "report not idempotent": (
        "data", edit_json("report", lambda r: r.update(not_idempotent=[])), "not-idempotent"
    ),
    "rules expression": (
        "data", edit_json("rules", lambda r: r["events"][2]["guard"].__setitem__(2, ["lit", 4])), "rules mean"
    ),
    "rules pairs": ("data", edit_json("rules", lambda r: r.update(independent=None)), "re-check"),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_file_with_a_recomputed_hash_is_refused(
    saved: dict[str, Path], tmp_path: Path, name: str
) -> None:
    which, edit, needle = EDITS[name]
    target = tmp_path / "edited.govern"
    resave(saved[which], target, edit)
    with pytest.raises(MachineFileError, match=needle):
        Machine.load(target)


def test_an_apply_table_edited_so_orders_diverge_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    """The issue's case: callables, so no rules check; set_c now also clears b at one state, so the
    declared-independent set_a and set_c no longer commute."""
    m = Machine.load(saved["callables"])
    c = m.event_index("set_c")
    s = m.state(a=True, b=True, c=False).id
    cleared = m.state(a=True, b=False, c=True).id
    target = tmp_path / "edited.govern"
    resave(saved["callables"], target, set_entry("apply", (c, s), lambda x: cleared))
    with pytest.raises(MachineFileError, match="'set_a' and 'set_c' do not commute"):
        Machine.load(target)


def test_a_consistent_edit_of_a_callable_machine_is_another_machine(
    saved: dict[str, Path], tmp_path: Path
) -> None:
    """Without rules to re-derive them, tables that still converge, with every claim true, are a
    different certified machine: it loads, but its digest differs, so pinning refuses it."""
    m = Machine.load(saved["callables"])
    a = m.event_index("set_a")
    s = m.state(a=False, b=False, c=True).id
    target = tmp_path / "edited.govern"

    def swap_set_a(arrays: Arrays) -> None:  # set_a at that state leaves it unchanged (a no-op there)
        arrays["apply"][a, s] = s

    resave(saved["callables"], target, swap_set_a)
    try:
        other = Machine.load(target)
    except MachineFileError:
        return  # the edit changed a claim: refused outright
    assert other.digest != m.digest
    with pytest.raises(MachineFileError, match="not the expected"):
        Machine.load(target, digest=m.digest)
