"""Hypothesis strategy for random small machines given by tables (valid flags, one-step repair, raw apply)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


@st.composite
def machines(draw: Any, terminating: bool | None = None) -> dict[str, Any]:
    n = draw(st.integers(1, 8))
    valid = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if not any(valid):
        valid[draw(st.integers(0, n - 1))] = True
    valid_ids = [i for i in range(n) if valid[i]]
    cyc = draw(st.booleans()) if terminating is None else not terminating
    repair = [
        s if valid[s] else (draw(st.integers(0, n - 1)) if cyc else draw(st.sampled_from(valid_ids)))
        for s in range(n)
    ]
    e = draw(st.integers(0, 4))
    apply = [draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n)) for _ in range(e)]
    allp = [(a, b) for a in range(e) for b in range(a + 1, e)]
    pairs = draw(st.none() | st.lists(st.sampled_from(allp), unique=True) if allp else st.none())
    domain = draw(st.sampled_from(["valid", "reachable"]))
    initial = draw(st.sampled_from(valid_ids) if draw(st.integers(0, 9)) else st.integers(0, n - 1))
    return {"valid": valid, "repair": repair, "apply": apply, "pairs": pairs, "domain": domain,
            "initial": initial}
