"""The agent loop: model turns and tool calls, each journaled, resumed from the journal after a crash.

One drive of `Agent.run(run_id, input)`:

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
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ._cancel import cancelled_answer
from ._canonical import canonical_json, json_text, new_claim
from ._errors import (
    ApprovalPending,
    BideError,
    ConfigError,
    ModelError,
    NotCalled,
    OutcomeUnknown,
    RunInFlight,
    RunLimitExceeded,
    RunMismatch,
    RunSleeping,
    StoreError,
    ToolError,
    ToolNotStarted,
    WriteRefused,
)
from ._gate import Approved, Denied, GateJournal, GateRequest, Pending
from ._inflight import CallWindow, forget_started, never_started, remember_unstarted, running
from ._journal import Journal
from ._lease import LeaseKeeper, Overrun
from ._messages import (
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    SystemMessage,
    ToolCall,
    ToolMessage,
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
    Pause,
    Record,
    Start,
    Timer,
    ToolResult,
    attempt_key,
    decode_record,
    model_key,
    not_started_key,
    pause_key,
    result_key,
    timer_key,
)
from ._resolve import DEFAULT_CLOCK_SKEW, attempts_of, live_attempt, resolve_in
from ._store import Fence, Lease, Store
from ._timers import TimerTool
from ._tools import AttemptInfo, CallContext, Tool, ToolArgumentsInvalid, idempotency_key_for, journal_safe
from ._when import iso, when

__all__ = ["Agent", "RunResult"]

DEFAULT_LEASE_TTL = 30.0
DEFAULT_MAX_PARALLEL = 8


@dataclass(slots=True)
class RunResult:
    """A finished run: its final `answer`. `replayed` is True when the run had already finished before this
    call and the answer came from the journal without calling the model. `status` is "completed", or
    "cancelled" for a run ended by a cancel request (`bide.cancel_run`; its answer says so)."""

    run_id: str
    answer: str
    turns: int
    replayed: bool = False
    status: str = "completed"


class Agent:
    """A durable agent: `model`, `tools` and a `system` prompt over a journal in `store`.

    `name` is the run's entry point: a run started by one agent name cannot be resumed by another.
    `max_turns` bounds the model turns of a run (journaled turns count). `clock_skew` (seconds) is the margin
    a reconciler waits past an attempt's deadline before deciding it; `clock` (Unix seconds) stamps attempt
    markers, leases, and judges their age.

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
    ) -> None:
        if not callable(getattr(model, "complete", None)):
            raise ConfigError("model must have an async complete(request) method (see bide.Model)")
        if not (isinstance(lease_ttl, (int, float)) and lease_ttl > 0):
            raise ConfigError("lease_ttl must be a positive number of seconds")
        if not (isinstance(lease_wait, (int, float)) and lease_wait >= 0):
            raise ConfigError("lease_wait must be a number of seconds, 0 or more")
        if not (isinstance(max_parallel, int) and not isinstance(max_parallel, bool) and max_parallel >= 1):
            raise ConfigError(
                "max_parallel must be a whole number, 1 or more (1: calls run one after another)"
            )
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
        self.lease_ttl = float(lease_ttl)
        self.lease_wait = float(lease_wait)
        self.cancel_check = float(cancel_check)
        self.max_parallel = max_parallel
        # Synchronous calls running past their deadline, by (run id, fence) of the drive that started them.
        self._overruns: dict[tuple[str, Fence | None], list[Overrun]] = {}
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(f"{t!r} is not a bide tool; decorate it with @bide.tool")
            if t.name in self.tools:
                raise ConfigError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        self._specs = tuple(t.spec for t in self.tools.values())
        self._system_message: SystemMessage | None = None

    @property
    def entry(self) -> str:
        return f"agent:{self.name}"

    def run_sync(self, run_id: str, input: str) -> RunResult:
        """`run` for synchronous code (must not be called from a running event loop)."""
        return asyncio.run(self.run(run_id, input))

    async def run(self, run_id: str, input: str) -> RunResult:
        """Drive the run to its answer, resuming from the journal; see the module docstring.

        Returns a `RunResult` only for a completed run. Raises `OutcomeUnknown` (a side effect's outcome
        was lost) or `ApprovalPending` (a gate has not approved yet): both are `RunHalted`, never success.
        """
        if not isinstance(input, str):
            raise ConfigError("input must be a string")
        journal = Journal(self.store, run_id)
        lease = await self._take_lease(journal)
        if lease is None:  # the run had ended: its answer, from the journal
            self._check_start(journal, input)
            return self._finished(journal, replayed=True)
        keeper = LeaseKeeper(self.store, lease, self.lease_ttl, self.clock)
        try:
            result = await self._drive(journal, input)
            keeper.ended = True
            return result
        except WriteRefused as refused:
            # Another driver took the lease over, or ended the run: see what the journal says now.
            await journal.aload()
            if journal.has(END_KEY):
                keeper.ended = True
                self._check_start(journal, input)
                return self._finished(journal, replayed=True)
            now = self.clock()
            raise RunInFlight(
                f"run {run_id!r} is being driven by another driver, which took over this drive's lease "
                f"({refused}); nothing more was written by this drive. Run it again after "
                f"{when(now + self.lease_ttl, now)}",
                run_id=run_id,
                holder=None,
                expires_at=None,
                retry_after=now + self.lease_ttl,
            ) from refused
        finally:
            overrun = self._overruns.pop((run_id, journal.fence), None) if self._overruns else None
            release = keeper.stop(overrun)
            if release is not None:
                await release

    def _finished(self, journal: Journal, *, replayed: bool) -> RunResult:
        end = journal.get(END_KEY)
        assert isinstance(end, End)
        turns = _count_turns(journal)
        return RunResult(journal.run_id, end.answer, turns, replayed=replayed, status=end.status)

    async def _take_lease(self, journal: Journal) -> Lease | None:
        """Take the run's lease and load the journal as of the grant (None: the run has ended). Waits up to
        `lease_wait` for a live lease of another driver, then raises RunInFlight."""
        run_id = journal.run_id
        ttl_ms = int(self.lease_ttl * 1000)
        holder = new_claim()
        give_up = self.clock() + self.lease_wait
        pause = 0.01
        while True:
            # Both requests go out together; the store answers the load as of the grant or later.
            granted = self.store.alease(run_id, holder, now_ms=int(self.clock() * 1000), ttl_ms=ttl_ms)
            loaded = self.store.aload(run_id, journal.last_seq)
            try:
                lease = await granted
            except BaseException:
                if inspect.iscoroutine(loaded):
                    loaded.close()  # never sent: nothing to wait for
                raise
            journal.absorb(await loaded)
            if journal.has(END_KEY):
                return None
            if lease.held:
                journal.fence = (holder, lease.token)
                return lease
            now = self.clock()
            if now >= give_up:
                expires = lease.expires_ms / 1000
                raise RunInFlight(
                    f"run {run_id!r} is being driven by another driver (lease holder {lease.holder}, token "
                    f"{lease.token}, expires {when(expires, now)} unless renewed); nothing was done. Run "
                    "it again later, or give the agent a lease_wait to wait for it",
                    run_id=run_id,
                    holder=lease.holder,
                    expires_at=expires,
                    retry_after=min(expires, now + self.lease_ttl / 3),
                )
            await asyncio.sleep(min(pause, give_up - now))
            pause = min(pause * 2, 1.0)

    async def _drive(self, journal: Journal, input: str) -> RunResult:
        """The drive proper, under the run's lease, from the journal loaded with it."""
        run_id = journal.run_id
        # A new run's start record is written with its first turn, in the same all-or-nothing write: a run
        # exists once it has a turn. An existing run's start is checked against this drive.
        needs_start = not journal.has(START_KEY)
        if not needs_start:
            self._check_start(journal, input)
        end = journal.get(END_KEY)
        if isinstance(end, End):
            return RunResult(run_id, end.answer, _count_turns(journal), replayed=True, status=end.status)
        messages: list[Message] = [UserMessage(content=input)]
        if self.system:
            system = self._system_message
            if system is None or system.content != self.system:  # one message serves all runs
                system = self._system_message = SystemMessage(content=self.system)
            messages.insert(0, system)
        turn = 0
        restarts = 0
        first = True
        looked = time.monotonic()
        while True:
            if needs_start and journal.has(START_KEY):
                # The journal shows a start now: ours was written with our first turn (then `needs_start` is
                # already False), so this one is another driver's, whose first turn won the race. It must be
                # this drive's run.
                self._check_start(journal, input)
                needs_start = False
            end = journal.get(END_KEY)
            if isinstance(end, End):
                return RunResult(run_id, end.answer, _count_turns(journal), status=end.status)
            # A cancel request is honoured at a turn boundary: from the journal loaded with the lease on the
            # drive's first, then from the store (another process may have written it) once `cancel_check`
            # seconds have passed since the drive last looked.
            cancel = journal.get(CANCEL_KEY)
            if not first and cancel is None and time.monotonic() - looked >= self.cancel_check:
                cancel = await self._cancel_request(run_id)
                looked = time.monotonic()
            first = False
            if isinstance(cancel, Cancel):
                return await self._end_cancelled(journal, cancel)
            rec = journal.get(model_key(turn))
            # A new turn is written together with the first thing that depends on it (its end record, or
            # its first side effect's attempt marker), all or nothing. If another driver wrote this turn
            # first, nothing of ours is written and we go on with the turn the journal holds.
            if isinstance(rec, ModelTurn):
                pending: list[Record] = []
            else:
                if turn >= self.max_turns:
                    raise RunLimitExceeded(
                        f"run {run_id!r} reached max_turns={self.max_turns} without an answer; raise "
                        "max_turns and run it again"
                    )
                # The model call is awaited here, not in a helper coroutine: one object fewer held by every
                # run while its model thinks.
                request = ModelRequest(run_id=run_id, turn=turn, messages=list(messages), tools=self._specs)
                try:
                    reply = await self.model.complete(request)
                except BideError:
                    raise
                except Exception as exc:
                    raise self._model_failed(run_id, turn, exc) from exc
                rec = self._model_turn(turn, reply)
                del request, reply  # nothing of the call is held while the turn is journaled
                if not rec.message.tool_calls:
                    text = rec.message.content
                    write = journal.awrite_exclusive(
                        [*self._opening(needs_start, input), rec, End(key=END_KEY, answer=text)]
                    )
                    rec = None  # the records are the write's alone while it is awaited
                    if await write:
                        return RunResult(run_id, text, turn + 1)
                    restarts = _restart(run_id, turn, restarts)
                    await journal.aload()  # lost a race: decide nothing from a stale journal
                    continue
                pending = [*self._opening(needs_start, input), rec]
            msg = rec.message
            rec = None  # live runs keep only what they need while they wait (fewer objects for the GC)
            if not msg.tool_calls:
                end, _ = await journal.awrite_one(End(key=END_KEY, answer=msg.content))
                assert isinstance(end, End)
                return RunResult(run_id, end.answer, turn + 1)
            fresh = bool(pending)
            results = await self._run_calls(journal, msg, pending)
            # Every call of a fresh turn writes the turn first; this only guards that invariant.
            if results is not None and (not pending or await journal.awrite_exclusive(_drain(pending))):
                if fresh:
                    needs_start = False  # our turn, and with it our start, is journaled: nothing to check
                messages.append(msg)
                messages.extend(results)
                results = None  # the next model call may be long: hold nothing it does not need
                turn += 1
                restarts = 0
                continue
            restarts = _restart(run_id, turn, restarts)
            await journal.aload()  # lost a race: decide nothing from a stale journal

    async def _wait(self, journal: Journal, tool: TimerTool, call: ToolCall, seconds: float) -> ToolResult:
        """A timer call: journal its wake-up time once, then wait for what is left of it (in the drive when
        it is short, else by pausing the run with `RunSleeping`)."""
        timer = journal.get(timer_key(call.call_id))
        if not isinstance(timer, Timer):
            wake_ms = math.ceil((self.clock() + seconds) * 1000)  # never a moment early
            record = Timer(key=timer_key(call.call_id), call_id=call.call_id, wake_at_ms=wake_ms)
            stored, _ = await journal.awrite_one(record)
            assert isinstance(stored, Timer)
            timer = stored
        wake_at = timer.wake_at_ms / 1000
        left = wake_at - self.clock()
        if left > tool.inline:
            raise RunSleeping(
                f"run {journal.run_id!r} sleeps until {iso(wake_at)} ({when(wake_at)}) on call "
                f"{call.call_id} ({tool.name}); drive it again then (a bide.Worker does): it will not wait "
                "from zero",
                run_id=journal.run_id,
                call_id=call.call_id,
                tool=tool.name,
                arguments=call.arguments,
                wake_at=wake_at,
            )
        if left > 0:
            await asyncio.sleep(left)
        return self._result(call, f"waited until {iso(wake_at)}", is_error=False, safety=tool.safety.value)

    async def _cancel_request(self, run_id: str) -> Cancel | None:
        entry = await self.store.aget(run_id, CANCEL_KEY)
        if entry is None:
            return None
        record = decode_record(entry.key, entry.data)
        return record if isinstance(record, Cancel) else None

    async def _end_cancelled(self, journal: Journal, cancel: Cancel) -> RunResult:
        """End the run as cancelled (or, if another driver ended it first, as that driver did)."""
        stored, _ = await journal.awrite_one(
            End(key=END_KEY, status="cancelled", answer=cancelled_answer(cancel))
        )
        assert isinstance(stored, End)
        return RunResult(journal.run_id, stored.answer, _count_turns(journal), status=stored.status)

    def _opening(self, needs_start: bool, input: str) -> tuple[Record, ...]:
        """What a fresh turn is journaled after: the run's start record, for a run that has none yet. Made
        when needed, so no run holds one while it waits."""
        return (Start(key=START_KEY, entry=self.entry, input=input),) if needs_start else ()

    def _check_start(self, journal: Journal, input: str) -> None:
        """Refuse a drive whose input or entry point differs from the run's recorded start."""
        run_id = journal.run_id
        start = journal.peek(START_KEY)
        if not isinstance(start, Start):
            raise StoreError(f"run {run_id!r}: record {START_KEY!r} is not a start record")
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
        driver journaled this turn first (or a call must be decided again from a reloaded journal)."""
        if self.max_parallel > 1 and len(msg.tool_calls) > 1:
            todo = [c for c in msg.tool_calls if not journal.has(result_key(c.call_id))]
            if len(todo) > 1:
                return await self._run_parallel(journal, msg, todo, pending)
        results: list[Message] = []
        for call in msg.tool_calls:
            res = journal.get(result_key(call.call_id))
            if not isinstance(res, ToolResult):
                got = await self._call(journal, call, pending)
                if got is None:
                    return None
                if not journal.has(got.key):
                    # A fresh result: journaled here, once the call's own frames are gone (a run waiting
                    # on this write holds only what it needs).
                    stored, _ = await journal.awrite_one(got)
                    assert isinstance(stored, ToolResult)
                    got = stored
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
        stored, _ = await journal.awrite_one(got)
        assert isinstance(stored, ToolResult)
        return stored

    # -- model turns ---------------------------------------------------------------------------------------

    def _model_failed(self, run_id: str, turn: int, exc: Exception) -> ModelError:
        return ModelError(
            f"model {getattr(self.model, 'name', '?')!r} failed on turn {turn} of run {run_id!r}: {exc}; "
            "run again to retry"
        )

    def _model_turn(self, turn: int, reply: object) -> ModelTurn:
        """The record of the model's reply for turn `turn` (not written yet), with bide's call ids."""
        _check_reply(reply)
        assert isinstance(reply, AssistantMessage)
        calls: list[ToolCall] = []
        for i, c in enumerate(reply.tool_calls):
            calls.append(ToolCall(id=c.id, name=c.name, arguments=c.arguments, call_id=f"c{turn}.{i}"))
        message = AssistantMessage(content=reply.content, tool_calls=calls)
        return ModelTurn(
            key=model_key(turn), turn=turn, message=message, model=str(getattr(self.model, "name", ""))
        )

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
        if tool is None:
            if not await _flush(journal, pending):
                return None
            names = ", ".join(sorted(self.tools)) or "none"
            return self._result(
                call,
                f"unknown tool {call.name!r}; available tools: {names}",
                is_error=True,
                safety="none",
            )
        if markers:
            resolved = await self._resume_attempt(journal, tool, call, markers[-1])
            if resolved is not None:
                return resolved
            gen = len(attempts_of(journal, call.call_id))
        safety = tool.safety.value
        try:
            validated = tool.validate(call.arguments)
        except ToolArgumentsInvalid as exc:
            if not await _flush(journal, pending):
                return None
            return self._result(call, str(exc), is_error=True, safety=safety)
        arguments: dict[str, Any] = validated.model_dump(mode="json")
        if isinstance(tool, TimerTool):
            if not await _flush(journal, pending):
                return None
            return await self._wait(journal, tool, call, float(arguments["seconds"]))
        idem = idempotency_key_for(run_id, call.call_id)
        if (tool.gate is not None or tool.safety.retry_safe) and not await _flush(journal, pending):
            return None  # a gate or a retry-safe tool only ever sees journaled calls
        approval: Any = None
        if tool.gate is not None:
            decided = await self._consult_gate(journal, tool, call, arguments, idem)
            if isinstance(decided, ToolResult):
                return decided
            approval = decided
        if tool.safety.retry_safe:
            ctx = CallContext(run_id, call.call_id, tool.name, idem, 0)
            try:
                if tool.retry is None:
                    value = await tool._invoke(tool._call_args(validated), ctx)
                else:
                    value = await _retried(tool, tool._call_args(validated), ctx)
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
        decision = tool.gate.check(request)
        if inspect.isawaitable(decision):
            decision = await decision
        if isinstance(decision, Approved):
            return decision.evidence
        if isinstance(decision, Denied):
            return self._result(
                call,
                f"tool call denied: {decision.reason}",
                is_error=True,
                safety=tool.safety.value,
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
        ready_at = last.deadline_ms / 1000 + self.clock_skew
        if tool.reconcile is not None and self.clock() >= ready_at:
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
            try:
                outcome = tool.reconcile(info)
                if inspect.isawaitable(outcome):
                    outcome = await outcome
            except Exception as exc:
                outcome, cause = None, exc
            if outcome is not None:
                if not isinstance(outcome, Outcome):
                    raise ConfigError(
                        f"reconciler of tool {tool.name!r} returned {outcome!r}; expected a "
                        "bide.Outcome or None"
                    )
                recorded = await resolve_in(
                    journal, call.call_id, outcome, clock_skew=self.clock_skew, now=self.clock()
                )
                return recorded
        why = "crashed"
        if tool.reconcile is not None and cause is None and self.clock() < ready_at:
            why = f"crashed; its reconciler may decide it from {when(ready_at, self.clock())} on"
        raise self._unknown(journal, last, why) from cause

    def _unknown(
        self, journal: Journal, marker: Attempt, cause: str, *, options: bool = False
    ) -> OutcomeUnknown:
        """The halt for a marker without a result; `options`: name what the tool could do instead."""
        args = canonical_json(marker.arguments).decode()
        return OutcomeUnknown(
            f"run {journal.run_id!r} halted: side-effect call {marker.call_id!r} ({marker.tool} {args}) was "
            f"attempted at {iso(marker.attempted_at_ms / 1000)} but its outcome was not recorded "
            f"({cause}); it fired zero times or once. Check the system of record, then call "
            f"bide.resolve_halt(store, "
            f"{journal.run_id!r}, {marker.call_id!r}, outcome=...) and run again"
            + (_OPTIONS if options else ""),
            run_id=journal.run_id,
            call_id=marker.call_id,
            tool=marker.tool,
            arguments=dict(marker.arguments),
            cause=cause,
            attempted_at=marker.attempted_at_ms / 1000,
            deadline=marker.deadline_ms / 1000,
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
        try:
            value = await tool._invoke(call_args, ctx, window)
        except NotCalled as exc:
            raise await self._void(journal, tool, call, gen, claim, exc) from exc
        except ToolError as exc:
            return self._result(
                call,
                _error_text(exc),
                is_error=True,
                safety=tool.safety.value,
                idem=idem,
                approval=approval,
            )
        except TimeoutError as exc:
            if window.running():
                # A synchronous tool cannot be stopped: it runs on past its deadline, as a live call of this
                # process, whose lease the drive hands to a keeper that records what it returns.
                late = self._late_result(call, tool, idem, approval)
                self._overruns.setdefault((run_id, journal.fence), []).append((window, late))
                cause = (
                    f"still running past its {tool.timeout:g}s timeout in this process (a synchronous tool "
                    "cannot be stopped); this process keeps the run's lease and records its outcome when "
                    "it returns"
                )
                raise self._unknown(journal, marker, cause) from exc
            raise self._unknown(journal, marker, f"timed out after {tool.timeout:g}s", options=True) from exc
        except BaseException as exc:
            if window.state != "started":
                remember_unstarted(claim)  # cancelled before it started: provably not called
            if not isinstance(exc, Exception):
                raise
            if tool.not_started and isinstance(exc, tool.not_started):
                # The tool declares this exception as proof that nothing was performed.
                raise await self._void(journal, tool, call, gen, claim, exc) from exc
            cause = f"the tool raised {type(exc).__name__}: {exc}"
            raise self._unknown(journal, marker, cause, options=True) from exc
        return self._result(
            call, value, is_error=False, safety=tool.safety.value, idem=idem, approval=approval
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

    def _late_result(
        self, call: ToolCall, tool: Tool, idem: str, approval: Any
    ) -> Callable[[bool, Any], ToolResult | None]:
        """How the outcome of a call that outlived its drive becomes its result record (None: unknown)."""

        def build(returned: bool, value: Any) -> ToolResult | None:
            safety = tool.safety.value
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
        ctx.attempt = tries
        tries += 1
        return await tool._invoke(call_args, ctx)

    return await tool.retry.run(attempt, _retry_safe)


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


def _drain(pending: list[Record], *more: Record) -> list[Record]:
    """`pending` and `more` in a new list, emptying `pending`: records on their way to the store are held by
    nobody else while the write is awaited (the journal keeps their bytes, not them)."""
    out = [*pending, *more]
    pending.clear()
    return out


def _check_reply(reply: object) -> None:
    """The model port is a boundary: refuse a reply that is not a well-formed AssistantMessage before any
    of it is journaled."""
    if not isinstance(reply, AssistantMessage):
        raise ModelError(f"model returned {type(reply).__name__}, not an AssistantMessage")
    if not isinstance(reply.content, str) or not isinstance(reply.tool_calls, list):
        raise ModelError("model returned an AssistantMessage whose content is not a string or whose "
                         "tool_calls is not a list")
    ids: set[str] = set()
    for c in reply.tool_calls:
        if not (
            isinstance(c, ToolCall)
            and isinstance(c.id, str)
            and isinstance(c.name, str)
            and isinstance(c.arguments, (dict, str))
        ):
            raise ModelError(f"model returned a malformed tool call {c!r}: expected ToolCall(id=str, "
                             "name=str, arguments=dict or str)")
        if c.id in ids:
            # Two calls under one provider id cannot both be answered; nothing of the turn is journaled.
            raise ModelError(f"model returned two tool calls with the id {c.id!r} in one turn; run again "
                             "to ask the model again")
        ids.add(c.id)
    _check_journalable(reply)


def _check_journalable(reply: AssistantMessage) -> None:
    """Refuse a reply whose text or arguments the journal cannot hold (a lone surrogate, NaN or an infinity,
    values that are not JSON) before any of it is journaled."""
    try:
        # One encoding of everything the turn record will hold that came from the model.
        json_text([reply.content, [[c.id, c.name, c.arguments] for c in reply.tool_calls]]).encode("utf-8")
    except (UnicodeError, ValueError, TypeError, RecursionError) as exc:
        raise ModelError(
            f"model returned a turn the journal cannot hold ({exc}: not JSON text); run again to ask the "
            "model again"
        ) from exc


def _restart(run_id: str, turn: int, restarts: int) -> int:
    """Count re-reads of one turn after losing it to another driver; more than a few means the journal
    does not hold what an exclusive write said it holds."""
    if restarts >= 3:
        raise StoreError(
            f"run {run_id!r}: turn {turn} was lost to another writer {restarts + 1} times but cannot be read "
            "back; the store does not keep its promises"
        )
    return restarts + 1


def _error_text(exc: BaseException) -> str:
    """An error's message as journal text: a lone surrogate in it (a file name, say) is escaped."""
    text = str(exc) or type(exc).__name__
    try:
        text.encode("utf-8")
    except UnicodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _tool_message(call: ToolCall, res: ToolResult) -> ToolMessage:
    content = res.result if isinstance(res.result, str) else canonical_json(res.result).decode()
    return ToolMessage(tool_call_id=call.id, name=call.name, content=content, is_error=res.is_error)


def _count_turns(journal: Journal) -> int:
    n = 0
    while journal.has(model_key(n)):
        n += 1
    return n
