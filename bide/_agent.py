"""The agent loop: model turns and tool calls, each journaled, resumed from the journal after a crash.

One drive of `Agent.run(run_id, input)` (or of a thread's message, `Agent.thread(id).send(message)`):

0. Take the run's lease (docs/guarantee.md): another live driver's lease means `RunInFlight` (after
   waiting up to `lease_wait`). Every write of the drive is fenced by the lease's token.
1. Load the run's journal (in the same round trip as the lease) and check its start: an existing run with
   another input or entry point is refused (`RunMismatch`). A new run's start (input and entry point) is
   journaled together with its first turn, so a run exists in the journal from its first turn on.
2. A finished run returns its journaled answer; the model is not called.
3. Replay: every journaled model turn and tool result is reused, never redone.
4. Loop: run the last turn's calls that have no result; then ask the model for the next turn. A new turn
   is journaled before anything acts on it, in one all-or-nothing write with what depends on it: with the
   end record for a final answer, with the first side effect's attempt marker, else on its own (always on
   its own when several calls then run at once: up to `max_parallel` calls of a turn run concurrently, each
   under the claim protocol of its own, each result journaled when its call returns, and a halt raised
   only once every call of the turn has ended). If another
   driver journaled that turn first, nothing of ours is written and the drive goes on with the journal's.

Side effects follow the claim protocol (see docs/guarantee.md): attempt marker with a fresh claim id, call
only under our own stored claim and only inside the marker's window, record the result. A marker without a
result halts with `OutcomeUnknown` unless a reconciler decides it, or this process knows the call never
started. A lost write race reloads the journal before anything is decided.

A conversation thread is one run (entry point `thread:<name>`) in segments: message 0 is the start's
input, message k (from 1) is a `seg:<k>` record written with the segment's first turn; segment k ends with
`seg:<k>:end` (the run stays open: `run:end` would seal it) and its turns follow the earlier ones' turn
numbers, so every call id stays unique in the run. A drive of segment k replays segments 0..k-1 from the
journal as history and drives segment k exactly as a run is driven; a cancel ends (seals) the thread.

With an `output_type`, a final answer that does not validate is journaled with an `OutputRetry` record
(what the model is told) in the same write as its turn, and the model is asked again, `output_retries`
times at most; then the run (or segment) ends with status "failed" (`OutputInvalid`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import inspect
import json
import math
import re
import shlex
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, cast

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypeVar

from ._blocking import run_blocking
from ._cancel import cancelled_answer
from ._canonical import canonical_json, known_json_text, new_claim, utf8_text
from ._errors import (
    ApprovalPending,
    BideError,
    CallInDoubt,
    ConfigError,
    HaltAlreadyResolved,
    LeaseLost,
    ModelError,
    NotCalled,
    OutcomeUnknown,
    OutputInvalid,
    ResultNotJournaled,
    RunInFlight,
    RunLimitExceeded,
    RunMismatch,
    RunNotFound,
    RunSleeping,
    StoreError,
    ToolError,
    ToolNotStarted,
    WriteRefused,
)
from ._gate import Approved, Denied, GateJournal, GateRequest, Pending
from ._inflight import (
    CallWindow,
    forget_returned,
    forget_started,
    never_started,
    remember_returned,
    remember_unstarted,
    returned,
    running,
)
from ._journal import Journal, check_run_id
from ._lease import Overrun, free_lease, free_unfreed, hold_lease, let_go, record_when_done
from ._messages import (
    MAX_TOOL_CALLS,
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    StreamingModel,
    SystemMessage,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from ._outcome import Outcome
from ._records import (
    CANCEL_KEY,
    END_KEY,
    START_KEY,
    Attempt,
    Cancel,
    End,
    ModelTurn,
    NotStarted,
    OutputRetry,
    Pause,
    Record,
    Segment,
    Start,
    Timer,
    ToolResult,
    attempt_key,
    decode_record,
    encode_new_turn,
    model_key,
    not_started_key,
    pause_key,
    result_key,
    retry_key,
    segment_end_key,
    segment_key,
    timer_key,
)
from ._resolve import DEFAULT_CLOCK_SKEW, attempts_of, live_attempt, resolve_in
from ._store import BlockingStore, Fence, Finishing, Lease, Store, finish_before_close, taking_lease
from ._stream import Sink, StreamEvent, WatchedJournal, stream_drive
from ._telemetry import model_call, run_failed, run_loaded, run_watch
from ._timers import DEFAULT_INLINE, TimerTool
from ._tools import (
    CANCEL_SWALLOWED,
    AttemptInfo,
    CallContext,
    ReadOnly,
    SideEffect,
    StrayCancellation,
    ThreadHandoff,
    Tool,
    ToolArgumentsInvalid,
    idempotency_key_for,
    journal_safe,
    run_apart,
    stray_cancellation,
)
from ._when import iso, seconds, when

__all__ = ["Agent", "RunResult", "Thread"]

DEFAULT_LEASE_TTL = 30.0
DEFAULT_MAX_PARALLEL = 8

T = TypeVar("T", covariant=True, default=str)
_NO_OUTPUT: Any = None  # the output of a cancelled run with an output_type


@dataclass(slots=True)
class RunResult(Generic[T]):
    """A finished run: its final `answer`. `replayed` is True when the run had already finished before this
    call and the answer came from the journal without calling the model. `status` is "completed", or
    "cancelled" for a run ended by a cancel request (`bide.cancel_run`; its answer says so). `usage` sums the
    tokens of the run's journaled model turns, as their providers reported them (a replayed run reports the
    same).

    `output` is the answer validated against the agent's `output_type` (the answer text itself for an agent
    without one; None for a cancelled run). `turns` counts the model turns of this run (of this message, for
    a thread), and `segment` is the index of the thread's message it answers (0 for a run)."""

    run_id: str
    answer: str
    turns: int
    replayed: bool = False
    status: str = "completed"
    output: T = _NO_OUTPUT
    segment: int = 0
    usage: Usage = Usage()  # noqa: RUF009 (a frozen value)


@dataclass(slots=True)  # not frozen: a frozen dataclass is slower to make, per drive
class _Ask:
    """What a drive was asked for: a run's input, a thread's message (`segment`: its expected index, if the
    caller knows it), or (input None) the thread's unfinished message. Changed only while the drive waits
    for the lease (see `_pin_unfinished`), never after."""

    input: str | None
    thread: bool = False
    segment: int | None = None


@dataclass(slots=True)
class _Segment:
    """The part of a run one drive drives: a whole run, or one message of a thread (turns from
    `first_turn`; `stop` is the next segment's first turn, for earlier segments). `open_key` is the record
    that opens it (a run's start, a message's `seg:<k>`), `end_key` the one that ends it."""

    index: int
    input: str
    first_turn: int
    thread: bool
    stop: int | None = None
    open_key: str = START_KEY
    end_key: str = END_KEY

    def __post_init__(self) -> None:
        if self.index:
            self.open_key = segment_key(self.index)
        if self.thread:
            self.end_key = segment_end_key(self.index)


