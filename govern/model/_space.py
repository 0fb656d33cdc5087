"""The state space: dense mixed-radix numbering of states (docs/semantics.md) and its value columns.

A state's id is `sum((x_i - lo_i) * stride_i)` with the first variable fastest. Columns (variable i's
value in every state) are built lazily in the smallest dtype that holds the variable's range. Before
anything of size N is allocated, `check_size` estimates the memory a build needs and refuses early.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .._errors import DeclarationError, StateSpaceTooLarge
from ._expr import Kind, dtype_for

__all__ = ["Space", "VarSpec", "available_memory", "build_bytes_per_state"]

IntArray = npt.NDArray[np.int32]
Value = bool | int | str

# State ids are int32 throughout (tables are 4 bytes per entry); one id is kept free as a sentinel.
MAX_STATES = 2**31 - 1


@dataclass(frozen=True)
class VarSpec:
    """One declared variable: its name, kind, inclusive integer range and enum labels."""

    name: str
    kind: Kind
    lo: int
    hi: int
    labels: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1

    def decode(self, value: int) -> Value:
        """The user-facing value (bool, label, int) of the integer encoding `value`."""
        if self.kind == "bool":
            return bool(value)
        if self.kind == "enum":
            return self.labels[value]
        return int(value)

    def encode(self, value: object) -> int:
        """The integer encoding of a user-facing value; raises DeclarationError when out of range."""
        if self.kind == "bool":
            if isinstance(value, bool | np.bool_):
                return int(bool(value))
        elif self.kind == "enum":
            if isinstance(value, str):
                if value in self.labels:
                    return self.labels.index(value)
                raise DeclarationError(f"{value!r} is not a label of {self.name} {list(self.labels)}")
        elif isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            if self.lo <= int(value) <= self.hi:
                return int(value)
            raise DeclarationError(f"{self.name} = {value} is outside its range {self.lo}..{self.hi}")
        raise DeclarationError(f"{self.name} is {self.kind}; {value!r} is not a valid value")

    def to_json(self) -> dict[str, Any]:
        if self.kind == "bool":
            return {"name": self.name, "kind": "bool"}
        if self.kind == "enum":
            return {"name": self.name, "kind": "enum", "labels": list(self.labels)}
        return {"name": self.name, "kind": "int", "min": self.lo, "max": self.hi}


def build_bytes_per_state(n_vars_bytes: int, n_events: int) -> int:
    """Peak bytes per state a build needs, measured on chain(24): the raw apply table (4 bytes per
    event), the runtime step table derived from it (4), the oracle's 64-bit copies of the tables and
    its working space (about 12), plus ids, repair, NF, depth, first-violated, columns and scratch."""
    return 20 * n_events + n_vars_bytes + 64


def available_memory() -> int:
    """Bytes of memory this process can still use (MemAvailable, or physical memory as a fallback)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


@dataclass
class Space:
    """The enumerated state space of a list of variables."""

    vars: tuple[VarSpec, ...]
    strides: tuple[int, ...] = field(init=False)
    n: int = field(init=False)
    _columns: dict[int, npt.NDArray[Any]] = field(init=False, default_factory=dict, repr=False)
    _ids: IntArray | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        strides = []
        n = 1
        for v in self.vars:
            strides.append(n)
            n *= v.size
        self.strides = tuple(strides)
        self.n = n

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.vars]

    def check_size(self, n_events: int, max_states: int | None) -> None:
        """Refuse, before allocating, a space that cannot be built: more states than `max_states`,
        more than int32 ids allow, or more memory than is available."""
        col_bytes = sum(dtype_for(v.lo, v.hi).itemsize for v in self.vars)
        need = self.n * build_bytes_per_state(col_bytes, n_events)
        avail = available_memory()
        sizes = " x ".join(str(v.size) for v in self.vars) or "1"
        what = f"{self.n:,} states ({sizes}) with {n_events} events would need about {_gib(need)} to build"
        if max_states is not None and self.n > max_states:
            raise StateSpaceTooLarge(
                f"{what}; max_states is {max_states:,}. Shrink variable ranges, split "
                "the machine, or raise max_states.",
                states=self.n,
                bytes_needed=need,
            )
        if self.n > MAX_STATES:
            raise StateSpaceTooLarge(
                f"{what}; state ids are 32-bit, so at most {MAX_STATES:,} states can be "
                "enumerated. Shrink variable ranges or split the machine.",
                states=self.n,
                bytes_needed=need,
            )
        if need > avail:
            raise StateSpaceTooLarge(
                f"{what}, but only {_gib(avail)} is available. Shrink variable ranges, "
                "split the machine, or build on a larger machine.",
                states=self.n,
                bytes_needed=need,
            )

    def ids(self) -> IntArray:
        """Every state id, 0..N-1 (int32, cached)."""
        if self._ids is None:
            self._ids = np.arange(self.n, dtype=np.int32)
        return self._ids

    def column(self, i: int) -> npt.NDArray[Any]:
        """Variable i's value in every state, in state-id order (cached, smallest exact dtype)."""
        col = self._columns.get(i)
        if col is None:
            v = self.vars[i]
            dt = dtype_for(v.lo, v.hi)
            stride = self.strides[i]
            block = np.repeat(np.arange(v.lo, v.hi + 1, dtype=dt), stride)
            col = np.tile(block, self.n // (stride * v.size))
            self._columns[i] = col
        return col

    def drop_columns(self) -> None:
        """Free the cached columns and ids (they are rebuilt on demand)."""
        self._columns.clear()
        self._ids = None

    def values(self, sid: int) -> tuple[int, ...]:
        """The integer values of state `sid`."""
        return tuple(v.lo + (sid // s) % v.size for v, s in zip(self.vars, self.strides, strict=True))

    def id_of(self, values: Sequence[int]) -> int:
        """The id of the state with these integer values."""
        return sum((x - v.lo) * s for x, v, s in zip(values, self.vars, self.strides, strict=True))

    def as_dict(self, sid: int) -> dict[str, Value]:
        """State `sid` as `{name: value}` with labels, bools and ints."""
        return {v.name: v.decode(x) for v, x in zip(self.vars, self.values(sid), strict=True)}

    def id_from_mapping(self, values: Mapping[str, object], base: int) -> int:
        """The id of state `base` with the named variables replaced by the given user-facing values."""
        current = list(self.values(base))
        index = {v.name: i for i, v in enumerate(self.vars)}
        for name, value in values.items():
            if name not in index:
                raise DeclarationError(f"unknown variable {name!r}; variables are {self.names}")
            current[index[name]] = self.vars[index[name]].encode(value)
        return self.id_of(current)


def _gib(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.1f} MiB"
