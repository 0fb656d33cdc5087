"""Streaming a drive: the events of a run as they are journaled, and the model's text as it comes.

Events are made from journal records, never the other way round: a drive's journal (`WatchedJournal`)
turns each record it loads or writes into events, in the journal's order. A record that was journaled
before the drive began is *replayed* (`replayed=True`): a resumed or finished run streams what it had
done first, then what it does now, and the replayed events equal those the first drive streamed. Text
deltas from a `StreamingModel` are not journaled (the whole turn is), so they are never replayed.

Only the records of the segment being driven are streamed (a thread's earlier messages are history).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import RunHalted
from ._journal import Journal
from ._messages import AssistantMessage, TextDelta, ToolCall
from ._records import ModelTurn, OutputRetry, Record, Segment, ToolResult
from ._store import Entry, Store

__all__ = [
    "Finished",
    "Halted",
    "ModelTurnEvent",
    "OutputRetried",
    "StreamEvent",
    "ToolCallFinished",
    "ToolCallStarted",
    "WatchedJournal",
    "stream_drive",
]

@dataclass(frozen=True, slots=True)
class ModelTurnEvent:
    """Model turn `turn` was journaled: its text and the tool calls it asks for."""

    run_id: str
    turn: int
    message: AssistantMessage
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A call of a journaled turn is due to run (one event per call, right after its turn's)."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any] | str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A call's result was journaled (what the model will see)."""

    run_id: str
    call_id: str
    tool: str
    result: Any
    is_error: bool
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class OutputRetried:
    """Turn `turn`'s final answer failed output validation; the model was shown `error` and asked again."""

    run_id: str
    turn: int
    error: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Halted:
    """The drive stopped on a halt (`error`: OutcomeUnknown, ApprovalPending or RunSleeping): the last
    event of the stream. The run is not finished; drive it again once the halt is dealt with."""

    run_id: str
    error: RunHalted
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """The run (or the thread's message) ended: `result` is what `run` returns. The last event."""

    run_id: str
    result: Any  # a bide.RunResult (typed loosely: this module sits below the agent's)
    replayed: bool = False


StreamEvent = (
    TextDelta | ModelTurnEvent | ToolCallStarted | ToolCallFinished | OutputRetried | Halted | Finished
)
Sink = Callable[[StreamEvent], None]


def _call_turn(call_id: str) -> int:
    """The turn of a call id `c<turn>.<index>` (-1 for one that is not)."""
    head = call_id[1:].partition(".")[0]
    return int(head) if call_id.startswith("c") and head.isdigit() else -1


def events_of(
    run_id: str, record: Record, first_turn: int, stop: int | None, replayed: bool
) -> list[StreamEvent]:
    """The events a journaled record stands for in a drive of the segment of turns `first_turn` up to
    `stop` (None: all from `first_turn` on)."""

    def ours(turn: int) -> bool:
        return turn >= first_turn and (stop is None or turn < stop)

    if isinstance(record, ModelTurn):
        if not ours(record.turn):
            return []
        out: list[StreamEvent] = [ModelTurnEvent(run_id, record.turn, record.message, replayed)]
        calls: list[ToolCall] = record.message.tool_calls
        for c in calls:
            out.append(ToolCallStarted(run_id, c.call_id, c.name, c.arguments, replayed))
        return out
    if isinstance(record, ToolResult):
        if not ours(_call_turn(record.call_id)):
            return []
        return [
            ToolCallFinished(run_id, record.call_id, record.tool, record.result, record.is_error, replayed)
        ]
    if isinstance(record, OutputRetry) and ours(record.turn):
        return [OutputRetried(run_id, record.turn, record.error, replayed)]
    return []