class Agent(Generic[T]):
    """A durable agent: `model`, `tools` and a `system` prompt over a journal in `store`.

    `name` is the run's entry point: a run started by one agent name cannot be resumed by another.
    `max_turns` bounds the model turns of a run (journaled turns count; per message, for a thread).
    `clock_skew` (seconds) is the margin a reconciler waits past an attempt's deadline before deciding it;
    the agent's attempt markers record it, and whoever decides their calls (a person's resolution, another
    agent) waits at least that long too. `clock` (Unix seconds) stamps attempt markers, leases, and judges
    their age.

    `output_type` (a pydantic model, or any type pydantic validates) makes the final answer structured: the
    model is told the JSON schema (in the system prompt), its final answer is validated, and a failure is
    shown to the model, which is asked again up to `output_retries` times (each retry journaled); the
    validated value is `RunResult.output`.

    A drive holds the run's lease (see docs/guarantee.md) for `lease_ttl` seconds, renewed every third of
    it while it drives. A drive that finds the lease held by another live driver waits up to `lease_wait`
    seconds for it (returning the run's answer if that driver finishes it meanwhile), then raises
    `RunInFlight`.

    A drive honours a cancel request (`bide.cancel_run`) at a turn boundary: it looks for one when it
    starts and then, at each boundary, once `cancel_check` seconds have passed since it last looked (0:
    at every boundary; a drive that finishes sooner never pays for the look).

    The calls of one model turn run concurrently, at most `max_parallel` at a time (1: one after another,
    stopping at the first halt); see docs/bide.md, "Parallel tool calls".
    """

    def __init__(
        self,
        model: Model,
        *,
        store: Store,
        tools: Iterable[Tool] = (),
        system: str = "",
        name: str = "agent",
        max_turns: int = 32,
        clock_skew: float = DEFAULT_CLOCK_SKEW,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        lease_wait: float = 0.0,
        cancel_check: float = 0.5,
        max_parallel: int = DEFAULT_MAX_PARALLEL,
        output_type: type[T] | None = None,
        output_retries: int = 2,
    ) -> None:
        if not callable(getattr(model, "complete", None)):
            raise ConfigError("model must have an async complete(request) method (see bide.Model)")
        lease_ttl = seconds("lease_ttl", lease_ttl, zero=False)
        lease_wait = seconds("lease_wait", lease_wait)
        clock_skew = seconds("clock_skew", clock_skew)
        cancel_check = seconds("cancel_check", cancel_check)
        if not (isinstance(max_turns, int) and not isinstance(max_turns, bool) and max_turns >= 1):
            raise ConfigError(f"max_turns must be a whole number, 1 or more; got {max_turns!r}")
        if not (isinstance(max_parallel, int) and not isinstance(max_parallel, bool) and max_parallel >= 1):
            raise ConfigError(
                "max_parallel must be a whole number, 1 or more (1: calls run one after another)"
            )
        if not (isinstance(output_retries, int) and output_retries >= 0):
            raise ConfigError("output_retries must be a whole number, 0 or more")
        if not isinstance(store, BlockingStore):  # a BlockingStore defines every method asked for here
            for method in ("ainsert_many", "aload", "alease", "arelease", "insert_many", "load", "lease"):
                if not callable(getattr(store, method, None)):
                    raise ConfigError("store must be a bide store (use bide.open_store(url))")
        self.model = model
        self.store = store
        self.system = system
        self.name = name
        self.max_turns = max_turns
        self.clock_skew = clock_skew
        self.clock = clock
        self.lease_ttl = lease_ttl
        self.lease_wait = lease_wait
        self.cancel_check = cancel_check
        self.max_parallel = max_parallel
        self.output_type = output_type
        self.output_retries = output_retries
        self._output: TypeAdapter[Any] | None = None
        self._output_prompt = ""
        if output_type is not None and output_type is not str:  # str: the answer's text as it is
            try:
                self._output = TypeAdapter(output_type)
                schema = json.dumps(self._output.json_schema(), sort_keys=True, separators=(",", ":"))
            except Exception as exc:
                raise ConfigError(
                    f"output_type {output_type!r} is not a type pydantic can validate and describe ({exc}); "
                    "use a pydantic model or a plain type"
                ) from exc
            self._output_prompt = (
                "Your final answer (a reply without tool calls) must be only a JSON value, with no other "
                f"text, matching this JSON schema: {schema}"
            )
        self._streams = callable(getattr(model, "stream", None))
        # A store whose async lease and load are BlockingStore's own (they call the blocking forms) is asked
        # directly: the same answers, without a coroutine per request.
        kind: Any = type(store)
        direct = (
            isinstance(store, BlockingStore)
            and kind.alease is BlockingStore.alease
            and kind.aload is BlockingStore.aload
        )
        self._direct_store: Store | None = store if direct else None
        # Synchronous calls running past their deadline, by (run id, fence) of the drive that started them.
        self._overruns: dict[tuple[str, Fence | None], list[Overrun]] = {}
        self.tools: dict[str, Tool] = {}
        specs: list[ToolSpec] = []  # gathered in the same loop: no generator frame per agent
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(f"{t!r} is not a bide tool; decorate it with @bide.tool")
            if t.name in self.tools:
                raise ConfigError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
            specs.append(t.spec)
        self._specs = tuple(specs)
        self._system_message: SystemMessage | None = None

    @property
    def entry(self) -> str:
        return f"agent:{self.name}"

    @property
    def thread_entry(self) -> str:
        """The entry point of this agent's conversation threads."""
        return f"thread:{self.name}"

    def run_sync(self, run_id: str, input: str) -> RunResult[T]:
        """`run` for synchronous code. Refused (`ConfigError`) inside a running event loop (an async
        function, Jupyter): use `await agent.run(...)` there."""
        return run_blocking(lambda: self.run(run_id, input), "run_sync", "await agent.run(...)")

    async def run(self, run_id: str, input: str) -> RunResult[T]:
        """Drive the run to its answer, resuming from the journal; see the module docstring.

        Returns a `RunResult` only for a completed run. Raises `OutcomeUnknown` (a side effect's outcome
        was lost) or `ApprovalPending` (a gate has not approved yet): both are `RunHalted`, never success.
        Logged on the "bide" logger, traced as an OpenTelemetry span when a tracer provider is set
        (bide._telemetry).
        """
        return await self._run(run_id, _Ask(_text(input, "input")), None)

    def stream(self, run_id: str, input: str) -> AsyncIterator[StreamEvent]:
        """`run`, as the events it journals: `async for event in agent.stream(run_id, input)`.

        Yields `ModelTurnEvent`, `ToolCallStarted`, `ToolCallFinished` and `OutputRetried` as their records
        are journaled (`replayed=True` for those journaled by an earlier drive), `TextDelta`s while a
        `StreamingModel` writes a turn (never journaled, never replayed), and last `Finished` (its
        `result` is what `run` returns) or `Halted` (the halt `run` would raise). Other errors are raised.
        Leaving the loop early cancels the drive; a later `run` resumes it from the journal. Use
        `contextlib.aclosing` to have it cancelled at once rather than when the iterator is collected."""
        ask = _Ask(_text(input, "input"))
        check_run_id(run_id)
        return stream_drive(run_id, lambda sink: self._run(run_id, ask, sink))

    def thread(self, thread_id: str) -> Thread[T]:
        """The conversation thread `thread_id`: many user messages, one journal (see `Thread`)."""
        return Thread(self, check_run_id(thread_id))

    async def _run(
        self, run_id: str, ask: _Ask, sink: Sink | None, journal: Journal | None = None
    ) -> RunResult[T]:
        """One drive of a run or of a thread's message, under the run's lease, logged and traced
        (bide._telemetry). One coroutine holds the lease and the telemetry: every live run holds one object
        fewer than with a wrapper around the drive. `journal`: the run's journal as an earlier drive in this
        process left it (only the records written since are read), else a new one."""
        watch = run_watch(self, run_id)  # None when nobody listens below WARNING
        held = -1  # the lease this drive holds (a number from hold_lease), once it holds one
        ended = False  # the run ended: nothing can be written to it, no need to free the lease
        if journal is None and sink is not None:
            journal = WatchedJournal(self.store, run_id, sink)
        elif journal is None:
            journal = Journal(self.store, run_id)
        try:
            lease = await self._take_lease(journal, ask)
            if lease is None:  # the run had ended: its answer, from the journal
                result = self._sealed(journal, ask)
            else:
                held = hold_lease(self.store, lease, self.lease_ttl, self.clock)
                del lease  # a live run holds no lease object: the registry's entry is atomic values
                if watch is not None:  # the watch of this run, current in this task: it logs the start
                    run_loaded(journal)
                try:
                    result = await self._drive(journal, ask, sink)
                except WriteRefused as refused:
                    # Another driver took the lease over, or ended the run: see what the journal says now
                    # about the segment this drive drove (found from the journal as the drive left it).
                    driven = self._driven(journal, ask)
                    await journal.aload()
                    try:
                        result = self._after_takeover(journal, ask, driven, f"{refused}")
                    except RunInFlight as taken:
                        undecided = [
                            lost
                            for lost in _lost_after_calls(refused)
                            if not journal.has(result_key(lost.result.call_id))
                        ]
                        if not undecided:
                            raise
                        raise self._result_not_journaled(journal.run_id, undecided, taken) from refused
                except OutcomeUnknown as halt:
                    # A halt decided from this drive's view of the call. If another driver took the run
                    # over meanwhile (this process was paused past its lease) and decided the call, which
                    # claims a newer attempt, the halt is stale: the run's answer is that driver's. (An
                    # outcome this process journaled for its own attempt, a call that overran and then
                    # returned, leaves the halt as it is: this drive stopped there.)
                    driven = self._driven(journal, ask)
                    try:
                        await journal.aload()
                    except StoreError:
                        raise halt from None  # the halt stands: it needs a person, not a retry
                    attempts = attempts_of(journal, halt.call_id)
                    decided = journal.has(result_key(halt.call_id))
                    if not decided or not attempts or attempts[-1].gen <= halt.attempt:
                        raise
                    why = f"it decided call {halt.call_id!r}, on which this drive halted"
                    result = self._after_takeover(journal, ask, driven, why)
                # A run that ended needs no lease; a thread waiting for its next message hands it back.
                ended = not ask.thread or journal.has(END_KEY)
        except BaseException as exc:
            run_failed(watch, self.name, run_id, exc)
            raise
        finally:
            if held >= 0:
                overrun = self._overruns.pop((run_id, journal.fence), None) if self._overruns else None
                release = let_go(held, ended=ended, overrun=overrun)
                if release is not None:
                    await release
        if watch is not None:
            watch.finished(result)
        return result

    def _driven(self, journal: Journal, ask: _Ask) -> _Segment | None:
        """The segment a drive of `ask` drove, from the journal as the drive left it (None: unclear)."""
        try:
            return self._segment(journal, ask)
        except BideError:
            return None

    def _after_takeover(
        self, journal: Journal, ask: _Ask, driven: _Segment | None, why: str
    ) -> RunResult[T]:
        """What a drive that another driver took over (`why`: what shows it) returns, from the journal
        reloaded since: the answer the other driver journaled for the segment this drive drove (`driven`),
        or RunInFlight while it has none. A thread's message is matched by its index and its text: the
        thread's next message, sent again without its index, would be a new one."""
        if driven is None:
            if not journal.has(END_KEY):
                raise self._taken_over(journal.run_id, why)
            return self._sealed(journal, ask)
        seg: _Segment | None = driven
        if driven.thread and journal.has(START_KEY):
            segs = _segments(journal)
            k = driven.index
            seg = segs[k] if k < len(segs) and segs[k].input == driven.input else None
        if seg is not None and journal.has(seg.open_key):
            end = self._end_of(journal, seg)
            if end is not None:
                return self._ended_result(journal, seg, end, replayed=True)
        elif driven.thread and journal.has(END_KEY):
            raise _thread_ended(journal)
        raise self._taken_over(journal.run_id, why)

    def _result_not_journaled(
        self, run_id: str, lost: list[_LostAfterCall], taken: RunInFlight
    ) -> ResultNotJournaled:
        """What a drive taken over after side-effect calls returned raises: the first call's result, and
        what a person resolving the other driver's halt on it needs (the others' are in notes)."""
        first, result = lost[0], lost[0].result
        how = _resolve_option(result)
        error = ResultNotJournaled(
            f"run {run_id!r}: side-effect call {result.call_id!r} ({result.tool}) ran and returned "
            f"{_shown_result(result)}, but another driver took over the run's lease before its result was "
            "journaled (this process was paused past its lease, or its write waited on the store); "
            "nothing more was written by this drive. The other driver halts the run on the call with "
            "OutcomeUnknown: resolve it with what the call returned (bide resolve --store URL "
            f"{how} --attempt {first.attempt} -- {shlex.quote(run_id)} {shlex.quote(result.call_id)}, or "
            "bide.resolve_halt), or, once that "
            "driver's lease is gone, run the run again here, which journals it (this process keeps it) "
            f"without calling the tool again. Earliest retry: {when(taken.retry_after, self.clock())}",
            run_id=run_id,
            retry_after=taken.retry_after,
            call_id=result.call_id,
            tool=result.tool,
            attempt=first.attempt,
            returned=result.result,
            is_error=result.is_error,
        )
        for other in lost[1:]:
            error.add_note(
                f"also: call {other.result.call_id!r} ({other.result.tool}) ran and returned "
                f"{_shown_result(other.result)}, its result not journaled either (attempt {other.attempt})"
            )
        return error

    def _taken_over(self, run_id: str, why: str) -> RunInFlight:
        now = self.clock()
        return RunInFlight(
            f"run {run_id!r} is being driven by another driver, which took over this drive's lease "
            f"({why}); nothing more was written by this drive. Run it again after "
            f"{when(now + self.lease_ttl, now)}",
            run_id=run_id,
            holder=None,
            expires_at=None,
            retry_after=now + self.lease_ttl,
        )

    def _sealed(self, journal: Journal, ask: _Ask) -> RunResult[T]:
        """The result of a run that holds `run:end` (a thread that holds it takes no more messages)."""
        seg = self._segment(journal, ask)
        if isinstance(journal, WatchedJournal):
            journal.begin(seg.first_turn, seg.stop)
        if not seg.thread or journal.has(seg.open_key):
            return self._result_of(journal, seg, replayed=True)
        raise _thread_ended(journal)

    def _result_of(self, journal: Journal, seg: _Segment, *, replayed: bool) -> RunResult[T]:
        end = self._end_of(journal, seg)
        assert end is not None
        return self._ended_result(journal, seg, end, replayed=replayed)

    def _end_of(self, journal: Journal, seg: _Segment) -> End | None:
        """The segment's end record, or a thread's `run:end` (it ended the thread and so the segment)."""
        end = journal.get(seg.end_key)
        if end is None and seg.thread:
            end = journal.get(END_KEY)
        return end if isinstance(end, End) else None

    def _ended_result(
        self,
        journal: Journal,
        seg: _Segment,
        end: End,
        *,
        replayed: bool,
        output: Any = None,
        turns: int = -1,
        usage: Usage | None = None,
    ) -> RunResult[T]:
        """The RunResult of a segment that ended with `end` (OutputInvalid for one that failed).
        `output` is the validated answer, `turns` the segment's turns and `usage` their tokens when the
        caller has them."""
        run_id = journal.run_id
        if end.status == "failed":
            raise OutputInvalid(f"run {run_id!r}{_of(seg)} ended without a valid answer: {end.answer}")
        if end.status != "completed":
            output = None if self._output is not None else end.answer
        elif self._output is None:
            output = end.answer
        elif output is None:
            ok, output, error = self._validate(end.answer)
            if not ok:
                raise OutputInvalid(
                    f"run {run_id!r}{_of(seg)} ended with an answer that does not validate against this "
                    f"agent's output_type ({error}); was output_type changed since? Read result.answer "
                    "with the type the run was made for"
                )
        if turns < 0:
            turns = _count_turns(journal, seg.first_turn, seg.stop)
        if usage is None:
            usage = _usage(journal, seg.first_turn, seg.stop)
        return RunResult(run_id, end.answer, turns, replayed, end.status, output, seg.index, usage)

    def _validate(self, text: str) -> tuple[bool, Any, str]:
        """(True, value, "") when `text` validates against output_type, else (False, None, the error)."""
        adapter = self._output
        assert adapter is not None
        body = text.strip()
        if body.startswith("```") and body.endswith("```") and len(body) >= 6:
            body = body[3:-3]
            body = body.partition("\n")[2] if "\n" in body else body  # drop a ```json language tag
        try:
            return True, adapter.validate_json(body), ""
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            parts = [f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in errors[:8]]
            return False, None, "; ".join(parts)

    def _final(self, seg: _Segment, turn: int, text: str, retries: int) -> tuple[End | OutputRetry, Any]:
        """What a final answer of turn `turn` is journaled with: the segment's end (and its validated
        output), or an output retry while retries are left, or a failed end."""
        if self._output is None:
            return End(key=seg.end_key, answer=text), text
        ok, value, error = self._validate(text)
        if ok:
            return End(key=seg.end_key, answer=text), value
        if retries < self.output_retries:
            feedback = (
                f"Your final answer is not valid: {error}. Answer again with only a JSON value matching the "
                "schema."
            )
            return OutputRetry(key=retry_key(turn), turn=turn, error=feedback), None
        answer = (
            f"the model's final answer failed validation against output_type {retries + 1} times "
            f"(output_retries={self.output_retries}); the last error: {error}"
        )
        return End(key=seg.end_key, status="failed", answer=answer), None

    async def _take_lease(self, journal: Journal, ask: _Ask) -> Lease | None:
        """Take the run's lease and load the journal as of the grant (None: the run has ended). Waits up to
        `lease_wait` for a live lease of another driver, then raises RunInFlight."""
        run_id = journal.run_id
        await free_unfreed(self.store, run_id)
        holder = new_claim()
        now = self.clock()
        give_up = time.monotonic() + self.lease_wait  # a local wait: a wall clock step must not stretch it
        pause = 0.01
        while True:
            now_ms, ttl_ms = taking_lease(now, self.lease_ttl, self.clock_skew)
            if self.store is self._direct_store:
                # An in-process store answers at once: no coroutine for either request.
                lease = self.store.lease(run_id, holder, now_ms=now_ms, ttl_ms=ttl_ms)
                try:
                    entries = self.store.load(run_id, journal.last_seq)
                    if entries:  # none for a new run
                        journal.absorb(entries)
                except BaseException:
                    if lease.held:  # nobody drives the run: later drives must not wait for this lease
                        with contextlib.suppress(Exception):
                            self.store.release(run_id, holder, lease.token)
                    raise
            else:
                # Both requests go out together; the store answers the load as of the grant or later.
                granted = self.store.alease(run_id, holder, now_ms=now_ms, ttl_ms=ttl_ms)
                loaded = self.store.aload(run_id, journal.last_seq)
                try:
                    lease = await granted
                except BaseException:
                    _abandon(loaded)
                    raise
                try:
                    journal.absorb(await loaded)
                except BaseException:
                    # Granted, then the load failed or the drive was cancelled: nobody drives the run, so
                    # the lease is freed now rather than left to expire (later drives would wait for it).
                    if lease.held:
                        await free_lease(self.store, lease)
                    raise
            if journal.has(END_KEY):
                return None
            if lease.held:
                journal.fence = (holder, lease.token)
                return lease
            if journal.has(START_KEY):
                # A run's start never changes: a drive it refuses (another input, another agent, a thread
                # for a run) is refused now, not after waiting for the other driver to let go.
                if ask.thread:
                    self._check_thread(journal)
                else:
                    assert ask.input is not None
                    self._check_start(journal, ask.input)
            _pin_unfinished(journal, ask)
            left = give_up - time.monotonic()
            if left <= 0:
                raise self._in_flight(run_id, lease, self.clock(), ask)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 1.0)
            now = self.clock()

    def _in_flight(self, run_id: str, lease: Lease, now: float, ask: _Ask) -> RunInFlight:
        """What a drive raises when another driver's live lease outlasted its `lease_wait`."""
        expires = lease.expires_ms / 1000
        again = "Run it again later"
        if ask.thread and ask.input is not None and ask.segment is not None:
            # Sent again without its index once answered, the text would be a new message, answered twice.
            again = f"Send it again later with segment={ask.segment} (its answer, once given, is returned)"
        return RunInFlight(
            f"run {run_id!r} is being driven by another driver (lease holder {lease.holder}, token "
            f"{lease.token}, expires {when(expires, now)} unless renewed, free {self.clock_skew:g} s "
            f"later: the clock skew margin); nothing was done. {again}, or give the agent a lease_wait "
            "to wait for it",
            run_id=run_id,
            holder=lease.holder,
            expires_at=expires,
            retry_after=min(expires + self.clock_skew, now + self.lease_ttl / 3),
        )

    # -- segments (a run is one; a thread has one per message) ---------------------------------------------

    def _segment(self, journal: Journal, ask: _Ask) -> _Segment:
        """The segment a drive of `ask` is about (one that has ended, for a message already answered)."""
        run_id = journal.run_id
        start = journal.get(START_KEY)
        if not ask.thread:
            assert ask.input is not None
            if start is not None:
                self._check_start(journal, ask.input)
            return _Segment(0, ask.input, 0, False)
        if start is None:
            if ask.input is None:
                raise RunNotFound(f"thread {run_id!r} has no message yet; send it one (thread.send)")
            if ask.segment not in (None, 0):
                raise RunMismatch(
                    f"thread {run_id!r} has no message yet, so the next one is segment 0, not {ask.segment}"
                )
            return _Segment(0, ask.input, 0, True)
        self._check_thread(journal)
        segs = _segments(journal)
        last = segs[-1]
        done = journal.has(last.end_key)
        if ask.input is None:
            return last
        if ask.segment is not None and ask.segment < len(segs):
            seg = segs[ask.segment]
            if seg.input != ask.input:
                raise RunMismatch(
                    f"message {seg.index} of thread {run_id!r} is {seg.input[:80]!r}, not this one; send new "
                    f"messages as segment {len(segs) if done else last.index + 1} once the thread is idle"
                )
            return seg
        if not done:
            if last.input == ask.input and ask.segment is None:
                return last  # the message being answered, sent again: resume it
            if journal.has(END_KEY):  # cancelled while it answered: the thread ended there
                raise _thread_ended(journal)
            raise RunMismatch(
                f"thread {run_id!r} is still answering message {last.index} ({last.input[:80]!r}); resume it "
                "(thread.resume(), or send that message again) before sending another"
            )
        if ask.segment is not None and ask.segment != len(segs):
            raise RunMismatch(f"thread {run_id!r} has {len(segs)} messages: the next is segment {len(segs)}")
        return _Segment(len(segs), ask.input, _count_turns(journal, 0, None), True)

    def _system(self) -> SystemMessage | None:
        text = self.system
        if self._output_prompt:
            text = f"{text}\n\n{self._output_prompt}" if text else self._output_prompt
        if not text:
            return None
        system = self._system_message
        if system is None or system.content != text:  # one message serves all runs
            system = self._system_message = SystemMessage(content=text)
        return system

    def _history(self, journal: Journal, seg: _Segment) -> list[Message]:
        """The messages a drive of `seg` starts from: the system prompt, the thread's earlier messages and
        their turns (from the journal), and the segment's own user message."""
        messages: list[Message] = []
        system = self._system()
        if system is not None:
            messages.append(system)
        if seg.index:
            for prev in _segments(journal)[: seg.index]:
                stop = prev.stop if prev.stop is not None else seg.first_turn
                _replay_segment(journal, prev, stop, messages)
        messages.append(UserMessage(content=seg.input))
        return messages

    async def _stream_turn(self, request: ModelRequest, sink: Sink) -> object:
        """Ask a streaming model for a turn, handing its text deltas to `sink`; returns the final message."""
        final: object = None
        async for item in cast(StreamingModel, self.model).stream(request):
            if isinstance(item, TextDelta):
                sink(item)
            elif final is None:
                final = item
            else:
                raise ModelError(
                    f"model {getattr(self.model, 'name', '?')!r} streamed more than one final message"
                )
        if final is None:
            raise ModelError(
                f"model {getattr(self.model, 'name', '?')!r} ended its stream without the final "
                "AssistantMessage"
            )
        return final

    async def _drive(self, journal: Journal, ask: _Ask, sink: Sink | None) -> RunResult[T]:
        """The drive proper, under the run's lease, from the journal loaded with it."""
        # A tool, a gate or a reconciler that swallows its caller's cancellation (returns, or raises an error
        # of its own) notes it here (`_tools.CANCEL_SWALLOWED`); the drive stops at its next turn or call.
        token = CANCEL_SWALLOWED.set([])
        try:
            return await self._drive_from(journal, ask, sink)
        finally:
            CANCEL_SWALLOWED.reset(token)

    async def _drive_from(self, journal: Journal, ask: _Ask, sink: Sink | None) -> RunResult[T]:
        """`_drive`'s turns, from the journal loaded with the lease."""
        run_id = journal.run_id
        seg = self._segment(journal, ask)
        if isinstance(journal, WatchedJournal):
            journal.begin(seg.first_turn, seg.stop)
        # A new run: the journal loaded with the lease holds no record at all, so the segment has no end, no
        # opening and no turn, and the run no cancel request. The start and the first turn's boundary checks
        # below would all look these up and find nothing: a new run skips them (the common case).
        new_run = not journal.exists
        if not new_run:
            end = self._end_of(journal, seg)
            if end is not None:  # answered before this drive: its answer, from the journal
                cancel = journal.get(CANCEL_KEY)
                if seg.thread and ask.input is None and end.key != END_KEY and isinstance(cancel, Cancel):
                    # Resuming an idle thread that was asked to cancel ends it (so the thread had not
                    # finished before this drive); its last message keeps the answer it was given, which is
                    # what every later resume returns too.
                    await self._end_cancelled(journal, cancel)
                    return self._ended_result(journal, seg, end, replayed=False)
                return self._ended_result(journal, seg, end, replayed=True)
        # A new segment's opening record (a run's start, a thread message's `seg:<k>`) is written with its
        # first turn, in the same all-or-nothing write: a run exists once it has a turn.
        needs_start = new_run or not journal.has(seg.open_key)
        messages = self._history(journal, seg)
        own = len(messages)  # the segment's turns and tool results follow
        turn = seg.first_turn
        retries = 0
        restarts = 0
        first = True
        looked = time.monotonic()
        while True:
            _stop_if_cancelled(run_id)
            if new_run:  # the first turn of a new run: nothing to look up (see above)
                new_run = first = False
                rec = None
            else:
                if needs_start and journal.has(seg.open_key):
                    # The journal shows the opening now: ours was written with our first turn (then
                    # `needs_start` is already False), so this one is another driver's, whose first turn won
                    # the race. It must be this drive's run (and message).
                    self._check_open(journal, seg)
                    needs_start = False
                ended = journal.get(seg.end_key)
                if ended is None and seg.thread:
                    ended = journal.get(END_KEY)  # the thread was cancelled
                if isinstance(ended, End):
                    return self._ended_result(journal, seg, ended, replayed=False)
                # A cancel request is honoured at a turn boundary: from the journal loaded with the lease on
                # the drive's first, then from the store (another process may have written it) once
                # `cancel_check` seconds have passed since the drive last looked.
                cancel = journal.get(CANCEL_KEY)
                if not first and cancel is None and time.monotonic() - looked >= self.cancel_check:
                    cancel = await self._cancel_request(run_id)
                    looked = time.monotonic()
                first = False
                if isinstance(cancel, Cancel):
                    unknown = await self._calls_in_doubt(journal, turn)
                    ended = await self._end_cancelled(journal, cancel, unknown)
                    return self._ended_result(journal, seg, ended, replayed=False)
                rec = journal.get(model_key(turn))
            # A new turn is written together with the first thing that depends on it (its end record, or
            # its first side effect's attempt marker), all or nothing. If another driver wrote this turn
            # first, nothing of ours is written and we go on with the turn the journal holds.
            if isinstance(rec, ModelTurn):
                pending: list[Record] = []
            else:
                if turn - seg.first_turn >= self.max_turns:
                    raise RunLimitExceeded(
                        f"run {run_id!r}{_of(seg)} reached max_turns={self.max_turns} without an answer; "
                        "raise max_turns and run it again"
                    )
                # The model call is awaited here, not in a helper coroutine: one object fewer held by every
                # run while its model thinks.
                request = ModelRequest(run_id=run_id, turn=turn, messages=list(messages), tools=self._specs)
                observed = model_call(self.model, request)
                try:
                    if sink is not None and self._streams:
                        reply: object = await self._stream_turn(request, sink)
                    else:
                        reply = await self.model.complete(request)
                except BaseException as exc:
                    if observed is not None:
                        observed.failed(exc)
                    if isinstance(exc, BideError) or not isinstance(exc, Exception):
                        raise
                    raise self._model_failed(run_id, turn, exc) from exc
                if observed is not None:
                    observed.finished(reply)
                rec = self._model_turn(turn, reply)
                del request, reply  # nothing of the call is held while the turn is journaled
                if not rec.message.tool_calls:
                    msg = rec.message
                    after, output = self._final(seg, turn, msg.content, retries)
                    write = journal.awrite_exclusive([*self._opening(needs_start, seg), rec, after])
                    rec = None  # the records are the write's alone while it is awaited
                    if await write:
                        needs_start = False
                        if isinstance(after, End):
                            turns = turn + 1 - seg.first_turn
                            usage = _usage_of(messages, own, msg)
                            return self._ended_result(
                                journal, seg, after, replayed=False, output=output, turns=turns, usage=usage
                            )
                        messages.append(msg)
                        messages.append(UserMessage(content=after.error))
                        turn += 1
                        retries += 1
                        restarts = 0
                        continue
                    restarts = _restart(run_id, turn, restarts)
                    await journal.aload()  # lost a race: decide nothing from a stale journal
                    continue
                pending = [*self._opening(needs_start, seg), rec]
            msg = rec.message
            rec = None  # live runs keep only what they need while they wait (fewer objects for the GC)
            if not msg.tool_calls:
                retry = journal.get(retry_key(turn))
                if not isinstance(retry, OutputRetry):
                    after, output = self._final(seg, turn, msg.content, retries)
                    stored, _ = await journal.awrite_one(after)
                    if isinstance(stored, End):
                        return self._ended_result(
                            journal, seg, stored, replayed=False, output=output if stored is after else None
                        )
                    assert isinstance(stored, OutputRetry)
                    retry = stored
                messages.append(msg)
                messages.append(UserMessage(content=retry.error))
                turn += 1
                retries += 1
                continue
            fresh = bool(pending)
            results = await self._run_calls(journal, msg, pending)
            # Every call of a fresh turn writes the turn first; this only guards that invariant.
            if results is not None and (not pending or await journal.awrite_exclusive(_drain(pending))):
                if fresh:
                    needs_start = False  # our turn, and with it our opening, is journaled: nothing to check
                messages.append(msg)
                messages.extend(results)
                results = None  # the next model call may be long: hold nothing it does not need
                turn += 1
                restarts = 0
                continue
            restarts = _restart(run_id, turn, restarts)
            await journal.aload()  # lost a race: decide nothing from a stale journal

    async def _wait(
        self, journal: Journal, call: ToolCall, seconds: float | None, inline: float
    ) -> ToolResult:
        """A timer call: journal its wake-up time once, then wait for what is left of it (in the drive when
        it is at most `inline` seconds, else by pausing the run with `RunSleeping`). `seconds` is None for a
        call whose timer is journaled already: its wake-up time is the journal's, whatever the tool says."""
        timer = journal.get(timer_key(call.call_id))
        if not isinstance(timer, Timer):
            assert seconds is not None, "a journaled timer's call is never validated again"
            wake_ms = math.ceil((self.clock() + seconds) * 1000)  # never a moment early
            record = Timer(key=timer_key(call.call_id), call_id=call.call_id, wake_at_ms=wake_ms)
            stored, _ = await journal.awrite_one(record)
            assert isinstance(stored, Timer)
            timer = stored
        wake_at = timer.wake_at_ms / 1000
        now = self.clock()
        left = wake_at - now
        if left > inline:
            raise RunSleeping(
                f"run {journal.run_id!r} sleeps until {when(wake_at, now)} on call "
                f"{call.call_id} ({call.name}); drive it again then (a bide.Worker does): it will not wait "
                "from zero",
                run_id=journal.run_id,
                call_id=call.call_id,
                tool=call.name,
                arguments=call.arguments,
                wake_at=wake_at,
            )
        if left > 0:
            await asyncio.sleep(left)
        safety: str = ReadOnly._value_  # a timer's, whatever tool has the call's name now
        return self._result(call, f"waited until {iso(wake_at)}", is_error=False, safety=safety)

    async def _cancel_request(self, run_id: str) -> Cancel | None:
        entry = await self.store.aget(run_id, CANCEL_KEY)
        if entry is None:
            return None
        record = decode_record(entry.key, entry.data)
        return record if isinstance(record, Cancel) else None

    async def _end_cancelled(
        self, journal: Journal, cancel: Cancel, unknown: list[Attempt] | None = None
    ) -> End:
        """End the run as cancelled; the run's end record (another driver's, if it ended the run first). A
        thread's cancel ends the thread: its `run:end` seals it. The answer names each call of `unknown`
        (attempted, outcome never recorded), so that what may have fired is not lost in a cancelled run."""
        answer = cancelled_answer(cancel)
        for marker in unknown or ():
            args = canonical_json(marker.arguments).decode()
            answer += (
                f" Call {marker.call_id} ({marker.tool} {args}) was attempted at "
                f"{iso(marker.attempted_at_ms / 1000)} and its outcome was never recorded: it fired zero "
                "times or once; check the system of record."
            )
        stored, _ = await journal.awrite_one(End(key=END_KEY, status="cancelled", answer=answer))
        assert isinstance(stored, End)
        return stored

    async def _calls_in_doubt(self, journal: Journal, turn: int) -> list[Attempt]:
        """Before a cancel ends the run: the live attempt markers (no result, not voided) of the calls of
        turn `turn` and the turns journaled after it (a drive that resumes replays them from the segment's
        first), decided first as a drive would: a result this process knows is journaled, an attempt it
        knows never started is voided, a reconciler is asked once the call's deadline has passed. Returns
        those left unknown. Raises `RunInFlight` while one of them may still be running (before its
        deadline plus `clock_skew`, or in this process): ending the run then would let its side effect land
        after the run said it was cancelled, with no record of it."""
        calls: list[ToolCall] = []
        while isinstance(rec := journal.get(model_key(turn)), ModelTurn):
            calls += [c for c in rec.message.tool_calls if not journal.has(result_key(c.call_id))]
            turn += 1
        if not any(journal.has(attempt_key(c.call_id, 0)) for c in calls):
            return []
        await journal.aload()  # decide nothing from a stale journal: another driver may have written since
        unknown: list[Attempt] = []
        busy: list[Attempt] = []
        now, skew = self.clock(), self.clock_skew
        for c in calls:
            live = None if journal.has(result_key(c.call_id)) else live_attempt(journal, c.call_id)
            if live is None:
                continue
            known = returned(live.claim) is not None or never_started(live.claim)
            over_at = live.deadline_ms / 1000 + live.settle_margin(skew)
            if not known and (running(live.claim) is not None or now < over_at):
                busy.append(live)
                continue
            tool = self.tools.get(c.name)
            if tool is None:
                unknown.append(live)
                continue
            try:
                await self._resume_attempt(journal, tool, c, live)
            except (OutcomeUnknown, ConfigError):  # (a reconciler that returned no Outcome: unknown too)
                unknown.append(live)
            except HaltAlreadyResolved:
                pass  # resolved by someone else meanwhile: its result is journaled
        if unknown:
            await journal.aload()  # a result journaled meanwhile (a person's resolution) is no doubt any more
            unknown = [a for a in unknown if not journal.has(result_key(a.call_id))]
        if busy:
            ready = max(a.deadline_ms / 1000 + a.settle_margin(skew) for a in busy)
            first = busy[0]
            raise RunInFlight(
                f"run {journal.run_id!r} was asked to cancel, but its call {first.call_id!r} ({first.tool}) "
                f"may still be running (deadline {when(first.deadline_ms / 1000, now)}, plus "
                f"{first.settle_margin(skew):g} s "
                "clock skew): the run ends as cancelled once it cannot, with that call's result if one is "
                f"recorded by then. Run again after {when(max(ready, now + 1.0), now)}",
                run_id=journal.run_id,
                holder=None,
                expires_at=None,
                retry_after=max(ready, now + 1.0),
            )
        return unknown

    def _opening(self, needs_start: bool, seg: _Segment) -> tuple[Record, ...]:
        """What a fresh turn is journaled after: the run's start record for a run that has none yet, or a
        thread's new message. Made when needed, so no run holds one while it waits."""
        if not needs_start:
            return ()
        if seg.index == 0:
            entry = self.thread_entry if seg.thread else self.entry
            return (Start(key=START_KEY, entry=entry, input=seg.input),)
        return (Segment(key=segment_key(seg.index), index=seg.index, input=seg.input, turn=seg.first_turn),)

    def _check_open(self, journal: Journal, seg: _Segment) -> None:
        """Refuse a drive whose segment another driver opened with another message."""
        if seg.index == 0:
            if not seg.thread:
                self._check_start(journal, seg.input)
                return
            self._check_thread(journal)
            start = journal.get(START_KEY)
            assert isinstance(start, Start)
            if start.input == seg.input:
                return
            other = start.input
        else:
            rec = journal.get(seg.open_key)
            if not isinstance(rec, Segment):
                raise StoreError(f"run {journal.run_id!r}: record {seg.open_key!r} is not a segment record")
            if rec.input == seg.input and rec.turn == seg.first_turn:
                return
            other = rec.input
        raise RunMismatch(
            f"thread {journal.run_id!r}: message {seg.index} was sent by another driver meanwhile "
            f"({other[:80]!r}); send yours again once the thread has answered it"
        )

    def _check_thread(self, journal: Journal) -> None:
        """Refuse to treat as this agent's thread a run that is not one."""
        run_id = journal.run_id
        start = journal.get(START_KEY)
        if not isinstance(start, Start):
            raise StoreError(f"run {run_id!r}: record {START_KEY!r} is not a start record")
        if start.entry == self.thread_entry:
            return
        if start.entry == self.entry:
            raise RunMismatch(
                f"run {run_id!r} is a single run of {self.entry!r}, not a conversation thread; use a new "
                "thread id for a conversation"
            )
        raise RunMismatch(
            f"thread {run_id!r} was started by {start.entry!r}, not {self.thread_entry!r}; use the agent "
            "that started it, or a new thread id"
        )

    def _check_start(self, journal: Journal, input: str) -> None:
        """Refuse a drive whose input or entry point differs from the run's recorded start."""
        run_id = journal.run_id
        start = journal.peek(START_KEY)
        if not isinstance(start, Start):
            raise StoreError(f"run {run_id!r}: record {START_KEY!r} is not a start record")
        if start.entry == self.thread_entry:
            raise RunMismatch(
                f"run {run_id!r} is a conversation thread of agent {self.name!r}: send it messages with "
                f"agent.thread({run_id!r}).send(message), or use a new run id"
            )
        if start.entry != self.entry:
            raise RunMismatch(
                f"run {run_id!r} was started by {start.entry!r}, not {self.entry!r}; use the agent "
                "that started it, or a new run id"
            )
        if start.input != input:
            raise RunMismatch(
                f"run {run_id!r} was started with a different input ({start.input[:80]!r}); pass "
                "the same input to resume it, or use a new run id for new work"
            )

    async def _run_calls(
        self, journal: Journal, msg: AssistantMessage, pending: list[Record]
    ) -> list[Message] | None:
        """The tool messages of a turn's calls, running those without a recorded result; None when another
        driver journaled this turn first (or a call must be decided again from a reloaded journal). A
        cancellation of the drive that a call swallowed stops the calls after it."""
        if self.max_parallel > 1 and len(msg.tool_calls) > 1:
            todo = [c for c in msg.tool_calls if not journal.has(result_key(c.call_id))]
            if len(todo) > 1:
                return await self._run_parallel(journal, msg, todo, pending)
        results: list[Message] = []
        for call in msg.tool_calls:
            res = journal.get(result_key(call.call_id))
            if not isinstance(res, ToolResult):
                _stop_if_cancelled(journal.run_id)
                got = await self._call(journal, call, pending)
                if got is None:
                    return None
                if not journal.has(got.key):
                    # A fresh result: journaled here, once the call's own frames are gone (a run waiting
                    # on this write holds only what it needs).
                    got = await _journal_result(journal, got)
                res = got
            results.append(_tool_message(call, res))
        return results

    async def _run_parallel(
        self, journal: Journal, msg: AssistantMessage, todo: list[ToolCall], pending: list[Record]
    ) -> list[Message] | None:
        """`_run_calls` for several calls at once, at most `max_parallel` at a time.

        The turn is journaled first, on its own: every call acts only on a journaled turn. Each call then
        follows the protocol on its own (a side effect its own marker, claim and window) and journals its
        result as soon as it has one, so one call's halt loses none of the others' results: every call
        runs to its end, and only then is a halt raised (the first of the turn's worst kind, with the
        others in its `also`)."""
        if not await _flush(journal, pending):
            return None
        limit = asyncio.Semaphore(self.max_parallel) if len(todo) > self.max_parallel else None

        async def one(call: ToolCall) -> ToolResult | BaseException | None:
            try:
                if limit is None:
                    return await self._call_recorded(journal, call)
                async with limit:
                    return await self._call_recorded(journal, call)
            except (KeyboardInterrupt, SystemExit) as exc:
                # A task lets these escape the event loop, past the drive; the drive raises them itself.
                return exc

        # gather waits for every call, also when the drive is cancelled (then each call is cancelled and
        # finishes its own bookkeeping first).
        outcomes = await asyncio.gather(*[one(c) for c in todo], return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise _worst(failures)
        if any(o is None for o in outcomes):
            return None  # a call was claimed or resolved by another writer: decide again from the journal
        fresh = {o.call_id: o for o in outcomes if isinstance(o, ToolResult)}
        results: list[Message] = []
        for call in msg.tool_calls:
            res = fresh.get(call.call_id) or journal.get(result_key(call.call_id))
            assert isinstance(res, ToolResult)
            results.append(_tool_message(call, res))
        return results

    async def _call_recorded(self, journal: Journal, call: ToolCall) -> ToolResult | None:
        """One call of a journaled turn, its result journaled (None: decide it again from the journal)."""
        got = await self._call(journal, call, [])
        if got is None or journal.has(got.key):
            return got
        return await _journal_result(journal, got)

    # -- model turns ---------------------------------------------------------------------------------------

    def _model_failed(self, run_id: str, turn: int, exc: Exception) -> ModelError:
        return ModelError(
            f"model {getattr(self.model, 'name', '?')!r} failed on turn {turn} of run {run_id!r}: {exc}; "
            "run again to retry"
        )

    def _model_turn(self, turn: int, reply: object) -> ModelTurn:
        """The record of the model's reply for turn `turn` (not written yet), with bide's call ids."""
        checked = _check_reply(reply)
        assert isinstance(reply, AssistantMessage)
        if not checked and type(reply) is AssistantMessage:
            message = reply  # no call ids to fill in: a final answer is journaled as the model gave it
        else:
            calls: list[ToolCall] = []
            for i, c in enumerate(checked):
                # A copy: the journal records the arguments as they are now, and the tool must run on
                # exactly those, whatever the model's client does with its own objects meanwhile.
                try:
                    arguments = _json_copy(c.arguments)
                except RecursionError as exc:
                    raise ModelError(
                        "model returned a turn the journal cannot hold (arguments nested too deeply); run "
                        "again to ask the model again"
                    ) from exc
                calls.append(ToolCall(id=c.id, name=c.name, arguments=arguments, call_id=f"c{turn}.{i}"))
            message = AssistantMessage(
                content=reply.content,
                tool_calls=calls,
                usage=reply.usage,
                finish_reason=reply.finish_reason,
                blocks=_json_copy(reply.blocks),
            )
        rec = ModelTurn(
            key=model_key(turn), turn=turn, message=message, model=str(getattr(self.model, "name", ""))
        )
        try:
            # The check is the encoding the journal write that follows reuses.
            encode_new_turn(rec)
        except (UnicodeError, ValueError, TypeError, RecursionError) as exc:
            raise ModelError(
                f"model returned a turn the journal cannot hold ({exc}: not JSON text); run again to ask the "
                "model again"
            ) from exc
        return rec

    # -- tool calls ----------------------------------------------------------------------------------------

    @staticmethod
    def _result(
        call: ToolCall,
        result: Any,
        *,
        is_error: bool,
        safety: str,
        idem: str | None = None,
        approval: Any = None,
    ) -> ToolResult:
        """A call's result record, not journaled yet (`_run_calls` journals it)."""
        return ToolResult(
            key=result_key(call.call_id),
            call_id=call.call_id,
            tool=call.name,
            result=result,
            is_error=is_error,
            safety=safety,
            idempotency_key=idem,
            approval=approval,
        )

    async def _call(self, journal: Journal, call: ToolCall, pending: list[Record]) -> ToolResult | None:
        """Run one call of the current turn and return its result: one the journal has already (a
        reconciler's), or a fresh one, which the caller journals before anything depends on it.

        `pending` holds the turn's record while it is not journaled yet; it is written before anything
        depends on it (with the attempt marker of a side effect, else on its own). Returns None when
        another driver journaled this turn first (then nothing of ours was written)."""
        run_id = journal.run_id
        tool = self.tools.get(call.name)
        # A call that left attempt markers ran as a side effect: the halt rules follow the markers, whatever
        # the tool is declared as (or whether it still exists) now.
        markers = () if pending else attempts_of(journal, call.call_id)
        gen = len(markers)
        if markers and tool is None:
            live = live_attempt(journal, call.call_id)
            if live is not None:
                raise self._unknown(journal, live, "crashed; its tool is no longer registered")
        # A timer call whose wake-up time is journaled sleeps until that time, whatever the tool is now: not
        # validated again (a lower `max_seconds` would refuse a wait that is running), and kept if the timer
        # tool was renamed or removed, or another tool took its name (none of them may end it early).
        journaled = isinstance(journal.get(timer_key(call.call_id)), Timer)
        if tool is None and not journaled:
            if not await _flush(journal, pending):
                return None
            names = ", ".join(sorted(self.tools)) or "none"
            return self._result(
                call,
                f"unknown tool {call.name!r}; available tools: {names}",
                is_error=True,
                safety="none",
            )
        if markers and tool is not None:
            resolved = await self._resume_attempt(journal, tool, call, markers[-1])
            if resolved is not None:
                return resolved
            # The call may be tried again; not once the run was asked to cancel (the request may have come
            # while a reconciler looked the call up: the journal was loaded again after it decided).
            stopped = self._not_called(journal, tool, call, None)
            if stopped is not None:
                return stopped
            gen = len(attempts_of(journal, call.call_id))
        if journaled or tool is None:  # (tool is None only with a journaled timer here)
            if not await _flush(journal, pending):
                return None
            inline = tool.inline if isinstance(tool, TimerTool) else DEFAULT_INLINE
            return await self._wait(journal, call, None, inline)
        safety = _safety(tool)
        try:
            validated = tool.validate(call.arguments)
        except ToolArgumentsInvalid as exc:
            if not await _flush(journal, pending):
                return None
            return self._result(call, str(exc), is_error=True, safety=safety)
        # The arguments as JSON values, for what reads or records them: a timer, a gate, a side effect's
        # attempt marker. A retry-safe call without a gate (the common call) needs none of them.
        arguments: dict[str, Any] = {}
        if tool.safety is SideEffect or tool.gate is not None or isinstance(tool, TimerTool):
            arguments = tool.json_arguments(validated, call.arguments)
        if isinstance(tool, TimerTool):
            if not await _flush(journal, pending):
                return None
            return await self._wait(journal, call, float(arguments["seconds"]), tool.inline)
        idem = idempotency_key_for(run_id, call.call_id)
        if (tool.gate is not None or tool.safety is not SideEffect) and not await _flush(journal, pending):
            return None  # a gate or a retry-safe tool only ever sees journaled calls
        approval: Any = None
        if tool.gate is not None:
            decided = await self._consult_gate(journal, tool, call, arguments, idem)
            if isinstance(decided, ToolResult):
                return decided
            approval = decided
        if tool.safety is not SideEffect:
            ctx = CallContext(run_id, call.call_id, tool.name, idem, 0)
            try:
                if tool.retry is None:
                    value = await tool._invoke(tool._call_args(validated), ctx)
                else:
                    value = await _retried(tool, tool._call_args(validated), ctx)
            except CallInDoubt:
                _stop_if_cancelled(run_id)  # the caller's cancellation, if it came meanwhile, wins
                raise  # nothing journaled: the next drive calls it again, with the same key
            except TimeoutError:
                return self._result(
                    call,
                    f"tool {tool.name!r} timed out after {tool.timeout:g}s",
                    is_error=True,
                    safety=safety,
                    idem=idem,
                    approval=approval,
                )
            except Exception as exc:
                return self._result(
                    call,
                    _error_text(exc),
                    is_error=True,
                    safety=safety,
                    idem=idem,
                    approval=approval,
                )
            return self._result(call, value, is_error=False, safety=safety, idem=idem, approval=approval)
        # The function's arguments (a plain dict for a function tool) travel on instead of the model: a
        # waiting run holds fewer objects.
        call_args = tool._call_args(validated)
        del validated
        if tool.retry is not None and tool.retry.attempts > 1:
            return await self._side_effect_retried(
                journal, tool, call, call_args, arguments, idem, approval, gen, pending
            )
        return await self._side_effect(
            journal, tool, call, call_args, arguments, idem, approval, gen, pending
        )

    async def _consult_gate(
        self, journal: Journal, tool: Tool, call: ToolCall, arguments: dict[str, Any], idem: str
    ) -> ToolResult | Any:
        args_json, digest = GateRequest.digest_of(arguments)
        request = GateRequest(
            journal.run_id, call.call_id, tool.name, arguments, args_json, digest, GateJournal(journal)
        )
        whose = f"the gate of tool {tool.name!r}"
        try:
            decision = tool.gate.check(request)
        except asyncio.CancelledError:
            # A synchronous check's own: no await ran, so nothing could have cancelled the drive in it.
            raise _gate_failed(stray_cancellation(whose)) from None
        if inspect.isawaitable(decision):
            try:
                decision = await run_apart(decision, whose)
            except StrayCancellation as exc:
                raise _gate_failed(exc) from None
            finally:
                # It swallowed its caller's cancellation: nothing acts on what it gave, nor on its error.
                _stop_if_cancelled(journal.run_id)
        if isinstance(decision, Approved):
            return decision.evidence
        if isinstance(decision, Denied):
            return self._result(
                call,
                f"tool call denied: {decision.reason}",
                is_error=True,
                safety=_safety(tool),
                idem=idem,
                approval=decision.evidence,
            )
        if isinstance(decision, Pending):
            await journal.awrite_one(
                Pause(
                    key=pause_key(call.call_id), call_id=call.call_id, tool=tool.name, reason=decision.reason
                )
            )
            raise ApprovalPending(
                f"run {journal.run_id!r} is awaiting approval of call {call.call_id!r} ({tool.name} "
                f"{canonical_json(arguments).decode()}): {decision.reason}. Run it again after the decision",
                run_id=journal.run_id,
                call_id=call.call_id,
                tool=tool.name,
                arguments=arguments,
                reason=decision.reason,
                records=len(journal.records()),
            )
        raise ConfigError(
            f"gate of tool {tool.name!r} returned {decision!r}; expected Approved, Denied or Pending"
        )

    async def _resume_attempt(
        self, journal: Journal, tool: Tool, call: ToolCall, last: Attempt
    ) -> ToolResult | None:
        """A side-effect call with attempt markers and no result: decide whether it may be called again.

        Returns a result if one got recorded (by a reconciler), None if the call may be claimed anew, and
        raises OutcomeUnknown otherwise (or RunInFlight while the call runs in this process)."""
        # Decide nothing from a stale journal: what another writer recorded meanwhile counts.
        await journal.aload()
        recorded = journal.get(result_key(call.call_id))
        if isinstance(recorded, ToolResult):
            return recorded
        live = live_attempt(journal, call.call_id)
        if live is None:
            return None
        last = live
        if running(last.claim) is not None:
            now = self.clock()
            raise RunInFlight(
                f"run {journal.run_id!r}: call {call.call_id!r} ({tool.name}) is still running in this "
                "process, past its deadline (a synchronous tool cannot be stopped); its outcome is recorded "
                "when it returns. Run again after that",
                run_id=journal.run_id,
                holder=None,
                expires_at=None,
                retry_after=now + 1.0,
            )
        known = returned(last.claim)
        if isinstance(known, ToolResult):
            # This process called the tool and knows what it returned; only journaling the result failed.
            return await _journal_result(journal, known)
        if never_started(last.claim):
            # This process wrote that marker and knows it never called the tool: void it and go on.
            await journal.awrite_one(
                NotStarted(
                    key=not_started_key(call.call_id, last.gen),
                    call_id=call.call_id,
                    gen=last.gen,
                    claim=last.claim,
                    reason="this process wrote the marker and never called the tool",
                )
            )
            forget_started(last.claim)
            return None
        cause: BaseException | None = None
        ready_at = last.deadline_ms / 1000 + last.settle_margin(self.clock_skew)
        now = self.clock()  # read once: the halt's words must say whether the reconciler was asked
        if tool.reconcile is not None and now >= ready_at:
            info = AttemptInfo(
                journal.run_id,
                call.call_id,
                tool.name,
                dict(last.arguments),
                idempotency_key_for(journal.run_id, call.call_id),
                last.attempted_at_ms / 1000,
                last.deadline_ms / 1000,
                last.gen,
            )
            reconcile = tool.reconcile
            whose = f"the reconciler of tool {tool.name!r}"
            try:
                if inspect.iscoroutinefunction(reconcile):
                    outcome = await run_apart(reconcile(info), whose)
                else:
                    # A lookup in the system of record (an HTTP request, say) must not stop this event
                    # loop: the lease renewals and deadlines of its other drives run on it.
                    outcome = await _in_thread(reconcile, info, whose)
                    if inspect.isawaitable(outcome):
                        outcome = await run_apart(outcome, whose)
            except Exception as exc:
                outcome, cause = None, exc
            # A reconciler that swallowed its caller's cancellation: what it gave is not acted on (nor
            # journaled; the next drive asks it again).
            _stop_if_cancelled(journal.run_id)
            if outcome is not None:
                if not isinstance(outcome, Outcome):
                    raise ConfigError(
                        f"reconciler of tool {tool.name!r} returned {outcome!r}; expected a "
                        "bide.Outcome or None"
                    )
                recorded = await resolve_in(
                    journal,
                    call.call_id,
                    outcome,
                    clock_skew=self.clock_skew,
                    now=self.clock(),
                    attempt=last.gen,
                )
                if recorded is None:  # not started: the call may be tried again, unless cancelled meanwhile
                    await journal.aload()
                return recorded
        why = "crashed"
        if tool.reconcile is not None and cause is None and now < ready_at:
            why = f"crashed; its reconciler may decide it from {when(ready_at, now)} on"
        elif cause is not None:
            # Said, not only chained: an operator must tell a reconciler that keeps failing (its system of
            # record down) from one that was never asked.
            why = f"crashed; its reconciler raised {type(cause).__name__}: {_error_text(cause)}"
        raise self._unknown(journal, last, why) from cause

    def _not_called(self, journal: Journal, tool: Tool, call: ToolCall, approval: Any) -> ToolResult | None:
        """The result of a call that is not tried (again) because the run was asked to cancel, as far as
        `journal` has loaded; None when it was not. The turn boundary that follows ends the run."""
        cancel = journal.get(CANCEL_KEY)
        if not isinstance(cancel, Cancel):
            return None
        return self._result(
            call,
            f"not called: the run was cancelled before it was tried ({cancelled_answer(cancel)})",
            is_error=True,
            safety=_safety(tool),
            idem=idempotency_key_for(journal.run_id, call.call_id),
            approval=approval,
        )

    def _unknown(
        self,
        journal: Journal,
        marker: Attempt,
        cause: str,
        *,
        options: bool = False,
        running_here: bool = False,
    ) -> OutcomeUnknown:
        """The halt for a marker without a result; `options`: name what the tool could do instead;
        `running_here`: the call runs on in this process, which records its outcome when it returns. A cause
        quoting an error message is cut to its first `_CAUSE_MAX` characters (a tool's 5 MB error became a
        5 MB halt message in every log line and traceback): the whole error is the halt's `__cause__`."""
        args = canonical_json(marker.arguments).decode()
        if len(cause) > _CAUSE_MAX:
            more = len(cause) - _CAUSE_MAX
            cause = f"{cause[:_CAUSE_MAX]}... ({more:,} more characters: see its __cause__)"
        resolve = (
            f"bide.resolve_halt(store, {journal.run_id!r}, {marker.call_id!r}, outcome=..., "
            f"attempt={marker.gen})"
        )
        # A person is needed only if this process ends before the call returns: a run_sync raising this
        # has waited for the call, whose outcome is journaled by then.
        then = (
            f"Run again once it returns (its outcome is journaled then); only if this process ends first, "
            f"check the system of record and call {resolve}"
            if running_here
            else f"Check the system of record, then call {resolve} and run again"
        )
        return OutcomeUnknown(
            f"run {journal.run_id!r} halted: side-effect call {marker.call_id!r} ({marker.tool} {args}) was "
            f"attempted at {iso(marker.attempted_at_ms / 1000)} but its outcome was not recorded "
            f"({cause}); it fired zero times or once. {then}"
            + (_OPTIONS if options else ""),
            run_id=journal.run_id,
            call_id=marker.call_id,
            tool=marker.tool,
            arguments=dict(marker.arguments),
            cause=cause,
            attempted_at=marker.attempted_at_ms / 1000,
            deadline=marker.deadline_ms / 1000,
            attempt=marker.gen,
            running_here=running_here,
        )

    async def _side_effect_retried(
        self,
        journal: Journal,
        tool: Tool,
        call: ToolCall,
        call_args: Any,
        arguments: dict[str, Any],
        idem: str,
        approval: Any,
        gen: int,
        pending: list[Record],
    ) -> ToolResult | None:
        """`_side_effect` under the tool's retry policy: an attempt that provably did not start (it
        was voided: ToolNotStarted) is retried as a new claimed attempt (gen + 1) after the policy's wait.

        What a retry needs is journaled by the attempts themselves: each one's marker, and its not-started
        record before the wait. A crash during the wait leaves no live marker, so the next drive claims a
        new attempt at once (at most once holds: the voided attempt never called the tool); the wait and
        the count of tries are the drive's own and start afresh in the next drive."""
        policy = tool.retry
        assert policy is not None
        tries = 0

        async def attempt() -> ToolResult | None:
            nonlocal tries
            if tries:  # a retry, after the policy's pause: not once the run was asked to cancel meanwhile
                _stop_if_cancelled(journal.run_id)  # nor once its caller cancelled the drive
                await journal.aload()
                stopped = self._not_called(journal, tool, call, approval)
                if stopped is not None:
                    return stopped
            tries += 1
            return await self._side_effect(
                journal, tool, call, call_args, arguments, idem, approval, gen + tries - 1, pending
            )

        try:
            return await policy.run(attempt, _voided)
        except ToolNotStarted as exc:
            if tries < 2:
                raise
            raise ToolNotStarted(f"{exc} (tried {tries} times in this drive under its retry policy)") from exc

    async def _side_effect(
        self,
        journal: Journal,
        tool: Tool,
        call: ToolCall,
        call_args: Any,
        arguments: dict[str, Any],
        idem: str,
        approval: Any,
        gen: int,
        pending: list[Record],
    ) -> ToolResult | None:
        """One claimed attempt of a side effect (see the module docstring)."""
        run_id = journal.run_id
        claim = new_claim()
        now_ms = int(self.clock() * 1000)
        marker = Attempt(
            key=attempt_key(call.call_id, gen),
            call_id=call.call_id,
            tool=tool.name,
            arguments=arguments,
            gen=gen,
            claim=claim,
            attempted_at_ms=now_ms,
            deadline_ms=now_ms + int(tool.timeout * 1000),
            clock_skew_ms=int(self.clock_skew * 1000),
        )
        try:
            if pending:
                written = await journal.awrite_exclusive(_drain(pending, marker))
                if not written:
                    return None  # another driver journaled this turn first
                stored: Record = marker
            else:
                stored, _ = await journal.awrite_one(marker)
        except BaseException:
            # The write may have committed (or was cancelled after it did); either way the tool was not
            # called. Remember the claim, so a later drive in this process can void it instead of halting.
            remember_unstarted(claim)
            raise
        if not isinstance(stored, Attempt) or stored.claim != claim:
            return None  # another writer claimed this attempt first: reload and decide again
        # The window the marker recorded: the tool starts only before its deadline, with the time left.
        window = CallWindow(tool.name, claim, marker.deadline_ms / 1000, self.clock)
        ctx = CallContext(run_id, call.call_id, tool.name, idem, gen)

        def called(result: ToolResult) -> ToolResult:
            # Known until it is journaled: a write of it that fails leaves no halt for this process.
            remember_returned(claim, result)
            return result

        # A synchronous call may outlive its drive: a close() of the store asked as the drive is cancelled
        # waits for the drive to hand the call to the thread that journals its outcome.
        finishing = None if tool._is_async else Finishing(window.running)
        if finishing is not None:
            finish_before_close(self.store, finishing)
        try:
            value = await tool._invoke(call_args, ctx, window)
        except NotCalled as exc:
            voided = await self._void(journal, tool, call, gen, claim, exc)
            _stop_if_cancelled(journal.run_id)  # the caller's cancellation came meanwhile: it wins
            raise voided from exc
        except ToolError as exc:
            return called(
                self._result(
                    call,
                    _error_text(exc),
                    is_error=True,
                    safety=_safety(tool),
                    idem=idem,
                    approval=approval,
                )
            )
        except TimeoutError as exc:
            if window.running():
                # A synchronous tool cannot be stopped: it runs on past its deadline, as a live call of this
                # process, whose lease the drive hands to a keeper that records what it returns.
                self._keep_recording(journal, window, self._late_result(call, tool, idem, approval))
                cause = (
                    f"still running past its {tool.timeout:g}s timeout in this process (a synchronous tool "
                    "cannot be stopped); this process keeps the run's lease and records its outcome when "
                    "it returns"
                )
                raise self._unknown(journal, marker, cause, running_here=True) from exc
            if window.outcome is not None:
                # A synchronous tool that returned as its deadline passed (after the timeout fired, before
                # the drive got here): what it returned, or the ToolError it raised, is known, and a known
                # outcome is never halted as unknown.
                known = self._late_result(call, tool, idem, approval)(*window.outcome)
                if known is not None:
                    return called(known)
            raise self._unknown(journal, marker, f"timed out after {tool.timeout:g}s", options=True) from exc
        except BaseException as exc:
            if window.state != "started":
                remember_unstarted(claim)  # cancelled before it started: provably not called
            elif window.done is not None and not isinstance(exc, Exception):
                # The drive was cancelled (Ctrl-C, a timeout around it, a worker stopping) while a
                # synchronous tool had started in its thread, which runs on (or has just returned, before
                # its result was written): as for an overrun, this process keeps the run's lease until it
                # returns and records its outcome, so no other driver decides meanwhile.
                self._keep_recording(journal, window, self._late_result(call, tool, idem, approval))
            if not isinstance(exc, Exception):
                raise
            if tool.not_started and isinstance(exc, tool.not_started):
                # The tool declares this exception as proof that nothing was performed.
                voided = await self._void(journal, tool, call, gen, claim, exc)
                _stop_if_cancelled(journal.run_id)
                raise voided from exc
            cause = f"the tool raised {type(exc).__name__}: {_error_text(exc)}"
            raise self._unknown(journal, marker, cause, options=True) from exc
        finally:
            if finishing is not None:
                finishing.done()  # its outcome is the drive's now, or a writer's (registered before this)
        return called(
            self._result(call, value, is_error=False, safety=_safety(tool), idem=idem, approval=approval)
        )

    async def _void(
        self, journal: Journal, tool: Tool, call: ToolCall, gen: int, claim: str, exc: BaseException
    ) -> ToolNotStarted:
        """Journal that attempt `gen` (holding `claim`) never performed its effect; the error to raise."""
        try:
            await journal.awrite_one(
                NotStarted(
                    key=not_started_key(call.call_id, gen),
                    call_id=call.call_id,
                    gen=gen,
                    claim=claim,
                    reason=_error_text(exc),
                )
            )
        except BaseException:
            remember_unstarted(claim)
            raise
        why = str(exc) if isinstance(exc, NotCalled) else f"{type(exc).__name__}: {exc}"
        return ToolNotStarted(
            f"tool {tool.name!r} (call {call.call_id!r} of run {journal.run_id!r}) did not run: {why}. "
            "Run again to retry the call"
        )

    def _keep_recording(
        self, journal: Journal, window: CallWindow, build: Callable[[bool, Any], ToolResult | None]
    ) -> None:
        """A synchronous call of this drive runs on past its deadline: journal its outcome as soon as it
        returns, and have the drive hand its lease to a keeper that holds it until then (bide/_lease.py)."""
        run_id = journal.run_id
        overrun = record_when_done(self.store, run_id, journal.fence, window, build)
        # From now on, not only once the drive hands its lease to a keeper: a close() of the store while
        # the drive unwinds must wait for this outcome too.
        finish_before_close(self.store, overrun.writer)
        self._overruns.setdefault((run_id, journal.fence), []).append(overrun)

    def _late_result(
        self, call: ToolCall, tool: Tool, idem: str, approval: Any
    ) -> Callable[[bool, Any], ToolResult | None]:
        """How the outcome of a call that outlived its drive becomes its result record (None: unknown)."""

        def build(returned: bool, value: Any) -> ToolResult | None:
            safety = _safety(tool)
            if returned:
                value = journal_safe(tool.name, value)
                return self._result(call, value, is_error=False, safety=safety, idem=idem, approval=approval)
            if isinstance(value, ToolError):
                text = _error_text(value)
                return self._result(call, text, is_error=True, safety=safety, idem=idem, approval=approval)
            return None

        return build


_OPTIONS = (
    ". So that such failures need no person: raise bide.ToolError from the tool for a failure it knows "
    "(the model sees it), raise bide.NotCalled (or declare the exception with not_started=(...)) when "
    "nothing was performed, which a retry=bide.RetryPolicy(...) then tries again, or give the tool a "
    "reconciler (reconcile=...) that looks the call up by its idempotency key"
)


async def _journal_result(journal: Journal, result: ToolResult) -> ToolResult:
    """Journal the fresh `result` of a call; the record the journal holds under its key.

    When the write fails, the call has run: the StoreError says so, and what it returned, which this
    process keeps (`remember_returned`) so that the next drive of the run here journals it instead of
    halting with OutcomeUnknown."""
    live = live_attempt(journal, result.call_id)  # None for a call that needs no attempt marker
    try:
        stored, _ = await journal.awrite_one(result)
    except LeaseLost as exc:
        if live is None:
            raise
        # The drive turns it into ResultNotJournaled if the call is still undecided once it reloads.
        raise _LostAfterCall(f"{exc}", result, live.gen) from exc
    except StoreError as exc:
        shown = _shown_result(result)
        raise StoreError(
            f"run {journal.run_id!r}: call {result.call_id!r} ({result.tool}) ran and returned {shown}, but "
            f"its result could not be journaled: {exc}. This process keeps it: run the run again here "
            "once the store answers, and it is journaled. If this process ends first, the next drive halts "
            "on the call with OutcomeUnknown: resolve it with that outcome (bide resolve, or "
            "bide.resolve_halt)"
        ) from exc
    if live is not None:
        forget_returned(live.claim)
    assert isinstance(stored, ToolResult)
    return stored


class _LostAfterCall(LeaseLost):
    """The lease was lost as the result of a side-effect call that ran was being journaled: what the drive
    needs to say what the call returned (`ResultNotJournaled`)."""

    def __init__(self, message: str, result: ToolResult, attempt: int) -> None:
        super().__init__(message)
        self.result = result
        self.attempt = attempt


def _lost_after_calls(refused: WriteRefused) -> list[_LostAfterCall]:
    """The side-effect results a drive could not journal because it lost its lease, among the failures of
    its step (`refused` and those of its parallel calls, in its `also`)."""
    return [f for f in (refused, *refused.also) if isinstance(f, _LostAfterCall)]


def _resolve_option(result: ToolResult) -> str:
    """The option of `bide resolve` that records `result`: the value itself when it is short enough to
    type, else a pointer to the value shown in the message. Given as `--option=VALUE`: a value starting
    with "-" (an error "-declined", a negative number) is read as the option's, not as another option."""
    is_text = result.is_error and isinstance(result.result, str)
    text = result.result if is_text else canonical_json(result.result).decode()
    option = "--failed" if result.is_error else "--succeeded"
    if len(text) > _RESOLVE_VALUE_MAX:
        return f"{option} {'TEXT' if is_text else 'JSON'} (the value above, whole: the error's `returned`)"
    return shlex.quote(f"{option}={text}")


_RESOLVE_VALUE_MAX = 200


def _shown_result(result: ToolResult) -> str:
    """A call's result for a message: its JSON, cut at 500 characters."""
    text = canonical_json(result.result).decode()
    shown = text if len(text) <= 500 else text[:500] + f"... ({len(text)} characters)"
    return f"an error {shown}" if result.is_error else shown


def _voided(exc: BaseException) -> bool:
    """The retry classifier of a side effect: only an attempt proven not started is tried again."""
    return isinstance(exc, ToolNotStarted)


def _retry_safe(exc: BaseException) -> bool:
    """The retry classifier of a ReadOnly/Idempotent tool: anything but a failure the tool knows."""
    return not isinstance(exc, ToolError)


async def _retried(tool: Tool, call_args: Any, ctx: CallContext) -> Any:
    """Call a retry-safe tool under its retry policy; `ctx.attempt` counts the tries (0 first)."""
    assert tool.retry is not None
    tries = 0

    async def attempt() -> Any:
        nonlocal tries
        if tries:
            _stop_if_cancelled(ctx.run_id)  # not after the caller cancelled the drive
        ctx.attempt = tries
        tries += 1
        return await tool._invoke(call_args, ctx)

    return await tool.retry.run(attempt, _retry_safe)


def _thread_ended(journal: Journal) -> RunMismatch:
    """The refusal of a new message to a thread that holds `run:end`."""
    end = journal.get(END_KEY)
    status = end.status if isinstance(end, End) else "ended"
    return RunMismatch(
        f"thread {journal.run_id!r} has ended ({status}): it takes no more messages; start a new thread "
        "for new work"
    )


# How bad a failure of one call of a parallel turn is: the worst is raised, the others ride along in its
# `also`. A crash or cancellation first (the drive is over), then errors of the drive itself (a lost lease
# must reach `run`), then halts that need a person, then those that only need time.
def _rank(exc: BaseException) -> int:
    if not isinstance(exc, Exception):
        return 0
    if isinstance(exc, WriteRefused):
        return 1
    if isinstance(exc, OutcomeUnknown):
        return 3
    if isinstance(exc, ApprovalPending):
        return 4
    if isinstance(exc, ToolNotStarted):
        return 5
    if isinstance(exc, RunInFlight):
        return 6
    if isinstance(exc, RunSleeping):
        return 7
    return 2


def _worst(failures: list[BaseException]) -> BaseException:
    """The failure a parallel turn raises (the first of the worst kind, in call order); the others are in
    its `also` and in a note."""
    worst = min(failures, key=_rank)
    others = tuple(f for f in failures if f is not worst)
    if isinstance(worst, BideError):
        worst.also = others
    for other in others:
        worst.add_note(f"also: {type(other).__name__}: {other}")
    return worst


async def _flush(journal: Journal, pending: list[Record]) -> bool:
    """Journal a fresh turn's pending records (all or nothing) before something depends on them; False when
    another driver journaled that turn first."""
    if not pending:
        return True
    return await journal.awrite_exclusive(_drain(pending))


def _abandon(request: Awaitable[Any]) -> None:
    """Drop a store request nobody will await: a coroutine is closed (never sent); a future already sent
    has its outcome read when it comes, so that asyncio does not report an error nobody retrieved."""
    if inspect.iscoroutine(request):
        request.close()
    elif isinstance(request, asyncio.Future):
        request.add_done_callback(_retrieved)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _drain(pending: list[Record], *more: Record) -> list[Record]:
    """`pending` and `more` in a new list, emptying `pending`: records on their way to the store are held by
    nobody else while the write is awaited (the journal keeps their bytes, not them)."""
    out = [*pending, *more]
    pending.clear()
    return out


def _check_reply(reply: object) -> list[ToolCall]:
    """The model port is a boundary: refuse a reply that is not a well-formed AssistantMessage, or that
    holds more than `MAX_TOOL_CALLS` tool calls, before any of it is journaled. Returns the calls checked,
    read once: the turn is made of these (a reply whose `tool_calls` answers differently when read again
    does not slip other calls past the checks)."""
    if not isinstance(reply, AssistantMessage):
        raise ModelError(f"model returned {type(reply).__name__}, not an AssistantMessage")
    if not isinstance(reply.content, str) or not isinstance(reply.tool_calls, list):
        raise ModelError(
            "model returned an AssistantMessage whose content is not a string or whose "
            "tool_calls is not a list"
        )
    calls = list(reply.tool_calls)
    if len(calls) > MAX_TOOL_CALLS:
        # Each call is journaled and run: millions of them would take the memory and the journal.
        raise ModelError(
            f"model returned {len(calls)} tool calls in one turn, more than bide's limit of "
            f"{MAX_TOOL_CALLS}; nothing was journaled: run again to ask the model again (and ask it for "
            "fewer calls at a time)"
        )
    for c in calls:
        if not (
            isinstance(c, ToolCall)
            and isinstance(c.id, str)
            and isinstance(c.name, str)
            and isinstance(c.arguments, (dict, str))
        ):
            raise ModelError(
                f"model returned a malformed tool call {c!r}: expected ToolCall(id=str, "
                "name=str, arguments=dict or str)"
            )
    if len(calls) > 1:
        ids: set[str] = set()
        for c in calls:
            if c.id in ids:
                # Two calls under one provider id cannot both be answered; nothing of the turn is journaled.
                raise ModelError(
                    f"model returned two tool calls with the id {c.id!r} in one turn; run "
                    "again to ask the model again"
                )
            ids.add(c.id)
    usage = reply.usage
    if usage is not None and not (
        isinstance(usage, Usage)
        and type(usage.input_tokens) is int
        and type(usage.output_tokens) is int
        and usage.input_tokens >= 0
        and usage.output_tokens >= 0
    ):
        raise ModelError(
            f"model returned usage {usage!r}; expected None or bide.Usage with token counts >= 0"
        )
    if not isinstance(reply.finish_reason, str):
        raise ModelError(f"model returned finish_reason {reply.finish_reason!r}; expected a string")
    blocks = reply.blocks
    if not (isinstance(blocks, list) and all(type(b) is dict for b in blocks)):
        raise ModelError(
            f"model returned blocks of type {type(blocks).__name__}; expected a list of JSON objects (dicts)"
        )
    return calls


def _restart(run_id: str, turn: int, restarts: int) -> int:
    """Count re-reads of one turn after losing it to another driver; more than a few means the journal
    does not hold what an exclusive write said it holds."""
    if restarts >= 3:
        raise StoreError(
            f"run {run_id!r}: turn {turn} was lost to another writer {restarts + 1} times but cannot be read "
            "back; the store does not keep its promises"
        )
    return restarts + 1


def _safety(tool: Tool) -> str:
    """The journal's name of a tool's safety (its `value`, read without the enum property's descriptor)."""
    value: str = tool.safety._value_
    return value


def _json_copy(value: Any) -> Any:
    """A copy of a JSON value's containers, as plain dicts and lists (a client's dict subclass or tuple
    too); anything else is shared: strings and numbers cannot change, and what is not JSON is refused when
    the turn is encoded."""
    if isinstance(value, dict):
        return {k: _json_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(v) for v in value]
    return value


_CAUSE_MAX = 2000


def _error_text(exc: BaseException) -> str:
    """An error's message as journal text: a lone surrogate in it (a file name, say) is escaped; an error
    whose message cannot be made (its __str__ raises) is named by its type."""
    try:
        said = str(exc)
    except Exception:
        return f"{type(exc).__name__} (its message cannot be shown)"
    return utf8_text(said or type(exc).__name__)


def _gate_failed(exc: StrayCancellation) -> ConfigError:
    return ConfigError(f"{exc}; the call did not run: fix the gate, then run the run again")


async def _in_thread(fn: Callable[[Any], Any], arg: Any, what: str) -> Any:
    """`fn(arg)` in a thread of its own. A `CancelledError` it raised there (a `concurrent.futures` future of
    its own that was cancelled) is its error (`StrayCancellation`) when nothing cancelled the drive.

    The thread is a daemon, not one of asyncio's default executor: once the drive stops waiting for it (a
    Ctrl-C, a worker's second stop signal), what it answers is not acted on, so nothing must keep the process
    alive for it, as `asyncio.run` does for its executor's threads (a reconciler blocked on a lookup kept a
    Ctrl-C'd process up until the lookup returned)."""
    task = asyncio.current_task()
    entered = task.cancelling() if task is not None else 0
    handoff = ThreadHandoff()
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if answer.done():
            return
        if error is None:
            answer.set_result(value)
        elif isinstance(error, (asyncio.CancelledError, concurrent.futures.CancelledError)):
            answer.set_exception(stray_cancellation(what))
        else:
            answer.set_exception(error)

    def work() -> None:
        try:
            value, error = handoff.hand(fn(arg)), None
        except BaseException as exc:  # handed to the drive, as asyncio.to_thread would
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for the answer any more
            loop.call_soon_threadsafe(settle, value, error)

    context = contextvars.copy_context()
    threading.Thread(target=context.run, args=(work,), name=f"bide: {what}", daemon=True).start()
    try:
        return await answer
    except asyncio.CancelledError:
        if task is None or task.cancelling() > entered:
            handoff.abandon()  # a coroutine it returns (its real work) never starts
            raise  # the caller's
        raise stray_cancellation(what) from None


def _stop_if_cancelled(run_id: str) -> None:
    """Raise CancelledError when the drive's caller cancelled it while a tool, a gate or a reconciler ran,
    which swallowed that (returned, or raised an error of its own; `CANCEL_SWALLOWED` names it).
    asyncio would have the drive go on; the caller asked it to stop, and it stops before its next model
    call or tool call, with everything done so far journaled."""
    swallowed = CANCEL_SWALLOWED.get()
    if swallowed:
        raise asyncio.CancelledError(
            f"run {run_id!r}: the drive was cancelled while {swallowed[0]} ran, which went on as if not"
        )


def _tool_message(call: ToolCall, res: ToolResult) -> ToolMessage:
    result = res.result
    if isinstance(result, str):
        content = result
    else:
        content = known_json_text(result) or canonical_json(result).decode()
    return ToolMessage(tool_call_id=call.id, name=call.name, content=content, is_error=res.is_error)


def _usage_of(messages: list[Message], own: int, last: AssistantMessage) -> Usage:
    """The tokens of a segment whose drive saw every turn: its messages from `own` on, and its `last` turn
    (what `_usage` reads from the journal, without reading it)."""
    total = NO_USAGE
    for m in messages[own:]:
        if isinstance(m, AssistantMessage) and m.usage is not None:
            total = total + m.usage
    return total if last.usage is None else total + last.usage


def _usage(journal: Journal, first: int = 0, stop: int | None = None) -> Usage:
    """The tokens of the journaled turns from `first` on (up to `stop`), summed, read from the stored bytes
    (the turns this drive wrote are not kept decoded, and decoding them again would cost more than the rest
    of a short run)."""
    total = NO_USAGE
    n = first
    while (stop is None or n < stop) and (entry := journal.entry(f"model:{n}")) is not None:
        n += 1
        data = entry.data
        if b'"usage":{' not in data:  # no usage object anywhere in the record: the turn reported none
            continue
        # A turn record's canonical bytes end with the message's usage, then the record's scalar fields: a
        # quote inside a JSON string is escaped, so the last `"usage":` key is the message's.
        found = _USAGE_AT_END.match(data, data.rfind(b'"usage":'))
        if found is not None:
            if found.lastindex:
                total = total + Usage(input_tokens=int(found[1]), output_tokens=int(found[2]))
            continue
        used = json.loads(data)["message"].get("usage")  # not the usual shape (another encoder's record)
        if used:
            total = total + Usage(input_tokens=used["input_tokens"], output_tokens=used["output_tokens"])
    return total


NO_USAGE = Usage()
_USAGE_AT_END = re.compile(rb'"usage":(?:null|\{"input_tokens":(\d+),"output_tokens":(\d+)\})\},"model":')


class Thread(Generic[T]):
    """A conversation: many user messages to one agent on one journal (run id `thread_id`).

    Each message is a segment of the run, answered by a drive like a run's (durable, resumable, side effects
    at most once), with the earlier messages and their turns replayed from the journal as history. Messages
    are answered one at a time: `send` on a thread still answering a message resumes that message when it
    is the same text, and is refused (`RunMismatch`) otherwise. Pass `segment=k` (the message's index, from
    0) to make a send exactly-once: a message already journaled as segment k returns its recorded answer.

    A plain `Agent.run` on a thread's id is refused, and so is a thread on a plain run's id. Cancelling the
    thread (`bide.cancel_run`) ends it: it takes no more messages.
    """

    __slots__ = ("_journal", "agent", "thread_id")

    def __init__(self, agent: Agent[T], thread_id: str) -> None:
        self.agent = agent
        self.thread_id = thread_id
        # The journal as this object's last send left it: the next send reads only what was written since,
        # instead of reading and decoding the whole conversation again (the journal is append-only).
        self._journal: Journal | None = None

    async def send(self, message: str, *, segment: int | None = None) -> RunResult[T]:
        """Send the next user message and drive the agent to its answer (`result.segment` is its index)."""
        # Taken, so that a send running at the same time starts from a journal of its own; kept again only
        # after a drive that returned, whose journal is what the store holds (a failed write may have left
        # one that is not).
        journal, self._journal = self._journal, None
        if journal is None:
            journal = Journal(self.agent.store, self.thread_id)
        result = await self.agent._run(self.thread_id, _thread_ask(message, segment), None, journal)
        self._journal = journal
        return result

    def send_sync(self, message: str, *, segment: int | None = None) -> RunResult[T]:
        """`send` for synchronous code. Refused (`ConfigError`) inside a running event loop (an async
        function, Jupyter): use `await thread.send(...)` there."""
        send = lambda: self.send(message, segment=segment)  # noqa: E731
        return run_blocking(send, "send_sync", "await thread.send(...)")

    def stream(self, message: str, *, segment: int | None = None) -> AsyncIterator[StreamEvent]:
        """`send`, as events (see `Agent.stream`); only this message's events are streamed."""
        ask = _thread_ask(message, segment)
        return stream_drive(self.thread_id, lambda sink: self.agent._run(self.thread_id, ask, sink))

    async def resume(self) -> RunResult[T]:
        """Drive the message the thread is answering (after a crash, say); for an idle thread, the last
        message's recorded answer (and, if the thread was asked to cancel, the thread ends). Raises
        RunNotFound for a thread with no message yet."""
        return await self.agent._run(self.thread_id, _Ask(None, True), None)

    async def history(self) -> list[Message]:
        """The conversation as journaled: every user message, assistant turn, tool result and output retry
        (no system prompt)."""
        journal = await Journal(self.agent.store, self.thread_id).aload()
        if not journal.has(START_KEY):
            return []
        self.agent._check_thread(journal)
        messages: list[Message] = []
        for seg in _segments(journal):
            _replay_segment(journal, seg, seg.stop, messages)
        return messages


def _text(value: object, what: str) -> str:
    """`value` if it is text the journal can hold (a string of Unicode characters), else ConfigError before
    anything is asked of the model."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a string")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(
                f"{what} is not Unicode text: it holds a lone surrogate ({value[exc.start]!r}) at position "
                f"{exc.start}; decode bytes with errors='replace' or strip the surrogates first"
            ) from None
    return value


def _thread_ask(message: object, segment: object) -> _Ask:
    text = _text(message, "message")
    if segment is not None and not (isinstance(segment, int) and segment >= 0):
        raise ConfigError("segment must be a message index (0, 1, ...) or None")
    return _Ask(text, True, segment)


def _pin_unfinished(journal: Journal, ask: _Ask) -> None:
    """A thread's message sent without its index while another driver answers the same text: the send
    is that message's (docs/bide.md), so it is pinned to its index now. Otherwise, once that driver had
    answered it, the thread would be idle when this drive gets the lease, and the text a new message."""
    if not ask.thread or ask.segment is not None or ask.input is None:
        return
    if not isinstance(journal.get(START_KEY), Start):  # a new thread (or a journal the drive will refuse)
        return
    last = _segments(journal)[-1]
    if last.input == ask.input and not journal.has(last.end_key) and not journal.has(END_KEY):
        ask.segment = last.index


def _segments(journal: Journal) -> list[_Segment]:
    """A thread's segments as journaled (message 0 from its start, then every `seg:<k>`)."""
    start = journal.get(START_KEY)
    assert isinstance(start, Start)
    segs = [_Segment(0, start.input, 0, True)]
    k = 1
    while isinstance(rec := journal.get(segment_key(k)), Segment):
        segs[-1].stop = rec.turn
        segs.append(_Segment(k, rec.input, rec.turn, True))
        k += 1
    return segs


def _replay_segment(journal: Journal, seg: _Segment, stop: int | None, messages: list[Message]) -> None:
    """Append a journaled segment's messages (up to turn `stop`, or all it has) to `messages`."""
    messages.append(UserMessage(content=seg.input))
    turn = seg.first_turn
    while stop is None or turn < stop:
        rec = journal.get(model_key(turn))
        if not isinstance(rec, ModelTurn):
            break
        messages.append(rec.message)
        for call in rec.message.tool_calls:
            res = journal.get(result_key(call.call_id))
            if isinstance(res, ToolResult):
                messages.append(_tool_message(call, res))
        retry = journal.get(retry_key(turn))
        if isinstance(retry, OutputRetry):
            messages.append(UserMessage(content=retry.error))
        turn += 1


def _of(seg: _Segment) -> str:
    return f" (message {seg.index})" if seg.thread else ""


def _count_turns(journal: Journal, first: int = 0, stop: int | None = None) -> int:
    """The journaled turns from `first` on (up to `stop`)."""
    n = first
    while (stop is None or n < stop) and journal.has(model_key(n)):
        n += 1
    return n - first
