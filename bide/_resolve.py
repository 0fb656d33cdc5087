"""Deciding lost outcomes: `resolve_halt`, the shared resolution step, and run status.

Why resolution is safe: every attempt marker records a deadline (attempt time + the tool's timeout), and a
call starts only before it (see bide/_inflight.py) and never runs past it (async tools are cancelled; a sync
tool that overruns stays a live call of its process, which keeps the run's lease until it returns). So an
outcome may be recorded only when all hold: the deadline plus a clock-skew margin has passed, no live driver
holds the run's lease (the resolver takes it), and the call is not running in this process. Otherwise
resolution is refused with `HaltInFlight`. A resolution first claims the next attempt number as "resolver";
if another driver or resolver holds it, resolution is refused too, so two deciders never both act.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._blocking import run_blocking
from ._canonical import canonical_json, new_claim
from ._errors import (
    AttemptChanged,
    ConfigError,
    HaltAlreadyResolved,
    HaltInFlight,
    NoLiveAttempt,
    ResolveRefused,
)
from ._inflight import returned, running
from ._journal import Journal
from ._messages import ToolCall
from ._outcome import Outcome
from ._records import (
    END_KEY,
    START_KEY,
    Attempt,
    End,
    ModelTurn,
    NotStarted,
    Pause,
    Segment,
    Start,
    Timer,
    ToolResult,
    attempt_key,
    model_key,
    not_started_key,
    pause_key,
    result_key,
    segment_end_key,
    segment_key,
    timer_key,
)
from ._store import Store, taking_lease
from ._when import iso, seconds, when

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "Resolved",
    "RunStatus",
    "aresolve",
    "aresolve_halt",
    "attempts_of",
    "resolve_halt",
    "run_status",
]

DEFAULT_CLOCK_SKEW = 1.0
RESOLVE_LEASE_MS = 30_000


def attempts_of(journal: Journal, call_id: str) -> list[Attempt]:
    """The attempt markers of a call, gen 0, 1, ... (stops at the first missing gen)."""
    out: list[Attempt] = []
    while True:
        rec = journal.get(attempt_key(call_id, len(out)))
        if not isinstance(rec, Attempt):
            return out
        out.append(rec)


def live_attempt(journal: Journal, call_id: str) -> Attempt | None:
    """The attempt whose outcome is awaited: the call's newest attempt by a driver, unless it or a newer
    one was voided by a not-started record.

    A decider's own marker (by "resolver") only claims the right to decide; with no outcome after it, its
    decider was interrupted between its two writes (killed, or the second write failed), and the attempt
    it was deciding is still the one below it. Taken for the live attempt, such a claim (its time the
    decider's, and no call made under it) had the next decider look up the wrong attempt: "not started"
    for it, and a call that had fired fired again."""
    for marker in reversed(attempts_of(journal, call_id)):
        voided = journal.get(not_started_key(call_id, marker.gen))
        if isinstance(voided, NotStarted) and voided.claim == marker.claim:
            return None
        if marker.by == "driver":
            return marker
    return None


def _same(result: ToolResult, outcome: Outcome) -> bool:
    want_error = outcome.kind == "failed"
    return result.is_error == want_error and canonical_json(result.result) == canonical_json(outcome.result)


async def resolve_in(
    journal: Journal,
    call_id: str,
    outcome: Outcome,
    *,
    clock_skew: float,
    now: float | None = None,
    sending: Callable[[], None] | None = None,
    attempt: int | None = None,
) -> ToolResult | None:
    """Record `outcome` for the call's live attempt. Returns the recorded result (None for not_started).
    `sending`, if given, is called just before the first record of the resolution goes to the store.
    `attempt` is the attempt the outcome is for: refused (`AttemptChanged`) unless it is the live one; with
    None, refused unless the live attempt is the call's first (see `_check_attempt`)."""
    existing = journal.get(result_key(call_id))
    if isinstance(existing, ToolResult):
        if outcome.kind != "not_started" and _same(existing, outcome):
            return existing
        raise HaltAlreadyResolved(
            f"call {call_id!r} of run {journal.run_id!r} already has an outcome "
            f"(is_error={existing.is_error}, result={existing.result!r}); it cannot be changed"
        )
    live = live_attempt(journal, call_id)
    markers = attempts_of(journal, call_id)
    if live is None and markers and markers[-1].by == "resolver":
        # A resolver voided the last attempt: the call was resolved as not started (and not retried since).
        if outcome.kind == "not_started":
            return None
        raise HaltAlreadyResolved(
            f"call {call_id!r} of run {journal.run_id!r} was already resolved as not started; "
            "it cannot be changed (run the agent to retry the call)"
        )
    if live is None:
        raise NoLiveAttempt(
            f"call {call_id!r} of run {journal.run_id!r} has no attempt waiting for an outcome; "
            "nothing to resolve (run the agent to go on)"
        )
    _check_attempt(journal, call_id, live, attempt)
    now = time.time() if now is None else now
    if running(live.claim) is not None:
        raise HaltInFlight(
            f"call {call_id!r} of run {journal.run_id!r} is still running in this process, past its deadline "
            "(a synchronous tool cannot be stopped); its outcome is recorded when it returns",
            retry_after=now + 1.0,
        )
    known = returned(live.claim)
    if isinstance(known, ToolResult) and (outcome.kind == "not_started" or not _same(known, outcome)):
        # This process called the tool and saw what it returned (only journaling that failed): an outcome
        # that says otherwise, "not started" above all, would have the call fire again.
        said = canonical_json(known.result).decode()
        raise ResolveRefused(
            f"call {call_id!r} of run {journal.run_id!r} ran in this process and returned "
            f"{'an error ' if known.is_error else ''}{said[:500]}, which could not be journaled; run the run "
            "again in this process to journal it (or resolve the call with that outcome)"
        )
    # The driver's own margin when it is the larger: its clock may be behind ours by up to it.
    margin = live.settle_margin(clock_skew)
    ready_at = live.deadline_ms / 1000 + margin
    if now < ready_at:
        raise HaltInFlight(
            f"call {call_id!r} of run {journal.run_id!r} may still be running (its deadline is "
            f"{when(live.deadline_ms / 1000, now)}, plus {margin:g} s clock skew); retry after "
            f"{when(ready_at, now)}",
            retry_after=ready_at,
        )
    claim = new_claim()
    now_ms = int(now * 1000)
    gen = markers[-1].gen + 1  # past an interrupted decider's claim too
    marker = Attempt(
        key=attempt_key(call_id, gen),
        call_id=call_id,
        tool=live.tool,
        arguments=live.arguments,
        gen=gen,
        claim=claim,
        attempted_at_ms=now_ms,
        deadline_ms=now_ms,
        by="resolver",
        clock_skew_ms=int(margin * 1000),
    )
    if sending is not None:
        sending()
    stored, _ = await journal.awrite_one(marker)
    if not isinstance(stored, Attempt) or stored.claim != claim:
        raise HaltInFlight(
            f"call {call_id!r} of run {journal.run_id!r} was claimed by another driver or "
            "resolver while resolving; load the run again and see what it recorded",
            retry_after=time.time(),  # at once: the next try reads what the other one recorded
        )
    if outcome.kind == "not_started":
        await journal.awrite_one(
            NotStarted(
                key=not_started_key(call_id, marker.gen),
                call_id=call_id,
                gen=marker.gen,
                claim=claim,
                reason=_not_started_reason(outcome),
            )
        )
        return None
    # Only side effects write attempt markers, so a resolved call is always a side effect.
    rec, _ = await journal.awrite_one(
        ToolResult(
            key=result_key(call_id),
            call_id=call_id,
            tool=live.tool,
            result=outcome.result,
            is_error=outcome.kind == "failed",
            safety="side_effect",
            reconciled=True,
            evidence=outcome.evidence,
        )
    )
    assert isinstance(rec, ToolResult)
    if not _same(rec, outcome):
        raise HaltAlreadyResolved(f"call {call_id!r} of run {journal.run_id!r} got another outcome meanwhile")
    return rec


def _check_attempt(journal: Journal, call_id: str, live: Attempt, attempt: int | None) -> None:
    """Refuse an outcome that may be for an earlier attempt than the live one.

    A decider looks the call up in the system of record, then resolves. If the call was tried again in
    between (another resolver voided the attempt and a driver called the tool anew, which fired and
    crashed), an outcome applied to whatever attempt is live would be for one its decider never saw: "not
    started" for a call that fired, and the next drive fires it again. So the outcome names its attempt
    (`OutcomeUnknown.attempt`, `bide show`), and only the first attempt may go unnamed: before it there
    was none to confuse it with."""
    if attempt is None and live.gen == 0:
        return
    if attempt == live.gen:
        return
    started = iso(live.attempted_at_ms / 1000)
    if attempt is None:
        why = (
            f"call {call_id!r} of run {journal.run_id!r} was tried more than once: its live attempt is "
            f"attempt {live.gen} (started {started}), and an outcome must name the attempt it is for"
        )
    elif attempt > live.gen:
        why = (
            f"call {call_id!r} of run {journal.run_id!r} has no attempt {attempt}: its live attempt is "
            f"attempt {live.gen} (started {started})"
        )
    else:
        why = (
            f"call {call_id!r} of run {journal.run_id!r} was tried again since attempt {attempt}: its live "
            f"attempt is attempt {live.gen} (started {started}), which that outcome was not decided for"
        )
    raise AttemptChanged(
        f"{why}. Check the system of record for attempt {live.gen} (its idempotency key is the call's), "
        f"then resolve it with attempt={live.gen} (`bide resolve ... --attempt {live.gen}`); nothing was "
        "written",
        attempt=live.gen,
    )


def _not_started_reason(outcome: Outcome) -> str:
    """The reason a resolver's not-started record gives, with the resolution's evidence (the record has no
    evidence field of its own; its reason is what an auditor reads)."""
    if outcome.evidence is None:
        return "resolved as not started"
    return f"resolved as not started; evidence: {canonical_json(outcome.evidence).decode()}"


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a resolution found and did (for `bide resolve`, which must say whether it wrote anything).

    `written` is False when the call already had the offered outcome: nothing was written, and `result`
    (None for "not started") is the record that stands, with the evidence recorded then. `ended`: the run
    has its `run:end` record.
    """

    written: bool
    result: ToolResult | None
    ended: bool


def _decided(journal: Journal, call_id: str) -> bool:
    """The call already has an outcome, or was resolved as not started (and not retried since)."""
    if isinstance(journal.get(result_key(call_id)), ToolResult):
        return True
    markers = attempts_of(journal, call_id)
    return live_attempt(journal, call_id) is None and bool(markers) and markers[-1].by == "resolver"


async def aresolve_halt(
    store: Store,
    run_id: str,
    call_id: str,
    *,
    outcome: Outcome,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
    clock: Callable[[], float] = time.time,
    sending: Callable[[], None] | None = None,
    attempt: int | None = None,
) -> None:
    """Async `resolve_halt`. `sending`, if given, is called just before the resolution goes to the store
    (`bide resolve` learns there that an interrupt can no longer stop it); an exception it raises stops the
    resolution, and the run's lease is given back."""
    await aresolve(
        store,
        run_id,
        call_id,
        outcome=outcome,
        clock_skew=clock_skew,
        clock=clock,
        sending=sending,
        attempt=attempt,
    )


async def aresolve(
    store: Store,
    run_id: str,
    call_id: str,
    *,
    outcome: Outcome,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
    clock: Callable[[], float] = time.time,
    sending: Callable[[], None] | None = None,
    attempt: int | None = None,
) -> Resolved:
    """`aresolve_halt`, saying whether it wrote the resolution or found the same outcome recorded already."""
    clock_skew = seconds("clock_skew", clock_skew)
    if not isinstance(outcome, Outcome):
        raise ConfigError("outcome must be a bide.Outcome (Outcome.succeeded/failed/not_started)")
    if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0):
        raise ConfigError("attempt must be an attempt number (0, 1, ...) or None")
    # A resolver holds the run's lease like a driver: never while a live driver holds it, and its writes are
    # fenced, so a driver that wakes up afterwards cannot write over the decision.
    # A run that does not exist is refused before the lease is taken: a mistyped run id leaves no lease row.
    before = await Journal(store, run_id).aload()
    if not before.exists:
        raise NoLiveAttempt(f"run {run_id!r} does not exist in {store.url}")
    # A lease held by the driver of the call is live, on its own clock, until its expiry plus its margin: a
    # driver whose clock is behind ours by up to the margin it was given may still be calling the tool.
    margin = max([clock_skew] + [m.settle_margin(clock_skew) for m in attempts_of(before, call_id)])
    holder = new_claim()
    now = clock()
    now_ms, ttl_ms = taking_lease(now, RESOLVE_LEASE_MS / 1000, margin)
    lease = await store.alease(run_id, holder, now_ms=now_ms, ttl_ms=ttl_ms)
    journal = Journal(store, run_id)
    try:
        await journal.aload()  # again, under the lease: the decision is made on what it shows
        if not lease.held:
            if journal.has(END_KEY):
                if _decided(journal, call_id):  # the same outcome again is accepted, writing nothing
                    result = await resolve_in(journal, call_id, outcome, clock_skew=clock_skew, now=clock())
                    return Resolved(written=False, result=result, ended=True)
                raise NoLiveAttempt(f"run {run_id!r} has ended; call {call_id!r} has nothing to resolve")
            expires = lease.expires_ms / 1000
            raise HaltInFlight(
                f"run {run_id!r} is being driven by another driver (lease holder {lease.holder}, token "
                f"{lease.token}, expires {when(expires, now)} unless renewed, free {clock_skew:g} s later: "
                "the clock skew margin); nobody decides a call while a live driver holds the run. Retry "
                "after that",
                retry_after=expires + clock_skew,
            )
        journal.fence = (holder, lease.token)
        decided = _decided(journal, call_id)
        result = await resolve_in(
            journal, call_id, outcome, clock_skew=clock_skew, now=clock(), sending=sending, attempt=attempt
        )
        return Resolved(written=not decided, result=result, ended=journal.has(END_KEY))
    finally:
        if lease.held:
            await store.arelease(run_id, holder, lease.token)


