"""Property: rewrite any one field of any record of an approved run (and re-sign the head, as the holder of
the log key can), and `verify_approvals` either fails or says what is not proven; the only rewrites it may
pass in silence are of fields its claim does not cover, listed here one by one."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bide.approvals import verify_approvals
from bide.audit import NotVerified

from .helpers import LOG_KEY, approved_run, evidence, records, rewrite

STORE, CALL = approved_run()
RECORDS = records(STORE)
HONEST = verify_approvals(evidence(STORE), LOG_KEY.public)
assert HONEST.facts["executed_calls_proven"] and not HONEST.facts["calls"][0]["not_proven"]

Path = tuple[str | int, ...]

# Records the approval claim does not rest on: the header, the run's input, the final turn and answer,
# and the turn records (which only order writers at runtime; docs/audit.md: verify-approvals does not
# read them).
_FREE_RECORDS = re.compile(r"^(@journal|run:start|run:end|model:1|approval:turn:.*)$")
# Fields of the other records the claim does not cover (what the tool returned, timings, the claim id,
# the salt, the stored key of records found by their call id).
_FREE_FIELDS: list[tuple[str, Path]] = [
    (".*", ("salt",)),
    ("model:0", ("key",)),
    ("model:0", ("turn",)),
    ("model:0", ("model",)),
    ("model:0", ("message", "content")),
    ("model:0", ("message", "role")),
    ("model:0", ("message", "tool_calls", 0, "id")),
    ("attempt:.*", ("key",)),
    ("attempt:.*", ("gen",)),
    ("attempt:.*", ("claim",)),
    ("attempt:.*", ("by",)),
    ("attempt:.*", ("attempted_at_ms",)),
    ("attempt:.*", ("deadline_ms",)),
    ("result:.*", ("key",)),
    ("result:.*", ("result",)),
    ("result:.*", ("is_error",)),
    ("result:.*", ("safety",)),
    ("result:.*", ("idempotency_key",)),
    ("result:.*", ("reconciled",)),
    ("result:.*", ("evidence",)),
    ("pause:.*", ("key",)),
    ("pause:.*", ("reason",)),
]


def _free(key: str, path: Path) -> bool:
    if _FREE_RECORDS.match(key):
        return True
    return any(re.fullmatch(k, key) and path[: len(p)] == p for k, p in _FREE_FIELDS)


def _paths(value: Any, prefix: Path = ()) -> list[Path]:
    out: list[Path] = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _get(value: Any, path: Path) -> Any:
    for p in path:
        value = value[p]
    return value


def _set(value: Any, path: Path, new: Any) -> None:
    for p in path[:-1]:
        value = value[p]
    value[path[-1]] = new


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _near(old: Any) -> st.SearchStrategy[Any]:
    """Values close to the old one (one digit, one character), which random values rarely are."""
    if isinstance(old, bool):
        return st.just(not old)
    if isinstance(old, int):
        return st.sampled_from([old + 1, old - 1, 0, -old])
    if isinstance(old, str) and old:
        return st.integers(0, len(old) - 1).flatmap(
            lambda i: st.sampled_from(["x", "0", "=", ":", ""]).map(lambda c: old[:i] + c + old[i + 1 :])
        )
    return _json


@st.composite
def _rewrites(draw: st.DrawFn) -> tuple[str, Path, Any]:
    index = draw(st.integers(0, len(RECORDS) - 1))
    key, rec = RECORDS[index]
    path = draw(st.sampled_from(_paths(rec)))
    old = _get(rec, path)
    new = draw(st.one_of(_near(old), _json).filter(lambda v: v != old or type(v) is not type(old)))
    return key, path, new


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rewrites())
def test_any_rewritten_field_fails_or_is_not_proven_or_is_not_covered(
    rewrite_: tuple[str, Path, Any],
) -> None:
    key, path, new = rewrite_

    def change(k: str, rec: dict[str, Any]) -> dict[str, Any]:
        if k == key:
            _set(rec, path, new)
        return rec

    forged = rewrite(STORE, change)
    try:
        result = verify_approvals(evidence(forged), LOG_KEY.public)
    except NotVerified:
        return
    facts = result.facts
    says_not_proven = not facts["executed_calls_proven"] or any(c["not_proven"] for c in facts["calls"])
    if says_not_proven:
        assert "Not proven: " in result.not_proven and (
            "ran with" in result.not_proven
            or "model" in result.not_proven
        ), result.not_proven
        return
    assert _free(key, path), f"rewriting {key} {path} to {new!r} passed: {result.proven}"
