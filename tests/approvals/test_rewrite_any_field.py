"""Property: rewrite any one field of any record of an approved run (and re-sign the head, as the holder of
the log key can), and `verify_approvals` either fails or says what is not proven; the only rewrites it may
pass in silence are of fields its claim does not cover, listed here one by one."""

from __future__ import annotations

import contextlib
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

# Records the approval claim does not rest on: the run's input, the final turn and answer, and the turn
# records (which only order writers at runtime; docs/audit.md: verify-approvals does not read them). The
# header is not one: every decision signs the digest of its bytes.
_FREE_RECORDS = re.compile(r"^(run:start|run:end|model:1|approval:turn:.*)$")
# Fields of the other records the claim does not cover (what the tool returned, timings, the claim id,
# the salt, the stored key of records found by their call id).
_FREE_FIELDS: list[tuple[str, Path]] = [
    ("(?!@journal).*", ("salt",)),
    ("model:0", ("key",)),
    ("model:0", ("turn",)),
    ("model:0", ("model",)),
    ("model:0", ("message", "content")),
    ("model:0", ("message", "role")),
    ("model:0", ("message", "finish_reason")),
    ("model:0", ("message", "usage")),
    # The blocks an adapter does not model, kept as they came: context for the model, as content is (a
    # tool_use block among them is sent back from the turn's calls, which the claim covers).
    ("model:0", ("message", "blocks")),
    ("model:0", ("message", "tool_calls", 0, "id")),
    ("attempt:.*", ("key",)),
    ("attempt:.*", ("gen",)),
    ("attempt:.*", ("claim",)),
    ("attempt:.*", ("by",)),
    ("attempt:.*", ("attempted_at_ms",)),
    ("attempt:.*", ("deadline_ms",)),
    ("attempt:.*", ("clock_skew_ms",)),
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


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_rewrites(), min_size=2, max_size=4))
def test_several_rewritten_fields_never_crash_the_check(rewrites: list[tuple[str, Path, Any]]) -> None:
    """A forger may change fields together (a tool name in the tally, the request and the decisions):
    whatever the package holds, the check answers (verified or NotVerified, exit 0 or 1), never with
    another exception (which the command would report as an internal error, exit 3)."""

    def change(k: str, rec: dict[str, Any]) -> dict[str, Any]:
        for key, path, new in rewrites:
            if k == key and _fits(rec, path):  # an earlier rewrite may have replaced the container
                _set(rec, path, new)
        return rec

    with contextlib.suppress(NotVerified):
        verify_approvals(evidence(rewrite(STORE, change)), LOG_KEY.public)


def _fits(value: Any, path: Path) -> bool:
    for p in path:
        in_dict = isinstance(value, dict) and isinstance(p, str) and p in value
        in_list = isinstance(value, list) and isinstance(p, int) and 0 <= p < len(value)
        if not (in_dict or in_list):
            return False
        value = value[p]
    return True