def resolve_halt(
    store: Store,
    run_id: str,
    call_id: str,
    *,
    outcome: Outcome,
    clock_skew: float = DEFAULT_CLOCK_SKEW,
    clock: Callable[[], float] = time.time,
    attempt: int | None = None,
) -> None:
    """Record what really happened to a call that halted a run with `OutcomeUnknown`; the next `run` goes on.

    `attempt` is the number of the attempt the outcome is for (`OutcomeUnknown.attempt`, shown by `bide
    show`); it may be left out only for a call's first attempt. Refused (`AttemptChanged`) when the live
    attempt is another one: the call was tried again after its decider looked it up. Refused
    (`HaltInFlight`) until the call's deadline plus `clock_skew` seconds (or the larger margin its driver was
    given, recorded in its marker) has passed, and when another
    driver or resolver claims the call concurrently; refused (`HaltAlreadyResolved`) when a different
    outcome is recorded already (the same outcome again is accepted); refused (`NoLiveAttempt`) when the
    call has no attempt waiting, and (`HaltInFlight`) while a live driver holds the run's lease. `clock` (Unix
    seconds) judges deadlines and stamps the resolver's lease. Refused (`ConfigError`) inside a running
    event loop (an async function, Jupyter): use `await aresolve_halt(...)` there.
    """
    run_blocking(
        lambda: aresolve_halt(
            store, run_id, call_id, outcome=outcome, clock_skew=clock_skew, clock=clock, attempt=attempt
        ),
        "resolve_halt",
        "await aresolve_halt(...)",
    )


