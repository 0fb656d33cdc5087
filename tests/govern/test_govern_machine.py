"""The runtime: lookups, normalization, states, batch replay, save/load with integrity checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_govern_build import orders

from govern import ForeignState, Machine, MachineFileError, Registry, State, UnknownEvent

MACHINE = orders().build()


def test_apply_is_the_normalized_step_and_states_are_mappings() -> None:
    m = MACHINE
    s = m.apply(m.initial, "pay")
    assert isinstance(s, State) and dict(s) == {"status": "paid", "paid": True, "stock": 0}
    assert list(s) == ["status", "paid", "stock"] and len(s) == 3
    assert s == m.state(status="paid", paid=True) and s.id == m.state(status="paid", paid=True).id
    assert s == {"status": "paid", "paid": True, "stock": 0}
    assert hash(s) == hash(m.state_of(s.id))
    assert repr(s) == "State(status='paid', paid=True, stock=0)"
    with pytest.raises(TypeError):
        s["status"] = "pending"  # type: ignore[index]
    assert m.apply(s, "pay") == s  # guard false: no-op


def test_invalid_states_are_normalized_before_applying() -> None:
    m = MACHINE
    bad = m.state(status="shipped", paid=False, stock=2)
    assert not m.is_valid(bad)
    assert dict(m.normalize(bad)) == {"status": "pending", "paid": False, "stock": 2}
    # runtime contract: apply(e, s) = step(e, NF(s)), so pay applies to the repaired state
    assert dict(m.apply(bad, "pay")) == {"status": "paid", "paid": True, "stock": 2}


def test_errors_for_unknown_events_and_foreign_states() -> None:
    m = MACHINE
    with pytest.raises(UnknownEvent, match="no event 'refund'") as info:
        m.apply(m.initial, "refund")
    assert isinstance(info.value, KeyError)
    other = Registry("other")
    other.bool("x")
    other.event("e", effect={"x": True})
    om = other.build()
    with pytest.raises(ForeignState):
        m.apply(om.initial, "pay")
    with pytest.raises(ForeignState):
        m.state_of(10**6)
    with pytest.raises(Exception, match="not a label"):
        m.state(status="lost")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["pay", "ship", "restock"]), max_size=8), min_size=1, max_size=10))
def test_replay_many_equals_replay_one_by_one(streams: list[list[str]]) -> None:
    m = MACHINE
    assert m.replay_many(streams) == [m.replay(s) for s in streams]
    start = m.state(stock=3)
    assert m.replay_many(streams, start) == [m.replay(s, start) for s in streams]


def test_replay_ids_is_vectorized_over_many_streams() -> None:
    m = MACHINE
    rng = np.random.default_rng(7)
    codes = rng.integers(-1, 3, size=(5000, 12)).astype(np.int32)
    starts = np.full(5000, m.initial.id, dtype=np.int32)
    out = m.replay_ids(codes, starts)
    for i in range(0, 5000, 499):
        names = [m.events[c] for c in codes[i] if c >= 0]
        assert out[i] == m.replay(names).id


def test_tables_are_read_only_and_consistent() -> None:
    t = MACHINE.tables()
    with pytest.raises(ValueError):
        t.step[0, 0] = 1
    assert t.step.dtype == np.int32 and t.step.shape == (3, 48)
    assert np.array_equal(t.nf[t.nf], t.nf) and t.valid[t.nf].all()
    assert np.array_equal(t.step, t.nf[t.apply][:, t.nf])


def test_save_load_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "orders.govern"
    MACHINE.save(path)
    loaded = Machine.load(path)
    for name in ("valid", "repair", "apply", "nf", "step"):
        assert np.array_equal(getattr(loaded.tables(), name), getattr(MACHINE.tables(), name)), name
    assert loaded.digest == MACHINE.digest and loaded.rules() == MACHINE.rules()
    assert loaded.report.to_dict() == MACHINE.report.to_dict()
    assert dict(loaded.replay(["restock", "pay", "ship"])) == {"status": "shipped", "paid": True, "stock": 0}
    assert loaded.initial == MACHINE.initial
    assert path.stat().st_size < 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["orders.govern"]  # no temp file left behind


def test_load_refuses_damaged_files(tmp_path: Path) -> None:
    path = tmp_path / "m.govern"
    MACHINE.save(path)
    data = bytearray(path.read_bytes())
    (tmp_path / "truncated").write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(MachineFileError):
        Machine.load(tmp_path / "truncated")
    # flip one byte inside the step table's payload: the content hash catches it
    raw = bytes(data)
    i = raw.find(b"step_valid.npy")
    j = raw.find(b"\x93NUMPY", i) + 200
    data[j] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(data))
    with pytest.raises(MachineFileError):
        Machine.load(tmp_path / "flipped")
    (tmp_path / "junk").write_bytes(b"not a machine")
    with pytest.raises(MachineFileError):
        Machine.load(tmp_path / "junk")
    with pytest.raises(MachineFileError):
        Machine.load(tmp_path / "missing")


def test_digests_are_stable_across_builds_and_distinguish_machines() -> None:
    again = orders().build()
    assert again.digest == MACHINE.digest and again.rules_digest == MACHINE.rules_digest
    r = orders()
    r.event("cancel", guard=False, effect={"status": "cancelled"})
    assert r.build().digest != MACHINE.digest


def test_callable_machines_save_and_load_without_their_code(tmp_path: Path) -> None:
    r = Registry("inbox")
    r.bool("archived")
    r.bool("starred")
    r.invariant(
        "archived_unstarred",
        holds=lambda s: not (s["archived"] and s["starred"]),
        repair=lambda s: {"starred": False},
    )
    r.event("archive", effect=lambda s: {"archived": True})
    r.event("star", effect=lambda s: {"starred": True})
    m = r.build()
    m.save(tmp_path / "inbox.govern")
    loaded = Machine.load(tmp_path / "inbox.govern")
    assert loaded.rules()["events"][0]["effect"] is None
    assert loaded.digest == m.digest
    assert dict(loaded.replay(["star", "archive"])) == {"archived": True, "starred": False}
