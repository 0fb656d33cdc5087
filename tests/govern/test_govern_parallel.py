"""Large builds run their per-event and per-invariant work on threads; the results must not change."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import numpy as np
import pytest

import govern.verify._parallel as parallel
import govern.verify._tables as tables
import govern.verify._verify as verify
from govern import DomainViolation, Registry, min_


def _machine() -> Registry:
    # 2^16 * 3 states: above the parallel threshold, with cascading repairs and guarded effects.
    r = Registry("wide")
    f = [r.bool(f"f{i}") for i in range(16)]
    n = r.int("n", 0, 2)
    for i in range(0, 14, 2):
        r.invariant(f"c{i}", holds=~f[i] | f[i + 1], repair={f[i + 1]: True})
    r.invariant("n_small", holds=(n < 2) | f[15], repair={n: 1})
    for i in range(16):
        r.event(f"set{i}", effect={f[i]: True})
    r.event("bump", guard=~f[0], effect={n: min_(n + 1, 2)})
    for i in range(16):
        for j in range(i + 1, 16):
            r.independent(f"set{i}", f"set{j}")
    return r


def test_parallel_and_serial_builds_are_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    par = _machine().build()
    assert par.n_states >= parallel.PARALLEL_MIN_STATES
    for module in (tables, verify):
        monkeypatch.setattr(module, "PARALLEL_MIN_STATES", 1 << 40)
    ser = _machine().build()
    for name in ("valid", "repair", "apply", "nf", "step"):
        assert np.array_equal(getattr(par.tables(), name), getattr(ser.tables(), name)), name
    a, b = par.report.to_dict(), ser.report.to_dict()
    a.pop("timings")
    b.pop("timings")
    assert a == b


def test_parallel_errors_are_the_first_in_declaration_order() -> None:
    r = Registry("overflow")
    f = [r.bool(f"f{i}") for i in range(16)]
    a, b = r.int("a", 0, 1), r.int("b", 0, 1)
    r.event("set", effect={f[0]: True})
    r.event("inc_a", effect={a: a + 1})
    r.event("inc_b", effect={b: b + 1})
    with pytest.raises(DomainViolation) as info:
        r.build()
    assert info.value.variable == "a" and "inc_a" in info.value.rule


def _build_in_child(queue: Any) -> None:
    queue.put(_machine().build().n_states)


@pytest.mark.skipif(
    not hasattr(os, "fork"), reason="no os.fork on this platform (Windows): there is no forked child to test"
)
def test_a_forked_child_can_still_build_large_machines() -> None:
    _machine().build()  # the parent's thread pool now exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_build_in_child, args=(queue,))
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 196608