@dataclass(frozen=True, slots=True)
class RunStatus:
    """Where a run stands, derived from its journal.

    `status` is one of: "not_started", "running" (started, not finished, nothing blocking: run it again to go
    on), "halted" (a side-effect call has an attempt and no outcome: the next drive halts; before the call's
    deadline it may also still be in flight), "awaiting_approval", "sleeping" (a timer call waits for its
    wake-up time), "completed", "cancelled", "failed" (the final answer never validated against the agent's
    output_type), and for a conversation thread "idle" (its last message is answered; it waits for the next:
    `input` and `answer` are that message's).
    `call_id`, `tool`, `arguments` name the blocking call for halted and awaiting_approval runs, and
    `attempt` the number of a halted call's live attempt (what a resolution names).
    """

    run_id: str
    status: str
    input: str | None = None
    answer: str | None = None
    call_id: str | None = None
    tool: str | None = None
    arguments: Any = None
    records: int = 0
    attempt: int | None = None


def status_of(journal: Journal) -> RunStatus:
    """Derive a `RunStatus` from a loaded journal."""
    rid = journal.run_id
    n = len(journal.records())
    if not journal.exists:
        return RunStatus(rid, "not_started")
    start = journal.get(START_KEY)
    inp = start.input if isinstance(start, Start) else None
    end = journal.get(END_KEY)
    if isinstance(end, End):
        return RunStatus(rid, end.status, inp, end.answer, records=n)
    turn = 0
    if isinstance(start, Start) and start.entry.startswith("thread:"):
        # A thread: where its last message stands (the earlier ones are answered).
        k = 0
        while isinstance(seg := journal.get(segment_key(k + 1)), Segment):
            k, inp, turn = k + 1, seg.input, seg.turn
        answered = journal.get(segment_end_key(k))
        if isinstance(answered, End):
            return RunStatus(rid, "idle", inp, answered.answer, records=n)
    last = _last_turn(journal, turn)
    if last is not None:
        # The calls of one turn can wait for different things: the run waits for the one that needs the
        # most, as a drive ranks them (a lost outcome needs a person, then an approval, then only time),
        # the first in call order of that kind.
        waiting: dict[str, RunStatus] = {}
        arguments: Any
        for call in last.message.tool_calls:
            if journal.has(result_key(call.call_id)):
                continue
            live = live_attempt(journal, call.call_id)
            attempt = None
            if live is not None:
                status, arguments, attempt = "halted", live.arguments, live.gen
            elif isinstance(journal.get(pause_key(call.call_id)), Pause):
                status, arguments = "awaiting_approval", call.arguments
            elif isinstance(journal.get(timer_key(call.call_id)), Timer):
                status, arguments = "sleeping", call.arguments
            else:
                continue
            found = RunStatus(rid, status, inp, None, call.call_id, call.name, arguments, n, attempt)
            waiting.setdefault(status, found)
        for status in ("halted", "awaiting_approval", "sleeping"):
            if status in waiting:
                return waiting[status]
    return RunStatus(rid, "running", inp, records=n)


def gated_calls(journal: Journal) -> list[ToolCall]:
    """The calls of the run's last model turn that wait at a gate (paused, with no result and no live
    attempt), in call order: every one a person may have to decide, not only the one `status_of` names."""
    last = _last_turn(journal)
    if last is None or isinstance(journal.get(END_KEY), End):
        return []
    return [
        call
        for call in last.message.tool_calls
        if not journal.has(result_key(call.call_id))
        and live_attempt(journal, call.call_id) is None
        and isinstance(journal.get(pause_key(call.call_id)), Pause)
    ]


def _last_turn(journal: Journal, turn: int = 0) -> ModelTurn | None:
    """The last model turn journaled from turn `turn` on (turns are numbered without gaps), or None."""
    last: ModelTurn | None = None
    while isinstance(rec := journal.get(model_key(turn)), ModelTurn):
        last, turn = rec, turn + 1
    return last


def run_status(store: Store, run_id: str) -> RunStatus:
    """Where the run `run_id` stands (blocking; reads the journal once)."""
    return status_of(Journal(store, run_id).load())
