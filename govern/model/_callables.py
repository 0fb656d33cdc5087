"""The escape hatch: rules written as plain Python callables, run on every enumerated state.

A callable's footprint is never trusted: every read it makes through the state it is given is
traced, on every state it runs on, and the union is its read set; the variables it ever assigns are
its write set. Each call is made twice and the results compared, so non-determinism is caught; a
callable that raises or returns the wrong type is reported with the state. Purity beyond that
(no hidden inputs such as clocks or globals) is trusted, and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import DomainViolation, RuleError
from ._expr import Var
from ._space import Space, Value

__all__ = ["StateView", "run_assignment", "run_condition"]


class StateView(Mapping[str, Value]):
    """The read-only state a rule callable receives: `s["status"]` (or `s[status_var]`) gives the
    label, bool or int. Every read is recorded for footprint tracing."""

    __slots__ = ("_index", "_reads", "_space", "_values")

    def __init__(self, space: Space, index: dict[str, int], values: tuple[int, ...], reads: set[int]) -> None:
        self._space = space
        self._index = index
        self._values = values
        self._reads = reads

    def __getitem__(self, key: object) -> Value:
        name = key.name if isinstance(key, Var) else key
        if not isinstance(name, str) or name not in self._index:
            raise KeyError(key)
        i = self._index[name]
        self._reads.add(i)
        return self._space.vars[i].decode(self._values[i])

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return (
            "{"
            + ", ".join(
                f"{v.name}: {v.decode(x)!r}" for v, x in zip(self._space.vars, self._values, strict=True)
            )
            + "}"
        )


def _call(
    fn: Callable[[Any], Any], space: Space, index: dict[str, int], sid: int, rule: str, reads: set[int]
) -> Any:
    values = space.values(sid)
    results = []
    for _ in range(2):
        try:
            results.append(fn(StateView(space, index, values, reads)))
        except Exception as exc:
            raise RuleError(
                f"{rule} raised {type(exc).__name__}: {exc}", rule=rule, state=space.as_dict(sid)
            ) from exc
    first, second = results
    if not _same(first, second):
        raise RuleError(
            f"{rule} is not deterministic: it returned {first!r} and then {second!r} on the "
            "same state; rules must be pure functions of the state",
            rule=rule,
            state=space.as_dict(sid),
        )
    return first


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        ka = {k.name if isinstance(k, Var) else k: v for k, v in a.items()}
        kb = {k.name if isinstance(k, Var) else k: v for k, v in b.items()}
        return ka == kb and all(type(ka[k]) is type(kb[k]) for k in ka)
    return type(a) is type(b) and bool(a == b)


def run_condition(
    fn: Callable[[Any], Any], space: Space, rule: str
) -> tuple[npt.NDArray[np.bool_], set[int]]:
    """Evaluate a condition callable on every state; returns the truth table and the traced reads."""
    index = {v.name: i for i, v in enumerate(space.vars)}
    reads: set[int] = set()
    out = np.empty(space.n, dtype=np.bool_)
    for sid in range(space.n):
        r = _call(fn, space, index, sid, rule, reads)
        if not isinstance(r, bool | np.bool_):
            raise RuleError(
                f"{rule} must return a bool, returned {type(r).__name__} {r!r}",
                rule=rule,
                state=space.as_dict(sid),
            )
        out[sid] = bool(r)
    return out, reads


def run_assignment(
    fn: Callable[[Any], Any], space: Space, idx: npt.NDArray[np.int32], rule: str
) -> tuple[npt.NDArray[np.int32], set[int], set[int]]:
    """Run an effect/repair callable on the states `idx`; returns the resulting state ids and the
    traced reads and writes. Out-of-range values raise `DomainViolation` with the state."""
    index = {v.name: i for i, v in enumerate(space.vars)}
    reads: set[int] = set()
    writes: set[int] = set()
    out = np.empty(len(idx), dtype=np.int32)
    for k, sid in enumerate(idx.tolist()):
        r = _call(fn, space, index, sid, rule, reads)
        if not isinstance(r, Mapping):
            raise RuleError(
                f"{rule} must return a mapping {{variable: value}}, returned {type(r).__name__} {r!r}",
                rule=rule,
                state=space.as_dict(sid),
            )
        values = list(space.values(sid))
        for key, value in r.items():
            name = key.name if isinstance(key, Var) else key
            if not isinstance(name, str) or name not in index:
                raise RuleError(
                    f"{rule} assigns unknown variable {key!r}; variables are {space.names}",
                    rule=rule,
                    state=space.as_dict(sid),
                )
            i = index[name]
            spec = space.vars[i]
            writes.add(i)
            if spec.kind == "int" and isinstance(value, int | np.integer) and not isinstance(value, bool):
                if not spec.lo <= int(value) <= spec.hi:
                    raise DomainViolation(
                        rule=rule, state=space.as_dict(sid), variable=name, value=int(value)
                    )
                values[i] = int(value)
                continue
            try:
                values[i] = spec.encode(value)
            except Exception as exc:
                raise RuleError(
                    f"{rule} assigns {name} = {value!r}: {exc}", rule=rule, state=space.as_dict(sid)
                ) from exc
        out[k] = space.id_of(values)
    return out, reads, writes
