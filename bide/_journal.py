"""The journal of one run: decoded, format-checked records over a store.

The journal owns all meaning (encoding, salts, header, keys); the store only keeps bytes. Every read checks
that the run's first record is the header of this journal format, so a run written in another format is
refused before anything is written to it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ._errors import ConfigError, JournalFormatError, RecordDamaged, StoreError
from ._records import FORMAT, HEADER_KEY, Header, Record, decode_record, encode_record
from ._store import BlockingStore, Entry, Fence, Store

__all__ = ["Journal", "check_run_id"]

MAX_RUN_ID = 256
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_run_id(run_id: object) -> str:
    """Refuse run ids that are empty, too long or contain control characters."""
    if not isinstance(run_id, str) or not run_id:
        raise ConfigError("run id must be a non-empty string")
    if len(run_id) > MAX_RUN_ID:
        raise ConfigError(f"run id is {len(run_id)} characters long; the limit is {MAX_RUN_ID}")
    if not run_id.isprintable() and _CONTROL.search(run_id):  # printable text holds no control character
        raise ConfigError(f"run id {run_id!r} contains control characters")
    if not run_id.isascii():
        try:
            run_id.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"run id {run_id!r} holds a lone surrogate, which no store can keep") from None
    return run_id


class _HeaderDamaged(JournalFormatError, RecordDamaged):
    """A run's header that cannot be decoded: refused as another format would be (`JournalFormatError`),
    and a damaged record (`RecordDamaged`) to whoever tells the two apart, as the `bide` CLI does."""


class Journal:
    """The records of one run. Load it (`load`/`aload`), read it (`get`, `records`, `entries`), and append
    to it (`write`/`awrite`: insert-if-absent, the header is added to a new run's first write).

    Reads are from what this object has loaded or written; call `aload` again to see other writers.

    `fence` is the (holder, token) of the run's lease this journal writes under (set by the driver that
    holds it): the store refuses its writes with `LeaseLost` once someone else took the lease over.
    """

    __slots__ = ("_blocking", "_has_header", "_last_seq", "_recs", "_rows", "fence", "run_id", "store")

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = check_run_id(run_id)
        # The stored (seq, bytes) rows are the truth; decoded records are a cache. Rows are tuples of atomic
        # values, which the garbage collector stops tracking, and records this object wrote itself are not
        # cached (they are decoded again if asked for), so thousands of live runs cost collections little.
        self._recs: dict[str, Record] = {}
        self._rows: dict[str, tuple[int, bytes]] = {}
        self._last_seq = 0
        self._has_header = False
        self.fence: Fence | None = None
        # A store whose async insert is BlockingStore's own (it calls the blocking one and never suspends) is
        # written to directly: the same answers, without a coroutine per write.
        self._blocking = _blocking_insert(store)

    # -- reading -------------------------------------------------------------------------------------------

    def load(self) -> Journal:
        """Read records this object has not seen yet (blocking)."""
        self._absorb(self.store.load(self.run_id, self._last_seq))
        return self

    async def aload(self) -> Journal:
        """Read records this object has not seen yet."""
        self._absorb(await self.store.aload(self.run_id, self._last_seq))
        return self

    @property
    def last_seq(self) -> int:
        """The highest seq this object has loaded (load again with `store.aload(run_id, last_seq)`)."""
        return self._last_seq

    @property
    def exists(self) -> bool:
        """True once the run has any record."""
        return bool(self._rows)

    def has(self, key: str) -> bool:
        """True when a record is stored under `key` (as far as this object has loaded or written)."""
        return key in self._rows

    def get(self, key: str) -> Record | None:
        """The decoded record under `key`, or None."""
        rec = self._recs.get(key)
        if rec is None:
            row = self._rows.get(key)
            if row is None:
                return None
            rec = self._recs[key] = decode_record(key, row[1])
        return rec

    def peek(self, key: str) -> Record | None:
        """The decoded record under `key`, or None, without keeping the decoded copy (for a record read once,
        so a long-lived journal does not hold it)."""
        rec = self._recs.get(key)
        if rec is None:
            row = self._rows.get(key)
            return None if row is None else decode_record(key, row[1])
        return rec

    def entry(self, key: str) -> Entry | None:
        """The stored entry (seq, key, exact bytes) under `key`, or None."""
        row = self._rows.get(key)
        return None if row is None else Entry(row[0], key, row[1])

    def records(self) -> list[Record]:
        """Every loaded record, in seq (commit) order."""
        rows = self._rows
        return [self._decoded(k) for k in sorted(rows, key=lambda k: rows[k][0])]

    def _decoded(self, key: str) -> Record:
        rec = self.get(key)
        assert rec is not None
        return rec

    def entries(self) -> list[Entry]:
        """Every loaded entry with its exact stored bytes, in seq order."""
        return sorted((Entry(s, k, d) for k, (s, d) in self._rows.items()), key=lambda e: e.seq)

    def _keep(self, entry: Entry, rec: Record | None) -> None:
        """Remember a stored entry, and its decoded record when given one to cache."""
        if rec is not None:
            self._recs[entry.key] = rec
        self._rows[entry.key] = (entry.seq, entry.data)

    def absorb(self, entries: Sequence[Entry]) -> None:
        """Take in entries loaded from the store (the answer of `store.aload(run_id, ...)`)."""
        self._absorb(entries)

    def _absorb(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            if not self._has_header:
                self._check_header(entry)
            if entry.key not in self._rows:
                self._keep(entry, decode_record(entry.key, entry.data))
            self._last_seq = max(self._last_seq, entry.seq)

    def _check_header(self, entry: Entry) -> None:
        if entry.key != HEADER_KEY:
            raise JournalFormatError(
                f"run {self.run_id!r} does not start with a {HEADER_KEY!r} header (its first record is "
                f"{entry.key!r}); it was not written by this version of bide and is refused"
            )
        try:
            rec = decode_record(entry.key, entry.data)
        except RecordDamaged as exc:
            message = f"run {self.run_id!r} has an unreadable header: {exc}"
            raise _HeaderDamaged(message, key=entry.key) from exc
        if not isinstance(rec, Header) or rec.format != FORMAT:
            fmt = rec.format if isinstance(rec, Header) else "?"
            raise JournalFormatError(
                f"run {self.run_id!r} is in journal format {fmt!r}; this bide reads {FORMAT!r}. "
                "Finish or resolve it with the bide version that started it"
            )
        self._has_header = True

    # -- writing -------------------------------------------------------------------------------------------

    def _items(self, records: Sequence[Record]) -> tuple[tuple[str, bytes], ...]:
        """The canonical (key, bytes) of `records`, after the header's for a new run. A tuple: the store keeps
        it as it is instead of copying it."""
        items: list[tuple[str, bytes]] = []
        if not self._has_header and HEADER_KEY not in self._rows:
            items.append((HEADER_KEY, encode_record(Header(key=HEADER_KEY))))
        for r in records:  # a loop, not a comprehension: no function frame, on every write
            items.append((r.key, encode_record(r)))
        return tuple(items)

    def _winners(self, records: Sequence[Record], entries: list[Entry]) -> list[tuple[Record, bool]]:
        out: list[tuple[Record, bool]] = []
        skip = len(entries) - len(records)  # the header's entry comes first when we sent one
        if skip not in (0, 1):
            raise StoreError(
                f"run {self.run_id!r}: the store answered {len(entries)} entries for {len(records)} records; "
                "it does not keep the Store protocol"
            )
        for i, entry in enumerate(entries):
            if entry.key == HEADER_KEY and not self._has_header:
                if entry.inserted:
                    self._has_header = True  # we just wrote this format's header
                else:
                    self._check_header(entry)
            if i < skip:  # the header: remembered, not returned
                if entry.key not in self._rows:
                    self._keep(entry, None if entry.inserted else decode_record(entry.key, entry.data))
                continue
            if entry.key in self._rows:
                rec = self._decoded(entry.key)
            elif entry.inserted:
                # Bytes we wrote decode to the record we encoded: the caller has it, nothing to cache.
                # Not advancing _last_seq: records other writers committed before ours are not loaded yet.
                rec = records[i - skip]
                self._keep(entry, None)
            else:
                rec = decode_record(entry.key, entry.data)
                self._keep(entry, rec)
            out.append((rec, entry.inserted))
        return out

    def write(self, records: Sequence[Record]) -> list[tuple[Record, bool]]:
        """Append records in one transaction (blocking); returns (stored record, inserted) per record."""
        items = self._items(records)
        if self.fence is None:
            return self._winners(records, self.store.insert_many(self.run_id, items))
        return self._winners(records, self.store.insert_many(self.run_id, items, fence=self.fence))

    async def awrite(self, records: Sequence[Record]) -> list[tuple[Record, bool]]:
        """Append records in one transaction; returns (stored record, inserted) per record. A record whose
        key exists is not written, and the stored one is returned with inserted=False."""
        items = self._items(records)
        if self._blocking:
            return self._winners(records, self.store.insert_many(self.run_id, items, fence=self.fence))
        if self.fence is None:
            return self._winners(records, await self.store.ainsert_many(self.run_id, items))
        return self._winners(records, await self.store.ainsert_many(self.run_id, items, fence=self.fence))

    async def awrite_exclusive(self, records: Sequence[Record]) -> bool:
        """Append all `records` in one transaction (with the header first for a new run), or none of them if
        any key exists already (the stored records of those keys are loaded instead). Returns True when all
        were written."""
        items = self._items(records)
        count = len(items)
        if self._blocking:
            entries = self.store.insert_many(self.run_id, items, exclusive=True, fence=self.fence)
        else:
            if self.fence is None:
                answer = self.store.ainsert_many(self.run_id, items, exclusive=True)
            else:
                answer = self.store.ainsert_many(self.run_id, items, exclusive=True, fence=self.fence)
            del items, records  # what the store has is its own: a waiting run holds nothing more
            entries = await answer
        if len(entries) == count and _all_inserted(entries):
            for entry in entries:
                if entry.key not in self._rows:
                    self._keep(entry, None)
            self._has_header = True
            return True
        for entry in entries:
            if entry.key == HEADER_KEY and not self._has_header:
                self._check_header(entry)  # another writer created the run: in this format?
            if entry.key not in self._rows:
                self._keep(entry, decode_record(entry.key, entry.data))
        return False

    async def awrite_one(self, record: Record) -> tuple[Record, bool]:
        """`awrite` for one record."""
        # awrite's body, not a call to it: one coroutine fewer held by every run waiting on a write.
        items = self._items((record,))
        if self._blocking:
            return self._winners((record,), self.store.insert_many(self.run_id, items, fence=self.fence))[0]
        if self.fence is None:
            answer = self.store.ainsert_many(self.run_id, items)
        else:
            answer = self.store.ainsert_many(self.run_id, items, fence=self.fence)
        return self._winners((record,), await answer)[0]


_BLOCKING: dict[type, bool] = {}


def _blocking_insert(store: Store) -> bool:
    """True when `store.ainsert_many` is BlockingStore's own (answered per store class, once)."""
    kind = type(store)
    blocking = _BLOCKING.get(kind)
    if blocking is None:
        blocking = _BLOCKING[kind] = (
            issubclass(kind, BlockingStore) and kind.ainsert_many is BlockingStore.ainsert_many
        )
    return blocking


def _all_inserted(entries: Sequence[Entry]) -> bool:
    for entry in entries:  # noqa: SIM110 (a loop: cheaper than all() over a generator, twice a run)
        if not entry.inserted:
            return False
    return True
