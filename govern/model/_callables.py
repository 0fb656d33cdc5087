"""The escape hatch: rules written as plain Python callables, run on every enumerated state.

A callable's footprint is never trusted: every read it makes through the state it is given is
traced, on every state it runs on, and the union is its read set (reading a variable by name
reads that variable; any other use of the state reads every variable, see `StateView`); the
variables it ever assigns are its write set. Each call is made twice and the results compared, so
non-determinism is caught; a callable that raises or returns the wrong type is reported with the
state. Purity beyond that (no hidden inputs such as clocks or globals) is trusted, and the report
says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import DomainViolation, RuleError, shown
from ._expr import Var
from ._space import Space, Value

__all__ = ["StateView", "run_assignment", "run_condition"]


_get = object.__getattribute__
# Attributes a callable may use to read one variable by name; any other attribute it looks up on the
# view (keys, items, values, _values, __reduce_ex__, __class__, ...) counts as reading every variable.
_BY_NAME = frozenset({"get", "__getitem__"})


class StateView(Mapping[str, Value]):
    """The read-only state a rule callable receives: `s["status"]`, `s[status_var]` or `s.get("status")`
    gives the label, bool or int, and records a read of that variable.

    Every other way of looking at the state counts as reading EVERY variable, so a footprint can
    never miss a dependency: its text form (repr, str, format), iteration, length, membership,
    equality, keys/items/values, conversion to a dict, copying, pickling, or any attribute of the
    view. (Deliberately going around Python's attribute protocol, e.g. with
    `object.__getattribute__` or `gc`, is not a rule; purity is trusted.)"""

    __slots__ = ("_index", "_reads", "_space", "_values")

    def __init__(self, space: Space, index: dict[str, int], values: tuple[int, ...], reads: set[int]) -> None:
        self._space = space
        self._index = index
        self._values = values
        self._reads = reads

    def __getattribute__(self, name: str) -> Any:
        if name not in _BY_NAME:
            _read_all(self)
        return _get(self, name)

    def __getitem__(self, key: object) -> Value:
        name = key.name if isinstance(key, Var) else key
        index: dict[str, int] = _get(self, "_index")
        if not isinstance(name, str) or name not in index:
            raise KeyError(key)
        i = index[name]
        _get(self, "_reads").add(i)
        space: Space = _get(self, "_space")
        return space.vars[i].decode(_get(self, "_values")[i])

    # Everything below reads the whole state.
    def __iter__(self) -> Iterator[str]:
        _read_all(self)
        return iter(list(_get(self, "_index")))

    def __len__(self) -> int:
        _read_all(self)
        return len(_get(self, "_index"))

    def __contains__(self, key: object) -> bool:
        _read_all(self)
        name = key.name if isinstance(key, Var) else key
        return isinstance(name, str) and name in _get(self, "_index")

    def __eq__(self, other: object) -> bool:
        _read_all(self)
        if isinstance(other, Mapping):
            return _as_dict(self) == dict(other.items())
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        _read_all(self)
        if isinstance(other, Mapping):
            return _as_dict(self) != dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        _read_all(self)
        return "{" + ", ".join(f"{k}: {v!r}" for k, v in _as_dict(self).items()) + "}"

    def __str__(self) -> str:
        return repr(self)

    def __format__(self, spec: str) -> str:
        return format(repr(self), spec)

    def __reduce__(self) -> tuple[Any, ...]:
        _read_all(self)  # a copy or a pickle is a plain dict of every value
        return (dict, (_as_dict(self),))

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return self.__reduce__()

    def __copy__(self) -> dict[str, Value]:
        _read_all(self)
        return _as_dict(self)

    def __deepcopy__(self, memo: Any) -> dict[str, Value]:
        _read_all(self)
        return _as_dict(self)

    def __sizeof__(self) -> int:
        _read_all(self)
        return object.__sizeof__(self)

    def __dir__(self) -> list[str]:
        _read_all(self)
        return sorted(_BY_NAME)


def _read_all(view: StateView) -> None:
    _get(view, "_reads").update(range(len(_get(view, "_values"))))


def _as_dict(view: StateView) -> dict[str, Value]:
    space: Space = _get(view, "_space")
    return {v.name: v.decode(x) for v, x in zip(space.vars, _get(view, "_values"), strict=True)}


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
                f"{rule} raised {type(exc).__name__}: {shown(exc)}", rule=rule, state=space.as_dict(sid)
            ) from exc
    first, second = results
    if not _same(first, second):
        raise RuleError(
            f"{rule} is not deterministic: it returned {shown(first, as_repr=True)} and then "
            f"{shown(second, as_repr=True)} on the "
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
                f"{rule} must return a bool, returned {type(r).__name__} {shown(r, as_repr=True)}",
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
                f"{rule} must return a mapping {{variable: value}}, returned {type(r).__name__} "
                f"{shown(r, as_repr=True)}",
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
