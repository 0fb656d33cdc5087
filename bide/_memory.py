"""The in-memory store: for tests and development. NOT DURABLE: everything is lost when the process exits."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ._errors import ConfigError
from ._store import BlockingStore, Entry

__all__ = ["MemoryStore"]


class MemoryStore(BlockingStore):
    """A `Store` kept in a dict, shared by every thread of one process. Not durable; never use it for work
    whose side effects matter across a crash."""

    durable = False

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._lock = threading.Lock()
        # Records are kept as (seq, key, data) tuples of atomic values, which the garbage collector stops
        # tracking: a store holding millions of records adds nothing to collection pauses.
        self._runs: dict[str, dict[str, tuple[int, str, bytes]]] = {}
        self._order: dict[str, list[tuple[int, str, bytes]]] = {}
        self._seq = 0

    def insert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], *, exclusive: bool = False
    ) -> list[Entry]:
        _check(run_id, items)
        out: list[Entry] = []
        with self._lock:
            records = self._runs.setdefault(run_id, {})
            order = self._order.setdefault(run_id, [])
            if exclusive and any(key in records for key, _ in items):
                return [Entry(*records[key]) for key, _ in items if key in records]
            for key, data in items:
                existing = records.get(key)
                if existing is not None:
                    out.append(Entry(*existing))
                    continue
                self._seq += 1
                row = (self._seq, key, bytes(data))
                records[key] = row
                order.append(row)
                out.append(Entry(self._seq, key, row[2], True))
        return out

    def get(self, run_id: str, key: str) -> Entry | None:
        with self._lock:
            row = self._runs.get(run_id, {}).get(key)
        return None if row is None else Entry(*row)

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        with self._lock:
            order = self._order.get(run_id, [])
            rows = list(order) if after <= 0 else [r for r in order if r[0] > after]
        return [Entry(*r) for r in rows]

    def runs(self, *, prefix: str = "", after: str = "", limit: int = 500) -> list[str]:
        with self._lock:
            ids = sorted(r for r in self._runs if r.startswith(prefix) and r > after and self._runs[r])
        return ids[:limit]


def _check(run_id: str, items: Sequence[tuple[str, bytes]]) -> None:
    if not run_id:
        raise ConfigError("run id must be a non-empty string")
    if len(items) > 1 and len({key for key, _ in items}) != len(items):
        raise ConfigError("the keys of one insert_many call must be distinct")
    for key, data in items:
        if not key:
            raise ConfigError("record key must be a non-empty string")
        if not isinstance(data, (bytes, bytearray)):
            raise ConfigError(f"record data for {key!r} must be bytes, got {type(data).__name__}")