class WatchedJournal(Journal):
    """A journal that hands the events of every record it takes in to `sink`, in seq order.

    Records taken in before `begin(first_turn)` (the load with the lease) are replayed, and so are those
    another driver wrote, loaded later; those this drive writes are live. Only the drive's own segment is
    streamed: a thread's next message (its `seg:<k>` record, loaded after another driver answered this one
    and went on) ends it."""

    __slots__ = ("_first_turn", "_fresh", "_sent", "_stop", "sink")

    def __init__(self, store: Store, run_id: str, sink: Sink) -> None:
        super().__init__(store, run_id)
        self.sink = sink
        self._fresh: list[tuple[str, Record | None]] = []  # a record kept without its decoded form: ours
        self._sent: dict[str, Record] = {}  # records of the write in progress, by key
        self._first_turn: int | None = None
        self._stop: int | None = None

    def _items(self, records: Sequence[Record]) -> tuple[tuple[str, bytes], ...]:
        # The records of a write, so that the events of those the store took need not be decoded again.
        for r in records:
            self._sent[r.key] = r
        return super()._items(records)

    def _keep(self, entry: Entry, rec: Record | None) -> None:
        super()._keep(entry, rec)
        # A record kept without its decoded form is one this journal wrote (or the header); `_flush` looks
        # it up in `_sent`.
        self._fresh.append((entry.key, rec))

    def begin(self, first_turn: int, stop: int | None = None) -> None:
        """The drive knows its segment (turns `first_turn` up to `stop`): stream the records loaded so far
        as replayed."""
        if self._first_turn is None:
            self._first_turn = first_turn
            self._stop = stop
            self._flush(True)

    def _flush(self, replayed: bool = False) -> None:
        first = self._first_turn
        if first is None or not self._fresh:
            return
        rows = self._rows
        fresh = sorted(self._fresh, key=lambda kr: rows[kr[0]][0])
        self._fresh.clear()
        sent = self._sent
        for key, record in fresh:
            theirs = record is not None
            if record is None:
                record = sent.get(key)
                if record is None:
                    record = self.get(key)
            if isinstance(record, Segment) and record.turn > first:
                # A later message of the thread: this drive's segment ends where it starts.
                if self._stop is None or record.turn < self._stop:
                    self._stop = record.turn
                continue
            if record is not None:
                for event in events_of(self.run_id, record, first, self._stop, replayed or theirs):
                    self.sink(event)
        sent.clear()

    async def aload(self) -> Journal:
        await super().aload()
        self._flush()
        return self

    async def awrite(self, records: Sequence[Record]) -> list[tuple[Record, bool]]:
        out = await super().awrite(records)
        self._flush()
        return out

    async def awrite_one(self, record: Record) -> tuple[Record, bool]:
        out = await super().awrite_one(record)
        self._flush()
        return out

    async def awrite_exclusive(self, records: Sequence[Record]) -> bool:
        out = await super().awrite_exclusive(records)
        self._flush()
        return out


_END = object()


async def stream_drive(run_id: str, drive: Callable[[Sink], Awaitable[Any]]) -> AsyncIterator[StreamEvent]:
    """Run `drive(sink)` in a task and yield what it puts in `sink`, then `Finished` (or `Halted`).

    Leaving the iteration early (break, cancellation, aclose) cancels the drive: what it journaled stays,
    and a later drive resumes from there, as after any interrupted drive."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    put = queue.put_nowait
    escaped: list[SystemExit | KeyboardInterrupt] = []

    async def run() -> None:
        try:
            result = await drive(put)
            put(Finished(run_id, result, bool(getattr(result, "replayed", False))))
        except RunHalted as halt:
            put(Halted(run_id, halt))
        except (SystemExit, KeyboardInterrupt) as exc:
            # A task lets these out of the event loop, past every other drive in it (a tool's sys.exit()):
            # the iteration raises them instead, as `Agent.run` does.
            escaped.append(exc)
        finally:
            put(_END)

    task = asyncio.create_task(run(), name=f"bide-stream:{run_id}")
    try:
        while True:
            item = await queue.get()
            if item is _END:
                break
            yield item  # type: ignore[misc]  # only StreamEvents are put besides _END
        await task  # re-raises what the drive raised (halts were turned into events)
        if escaped:
            raise escaped[0]
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # what the drive journaled stays; a later drive resumes from there
