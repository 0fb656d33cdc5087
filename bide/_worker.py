"""`Worker`: resumes runs whose driver is gone, from their journal.

A drive holds its run's lease and renews it while it drives (docs/guarantee.md). A run whose lease is not
live (its driver was killed, or a drive ended without finishing the run) and that has no `run:end` is a run
to recover. A worker lists such runs (`Store.expired_leases`), loads each journal, and drives it again with
the agent that started it (the journal's `run:start` names the entry point and holds the input; a
conversation thread's unfinished message is resumed, an idle thread is left alone), under the
same rules as any drive: side effects are never fired twice, a call whose outcome is unknown halts.

Rules:

- **A run is resumed by one driver at a time.** The worker takes the run's lease like any drive; two workers
  racing for a run, or a worker and a live driver, never drive it together (the loser sees `RunInFlight`).
- **A halted run waits for someone who can know.** A run halted on a side effect (`OutcomeUnknown`) is
  driven again only when its tool has a reconciler; otherwise it is left to a person (`bide resolve`), and
  picked up again once its journal changes (a resolution was recorded), or at the next pass when a cancel
  request was written while the worker drove it to its halt. A halted run that was cancelled
  (`bide cancel`) is driven, and its drive ends it as cancelled.
- **Waiting is not failing.** A run sleeping on a durable timer (`bide.timer`) is driven again once it is
  due; a run paused at an approval gate is consulted again with backoff until its gate decides, or at the
  next pass once a decision is journaled or a cancel request (`submit_decision` and `cancel_run` take and
  free the run's lease, so its token changes in the listing), or once its journal has a record it did not
  have (news that could not change the lease, written while a driver held it: the listing gives each
  run's latest record, `Lease.last_seq`; a store that does not has such runs read every
  `PARKED_RECHECK_S`). A run that failed (model down, store error) is retried with exponential backoff.
- **Stopping hands leases back.** `stop()` takes no new runs (nor waits for a listing of them under way,
  whose answer it drops: a pass stopped then reports `listed` False); drives in flight finish, and those
  still running after `grace` seconds (None: no limit) are cancelled, which frees their leases.
  `cancel_drives()` cancels them at once (a side effect interrupted that way may halt its run for a person).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._agent import Agent
from ._errors import (
    ApprovalPending,
    ConfigError,
    JournalFormatError,
    OutcomeUnknown,
    OutputInvalid,
    RecordDamaged,
    RunInFlight,
    RunSleeping,
    StoreError,
)
from ._journal import Journal
from ._records import CANCEL_KEY, END_KEY, START_KEY, End, Start, damage_in_words
from ._resolve import status_of
from ._store import EVERY_LEASE_MS, Store
from ._url import without_password
from ._when import seconds

__all__ = ["PassReport", "Worker"]

_T = TypeVar("_T")

log = logging.getLogger("bide.worker")

AnyAgent = Agent[Any]  # an agent of any output type
AgentSource = AnyAgent | Iterable[AnyAgent] | Mapping[str, AnyAgent] | Callable[[str], AnyAgent | None]


# A shorter poll only spins: every look is a query of the store, and nothing waits less than the lease
# and the clock skew to be taken over anyway.
MIN_POLL_S = 0.01


def worker_concurrency(value: object) -> int:
    """`value` as a worker's drives at once: a whole number, 1 or more (ConfigError otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"concurrency must be a whole number of drives at once, 1 or more; got {value!r}")
    return value


def worker_poll_interval(value: object) -> float:
    """`value` as a worker's seconds between looks for runs: from `MIN_POLL_S` to `MAX_SECONDS`."""
    poll = seconds("poll_interval", value, zero=False)
    if poll < MIN_POLL_S:
        raise ConfigError(
            f"poll_interval must be at least {MIN_POLL_S:g} s (a shorter one only spins: every look queries "
            f"the store); got {value!r}"
        )
    return poll


@dataclass(slots=True)
class PassReport:
    """What one pass over the runs to recover did, by how each drive ended.

    `completed`: drives that finished their run (one that another driver finished meanwhile is `skipped`).
    `cancelled`: drives that ended their run as cancelled (a cancel request was recorded: `bide cancel`).
    `halted`: runs left to a person (a side effect's outcome is unknown and its tool has no reconciler).
    `waiting`: runs that will be tried again (a timer not due, an approval pending, a reconciler waiting
    for a call's deadline, another live driver, a synchronous call of this worker running on past its
    timeout, whose outcome it journals when the call returns). `failed`: drives that raised an error
    (backed off).
    `skipped`: runs not driven this pass (backing off, halted and unchanged, never started, started by an
    agent this worker does not define, one it cannot drive, or one this worker drives already: in its
    `run_forever` or another pass, or drove since the pass listed it, to find it needs nothing now).
    `unresumable` names the runs no pass of this worker will drive until a person acts, with why (a record
    damaged in the database, another journal format, a lookup function's agent on another store).
    `other_agents` names the runs started by an agent this worker does not define, with the run's entry
    point ("agent:NAME" or "thread:NAME"): on a store that several apps share, another app's runs, which
    its own worker drives; not trouble of this worker's (`other_agent_runs` counts them by agent name: no
    worker drives the runs of an agent no app defines any more, one renamed since they started).
    `errors` says what each failed drive raised ("<type>: <message>")
    and `causes` why it failed: "store" (the store failed), "output" (the run ended as failed: its final
    answer never validated, `OutputInvalid`) or "error" (anything else: the model down, a bug).
    `leased`: unfinished runs no pass could take because another driver's lease on them is live (one
    driving them now, or one that died less than its lease and the clock skew ago: a later pass takes those).
    `listed`: False when `stop()` came before the store answered the pass's listing of the runs to recover
    (or its count of the live leases): the store was not read, so nothing is known of runs waiting, and no
    run was driven; every count is then 0 for want of an answer, not because the store holds nothing.
    """

    completed: int = 0
    cancelled: int = 0
    halted: int = 0
    waiting: int = 0
    failed: int = 0
    skipped: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    causes: dict[str, str] = field(default_factory=dict)
    unresumable: dict[str, str] = field(default_factory=dict)
    other_agents: dict[str, str] = field(default_factory=dict)
    leased: int = 0
    listed: bool = True

    @property
    def driven(self) -> int:
        return self.completed + self.cancelled + self.halted + self.waiting + self.failed

    @property
    def other_agent_runs(self) -> dict[str, int]:
        """How many of `other_agents` each agent name started (a thread's runs and an agent's alike), by
        name."""
        counts: dict[str, int] = {}
        for entry in self.other_agents.values():
            name = _agent_name(entry)
            counts[name] = counts.get(name, 0) + 1
        return dict(sorted(counts.items()))


def _agent_name(entry: str) -> str:
    """The agent name in a run's entry point ("agent:NAME" or "thread:NAME")."""
    return entry.partition(":")[2]


@dataclass(slots=True)
class _Backoff:
    failures: int = 0
    not_before: float = 0.0
    halted_at_records: int = -1  # a halted run is skipped while its journal has this many records
    # A run found needing nothing from a worker (an idle thread, a run halted for a person) is parked: not
    # listed again while its lease token is this one (anything that changes the run takes its lease: a
    # resolution, a new message, a cancel request) and its latest record is `parked_seq` (news written while
    # a driver held the lease, which then stays as it was, is a record all the same). With no such seq (a
    # store that does not list it) it is looked at again after `parked_until`.
    parked_token: int | None = None
    parked_until: float = 0.0
    parked_seq: int = -1
    # A sleeping run, or one at an approval gate, is driven again at `drive_after` (its timer, the gate's
    # backoff), or before if its journal no longer has `waiting_at_records` records (a decision came; -1:
    # only the time counts) or its lease token changes; it is read every PARKED_RECHECK_S meanwhile, for a
    # cancel request that could not change the lease.
    drive_after: float = 0.0
    waiting_at_records: int = -1
    # The lease token such a run is listed with while it waits (None: not waiting):
    # a token that changes (a decision was submitted, a person resolved a call) has it read at once; so
    # does a latest record other than `waiting_seq` (None: not known; it is then read every
    # PARKED_RECHECK_S instead).
    waiting_token: int | None = None
    waiting_seq: int | None = None
    # A timer's wake-up on the wall clock (0: none): due once the wall clock reaches it too, for a clock that
    # jumped forward (an NTP step, a machine resumed from suspend, which the monotonic clock does not count).
    wake_wall: float = 0.0


# How long a parked run is left alone if its lease does not change, when the store does not say whether its
# journal did (see _Backoff).
PARKED_RECHECK_S = 30.0

# `run_forever` spends at most this share of its time listing the runs to recover: a listing that takes
# longer than `poll_interval` allows is followed by a longer wait, up to MAX_LISTING_WAIT_S (a listing slowed
# by a store busy with writers must not put off the next one for long).
LISTING_SHARE = 0.1
MAX_LISTING_WAIT_S = 10.0


class Worker:
    """Finds runs whose lease expired and drives them to their end with the agent that started them.

    `agents` is an `Agent`, several (matched by `name`, the run's entry point), a mapping from name to
    agent, or a function from a name to an agent (None: not ours). Every agent must use `store`: a run
    whose agent (a function's answer included) uses another store is not driven, and the pass's report
    says why.
    `concurrency` bounds the drives in flight; `poll_interval` (seconds) is the time between listings in
    `run_forever`; failed drives are retried after `backoff` seconds, doubling up to `max_backoff`.

    `clock` decides which leases have expired, as the agents' clocks do: by default the clock the listed
    agents share (the wall clock unless they were given `clock=`; agents with different clocks need one
    given here). The worker's own waits (backoffs, parked runs, a timer's wake-up once read) run on a
    monotonic clock, so a wall clock stepped back does not hold them up; a `clock` given here (a test's
    fake clock) times them too.
    """

    def __init__(
        self,
        store: Store,
        agents: AgentSource,
        *,
        concurrency: int = 16,
        poll_interval: float = 1.0,
        backoff: float = 1.0,
        max_backoff: float = 300.0,
        grace: float | None = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if not callable(getattr(store, "expired_leases", None)):
            raise ConfigError("store must be a bide store with leases (use bide.open_store(url))")
        self.concurrency = worker_concurrency(concurrency)
        self.poll_interval = worker_poll_interval(poll_interval)
        self.backoff = seconds("backoff", backoff, zero=False)
        self.max_backoff = seconds("max_backoff", max_backoff, zero=False)
        if self.max_backoff < self.backoff:
            raise ConfigError(
                f"max_backoff ({max_backoff!r} s) caps the doubling backoff: it must be at least backoff "
                f"({backoff!r} s)"
            )
        self.grace = None if grace is None else seconds("grace", grace)
        self.store = store
        self._lookup, listed = _agent_lookup(agents, store)
        self.clock = _shared_clock(listed) if clock is None else clock
        # The worker's own deadlines (in _Backoff) are on this clock.
        self._timer = time.monotonic if clock is None else clock
        self._state: dict[str, _Backoff] = {}
        self._in_flight: dict[str, asyncio.Task[str]] = {}
        self._listing_lock = threading.Lock()  # one listing at a time, an abandoned one included
        self._stop_waits: set[asyncio.Future[None]] = set()  # listings under way, told when stop() is called
        self._listing_took = 0.0  # seconds the latest listing took the store
        self._stopping = asyncio.Event()  # binds to the loop that first waits on it
        self._other_agents_said: set[str] = set()  # agent names `run_forever` said it leaves the runs of

    # -- public API ------------------------------------------------------------------------------------------

    async def run_once(self) -> PassReport:
        """One pass: list the runs to recover now, drive each (`concurrency` at once), wait for them all.

        Its drives are the worker's drives in flight, as `run_forever`'s are: a run either of them drives
        already is not driven a second time (counted as `skipped`). After `stop()` the pass takes no new runs;
        the drives in flight finish."""
        report = PassReport()
        slots = asyncio.Semaphore(self.concurrency)

        async def one(run_id: str, listed: _Listed) -> None:
            async with slots:
                # After stop(): drives in flight finish, runs not yet taken are left for the next pass. A run
                # this worker drives already (listed before that drive took it) is its drive's, and one it
                # drove and parked since, its park's (see _settled_since). One run's failure is its own (see
                # _recover): it cancels none of the pass's other drives.
                if self._stopping.is_set() or run_id in self._in_flight:
                    outcome = "skipped"
                else:
                    outcome = await self._drive(run_id, listed, report)
            _count(report, outcome)

        async with asyncio.TaskGroup() as group:
            try:
                runs = await self._runs_to_recover()
                # Said in the report so that a pass run from cron right after a crash does not look like a
                # store with nothing to recover.
                report.leased = await self._in_lister(self._count_live_leases)
            except _Stopped:  # stopped while listing: no run taken, and none known
                report.listed = False
                return report
            for run_id, listed in runs:
                group.create_task(one(run_id, listed))
        return report

    async def run_forever(self) -> None:
        """List the runs to recover every `poll_interval` seconds and drive them, until `stop()`. A store
        that fails while listing is tried again with backoff, unless its failure is lasting
        (`StoreError.lasting`: its file was deleted, moved or replaced): then the drives in flight finish
        and the error is raised."""
        stopping = self._stopping
        listing_failures = 0
        while not stopping.is_set():
            wait = self.poll_interval
            try:
                runs = await self._runs_to_recover()
                listing_failures = 0
                # A listing reads every unfinished run: with tens of thousands halted for a person, one takes
                # a third of a second. Looking no more often than LISTING_SHARE allows bounds what a worker
                # with nothing to drive spends (the runs it finds still start at once).
                took = self._listing_took
                wait = max(wait, min(MAX_LISTING_WAIT_S, took * (1 - LISTING_SHARE) / LISTING_SHARE))
            except _Stopped:
                break
            except StoreError as exc:
                if exc.lasting:
                    # Its file deleted, moved or replaced: this store object fails every request alike, so
                    # retrying forever only kept a dead worker up, out of a supervisor's sight. It stops
                    # (its drives in flight finish, failing alike) and raises.
                    log.error("the store cannot be used any more; stopping: %s", exc)
                    self._stopping.set()
                    await self._drain()
                    raise
                # A dropped connection or a busy database is a hiccup: the store reconnects on the next call.
                wait = max(wait, min(self.max_backoff, self.backoff * 2**listing_failures))
                listing_failures += 1
                log.error("listing the runs to recover failed, retrying in %.1f s: %s", wait, exc)
                runs = []
            for run_id, listed in runs:
                # With every slot taken, wait for one to free rather than leave the rest of the listing to
                # the next poll: the runs listed first (say, many idle threads, quickly found to need
                # nothing) must not take every slot of every poll and starve the runs after them.
                while len(self._in_flight) >= self.concurrency and not stopping.is_set():
                    await self._slot_or_stop()
                if stopping.is_set():
                    break
                if run_id not in self._in_flight:
                    self._drive(run_id, listed, None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), wait)
        await self._drain()

    async def _slot_or_stop(self) -> None:
        """Wait until a drive in flight ends or `stop()` is called."""
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([stop, *self._in_flight.values()], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        await asyncio.sleep(0)  # the ended drive's done callback frees its slot

    def _drive(self, run_id: str, listed: _Listed, report: PassReport | None) -> asyncio.Task[str]:
        """Drive `run_id`, as `listed` gave it, in a task of its own, in flight until it ends (see
        `_recover`)."""
        # In flight, whichever of run_once and run_forever drives it: the other does not drive it too, and a
        # listing made meanwhile does not prune what the drive keeps of it (see _runs_to_recover).
        task = asyncio.create_task(self._recover(run_id, listed, report), name=f"bide-worker:{run_id}")
        self._in_flight[run_id] = task
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[str]) -> None:
        self._in_flight.pop(task.get_name().removeprefix("bide-worker:"), None)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker drive %s raised: %r", task.get_name(), task.exception())

    def stop(self) -> None:
        """Take no new runs; `run_forever` returns once the drives in flight finished (or `grace` passed),
        `run_once` once its drives in flight finished. A listing of the runs to recover under way is not
        waited for: its answer is dropped."""
        self._stopping.set()
        for wait in self._stop_waits:
            if not wait.done():
                wait.set_result(None)

    def cancel_drives(self) -> None:
        """Stop, and cancel the drives in flight (`run_forever`'s and `run_once`'s) now instead of waiting for
        them: their leases are freed, and a side effect interrupted that way may leave its run halted for a
        person. A pass does not count a drive cancelled so."""
        self.stop()
        for task in list(self._in_flight.values()):
            task.cancel()

    @property
    def in_flight(self) -> int:
        """How many drives this worker has running (`run_forever`'s and `run_once`'s)."""
        return len(self._in_flight)

    @property
    def listing(self) -> bool:
        """Whether a listing of the runs to recover (or `run_once`'s count of the live leases) is under way:
        `stop()` drops its answer."""
        return bool(self._stop_waits)

    # -- one run ---------------------------------------------------------------------------------------------

    async def _runs_to_recover(self) -> list[tuple[str, _Listed]]:
        # The listing is a blocking store call: in a thread, so that drives in flight keep going; one of the
        # worker's own, not asyncio's pool, which synchronous tools running long may all hold.
        # A run in flight when the listing starts may be left out of it by its own drive's live lease: its
        # absence says nothing, even once that drive has ended (and parked it) before the answer comes.
        driving = set(self._in_flight)
        out, listed = await self._in_lister(self._timed_listing)
        # What the worker kept of a run no longer listed goes (it ended, or a live driver holds it): else a
        # worker that runs for months keeps an entry for every run it ever parked or backed off (an idle
        # thread between messages, a halt someone else resolved and finished). Not a run driven here while
        # the listing ran: dropped, the park its drive had just made was lost, and the run was read and
        # driven again at the next poll (to halt a second time) although nothing had changed.
        driving.update(self._in_flight)
        for run_id in [r for r in self._state if r not in listed and r not in driving]:
            del self._state[run_id]
        return out

    def _timed_listing(self) -> tuple[list[tuple[str, _Listed]], set[str]]:
        """`_list_runs_to_recover`, its duration kept in `_listing_took` (the store's time, no wait for a
        thread)."""
        started = time.monotonic()
        try:
            return self._list_runs_to_recover()
        finally:
            self._listing_took = time.monotonic() - started

    async def _in_lister(self, fn: Callable[[], _T]) -> _T:
        """`fn()` on a listing thread of the worker's own; `_Stopped`, at once, once `stop()` is called (a
        slow store does not hold a stop up: `fn`'s answer is dropped)."""
        if self._stopping.is_set():
            raise _Stopped
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = loop.create_future()
        stopped: asyncio.Future[None] = loop.create_future()

        def listing() -> None:
            settle: Callable[[], None]
            with self._listing_lock:
                try:
                    settle = functools.partial(_answer, answer, fn())
                except BaseException as exc:  # raised where it is awaited, as an executor's would be
                    settle = functools.partial(_fail, answer, exc)
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for the answer
                loop.call_soon_threadsafe(settle)

        # A daemon: the end of the process does not wait for a store slow to answer a listing nobody reads.
        threading.Thread(target=listing, name="bide-worker-listing", daemon=True).start()
        self._stop_waits.add(stopped)
        try:
            either: list[asyncio.Future[Any]] = [answer, stopped]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._stop_waits.discard(stopped)
            if not answer.done():  # stopped, or cancelled: its failure, if it fails, is nobody's to report
                answer.add_done_callback(_drop)
        if answer.done():
            return answer.result()
        raise _Stopped

    def _count_live_leases(self) -> int:
        """How many unfinished runs hold a lease that is live now (listed before the pass drives any)."""
        now_ms = int(self.clock() * 1000)
        count, after = 0, ""
        while page := self.store.expired_leases(now_ms=EVERY_LEASE_MS, after=after, limit=500):
            count += sum(1 for lease in page if lease.expires_ms > now_ms)
            after = page[-1].run_id
        return count

    def _list_runs_to_recover(self) -> tuple[list[tuple[str, _Listed]], set[str]]:
        """The runs to drive now, each as listed (its drive's, whichever entry point's listing is the latest
        when it starts), and every run listed (those too that wait for their backoff)."""
        wall, now = self.clock(), self._timer()
        out: list[tuple[str, _Listed]] = []
        listed: set[str] = set()
        after = ""
        while True:
            page = self.store.expired_leases(now_ms=int(wall * 1000), after=after, limit=500)
            for lease in page:
                run_id = lease.run_id
                listed.add(run_id)
                state = self._state.get(run_id)
                if run_id in self._in_flight:
                    continue
                if state is not None and (
                    (
                        state.not_before > now
                        and not 0 < state.wake_wall <= wall
                        and state.waiting_token in (None, lease.token)
                        and state.waiting_seq in (None, lease.last_seq)
                    )
                    or (
                        state.parked_token == lease.token
                        # Its latest record as parked, when known; else, until the recheck's time.
                        and (
                            state.parked_seq == lease.last_seq
                            if state.parked_seq >= 0
                            else state.parked_until > now
                        )
                    )
                ):
                    continue
                out.append((run_id, _Listed(lease.token, lease.last_seq)))
            if len(page) < 500:
                return out, listed
            after = page[-1].run_id

    def _park(self, state: _Backoff, listed: _Listed, journal: Journal) -> None:
        """Leave the run out of the listings while its lease stays as `listed` and its latest record is the
        latest of `journal`, what the decision to park it read (see _Backoff)."""
        state.parked_token = listed.token
        state.parked_until = self._timer() + max(PARKED_RECHECK_S, self.poll_interval)
        state.parked_seq = listed.seen_seq(journal)

    def _settled_since(self, state: _Backoff, listed: _Listed) -> bool:
        """Whether the run is parked, or waits (see _Backoff), as of its lease token and latest record in
        `listed` or later ones: a drive of this worker since the listing found it needs nothing now."""
        # Such a drive (of the other entry point, while this one waited for a slot) started after the listing
        # found the run not in flight, so it read no less than the listing did: tokens and seqs only grow. A
        # park or wait made before the listing is not taken for one: the listing listed the run all the
        # same, so its token or latest record is newer than the park's, or its time has come.
        now = self._timer()
        if state.parked_token is not None and state.parked_token >= listed.token:
            if state.parked_seq >= 0 and state.parked_seq >= listed.seq:
                return True
            if state.parked_seq < 0 and state.parked_until > now:
                return True
        return (
            state.not_before > now
            and not 0 < state.wake_wall <= self.clock()
            and (state.waiting_token is None or state.waiting_token >= listed.token)
            and (state.waiting_seq is None or state.waiting_seq >= listed.seq)
        )

    async def _recover(self, run_id: str, listed: _Listed, report: PassReport | None) -> str:
        """Drive one run; returns how it ended: completed, cancelled, halted, waiting, failed or skipped.
        Whatever the app's code raises (an agent lookup, a tool, a model), SystemExit included, is this
        run's failure: in a task, SystemExit would leave the event loop and end every other drive."""
        try:
            return await self._recover_run(run_id, listed, report)
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit) as exc:
            return self._failed(run_id, exc, report)

    async def _recover_run(self, run_id: str, listed: _Listed, report: PassReport | None) -> str:
        # `listed` is the listing that has it driven, not the latest one: the other entry point's may have
        # been made since without the run (in flight then, or parked), and gives a park no token for it.
        # Parked or set waiting since that listing by another drive of this worker: a drive now would only
        # read it again, and redo the park from this older listing, which the next listing would not match.
        kept = self._state.get(run_id)
        if kept is not None and self._settled_since(kept, listed):
            return "skipped"
        try:
            journal = Journal(self.store, run_id)
        except ConfigError as exc:  # a row edited in the database: no agent can drive such a run id
            why = f"{exc}; bide never writes such a run id (was it edited in the database?)"
            return self._skip(run_id, why, report)
        try:
            await journal.aload()
        except StoreError as exc:
            return self._failed(run_id, exc, report)
        start = journal.get(START_KEY)
        if not isinstance(start, Start):
            return self._skip(run_id, "never started: no run:start to resume from", report)
        kind, _, name = start.entry.partition(":")
        agent = self._lookup(name) if kind in ("agent", "thread") else None
        if agent is None and kind in ("agent", "thread"):
            # Not this app's agent: on a store several apps share, another app's run (its own worker drives
            # it, or leaves it idle, halted or waiting as it should be). Not a run a person must act on.
            return self._other_agents(run_id, start.entry, report, listed, journal)
        if agent is None:
            return self._skip(run_id, f"started by {start.entry!r}, which this worker does not know", report)
        if not isinstance(agent, Agent) or agent.store is not self.store:
            # A lookup function's answer, checked per run as the listed agents are checked once: an agent on
            # another store would start the run afresh there and fire its side effects a second time.
            what = "uses another store than the worker" if isinstance(agent, Agent) else "is not a bide.Agent"
            why = f"the agent the lookup gave for {name!r} {what}: give the worker agents on its store"
            return self._skip(run_id, why, report)
        status = status_of(journal)
        state = self._state.setdefault(run_id, _Backoff())
        if status.status == "idle" and not journal.has(CANCEL_KEY):
            # A thread waiting for its next message: nothing to drive (its lease is free between messages).
            # One with a cancel request is resumed, which ends it.
            self._park(state, listed, journal)
            return "skipped"
        if status.status in ("sleeping", "awaiting_approval") and not journal.has(CANCEL_KEY):
            now = self._timer()
            due = 0 < state.wake_wall <= self.clock()
            unchanged = state.waiting_at_records in (-1, len(journal.records()))
            if not due and now < state.drive_after and unchanged:
                seq = listed.seen_seq(journal)
                # Read again once its lease or journal changes (a decision, a cancel request), or when due;
                # every PARKED_RECHECK_S too where the listing does not say when its journal changed.
                recheck = now + PARKED_RECHECK_S if seq < 0 else state.drive_after
                state.not_before = min(state.drive_after, recheck)
                # As listed: read again if it changes.
                state.waiting_token = listed.token
                state.waiting_seq = seq if seq >= 0 else None
                return "skipped"  # its timer is not due and its gate has no news: nothing to drive yet
        # A halted run with a cancel request is driven: the drive ends it as cancelled. One is not counted
        # as halted from the journal alone either: between the listing and the read, another driver may
        # have taken the run and written the marker of the call it is running. The drive tells the two
        # apart: RunInFlight while that driver's lease is live, else OutcomeUnknown.
        halted = status.status == "halted" and not journal.has(CANCEL_KEY)
        if halted and len(journal.records()) == state.halted_at_records:
            self._park(state, listed, journal)
            return "skipped"  # nothing was recorded since it halted: still waiting for a person
        try:
            if kind == "thread":
                result = await agent.thread(run_id).resume()  # the message it was answering
            else:
                result = await agent.run(run_id, start.input)
        except OutcomeUnknown as exc:
            if exc.running_here:
                # A synchronous call past its timeout runs on in this worker, which journals its outcome
                # when it returns and frees the lease then: the run goes on at a later pass, no person needed.
                log.info("run %s: call %s runs on past its timeout; the run goes on once it returns",
                         run_id, exc.call_id)  # fmt: skip
                state.not_before = self._timer() + self.poll_interval
                return "waiting"
            tool = agent.tools.get(exc.tool)
            if tool is not None and tool.reconcile is not None:
                self._back_off(state)  # its reconciler decides once the call's deadline has passed
                return "waiting"
            with contextlib.suppress(StoreError):  # unread: driven again at the next poll, to halt again
                journal = await Journal(self.store, run_id).aload()
                state.halted_at_records = len(journal.records())
                if journal.has(CANCEL_KEY):
                    # Written while it drove (its lease held, which the request then leaves alone): the halt
                    # was decided without it. The next pass drives the run, which ends it as cancelled.
                    state.parked_token = None
                else:
                    # Read after the drive freed the lease: a later record or grant shows in the listing.
                    # Left out of the listings while its lease stays as this drive left it (its own grant)
                    # and its latest record is this journal's (what was written while it drove is here; a
                    # store whose listing does not give the latest record: read again after
                    # PARKED_RECHECK_S).
                    self._park(state, listed, journal)
                    state.parked_token = listed.token_after_drive()
            # The halt's own words name the library call; an operator of `bide worker` works from a shell.
            # (`--` before the ids: a run id may start with "-".)
            prefix = getattr(self.store, "table_prefix", "bide_")
            log.warning(
                "run %s halted: %s (from a shell: bide resolve --store %s%s "
                "(--succeeded JSON | --failed MESSAGE | --not-started) --attempt %d -- %s %s)",
                run_id, exc, shlex.quote(without_password(self.store.url)),
                "" if prefix == "bide_" else f" --table-prefix {shlex.quote(prefix)}",
                exc.attempt, shlex.quote(run_id), shlex.quote(exc.call_id),
            )  # fmt: skip
            return "halted"
        except RunInFlight as exc:
            state.not_before = max(self._local(exc.retry_after), self._timer() + self.poll_interval)
            return "waiting"
        except RunSleeping as exc:
            # A timer: driven again once it is due, or at once cancelled (the request changes the lease).
            self._wait_until(state, self._local(exc.wake_at), -1, listed.token_after_drive())
            state.wake_wall = exc.wake_at
            return "waiting"
        except ApprovalPending as exc:
            self._back_off(state)
            # The gate is consulted again with backoff, or as soon as a decision is journaled: one submitted
            # after the drive changes the lease token the drive left, and one written while it ran (after
            # the gate read the journal) makes the journal longer than the records the gate saw.
            with contextlib.suppress(StoreError):  # unread: consulted again after the backoff only
                now_has = len((await Journal(self.store, run_id).aload()).records())
                gate_saw = exc.records if exc.records >= 0 else now_has
                self._wait_until(state, state.not_before, gate_saw, listed.token_after_drive())
                if now_has != gate_saw:
                    state.not_before = self._timer()  # written since the gate looked: read it at once
            return "waiting"
        except asyncio.CancelledError:
            raise
        except (Exception, SystemExit) as exc:  # a tool's sys.exit() (argparse, click) too: see _recover
            return self._failed(run_id, exc, report)
        self._state.pop(run_id, None)
        if result.replayed:
            return "skipped"  # another driver finished it meanwhile
        ended = result.answer if result.status == "cancelled" else None
        if ended is None and kind == "thread":
            ended = await self._thread_cancelled(run_id)
        if ended is not None:
            log.info("run %s ended as cancelled: %s", run_id, ended)
            return "cancelled"
        log.info("run %s completed (%d turns)", run_id, result.turns)
        return "completed"

    async def _thread_cancelled(self, run_id: str) -> str | None:
        """The answer of a thread's end record when a cancel request ended it (its drive returns its last
        message's answer: that message completed), else None."""
        with contextlib.suppress(StoreError):  # unread: counted as the message's drive, completed
            end = (await Journal(self.store, run_id).aload()).get(END_KEY)
            if isinstance(end, End) and end.status == "cancelled":
                return end.answer
        return None

    def _failed(self, run_id: str, exc: BaseException, report: PassReport | None) -> str:
        if isinstance(exc, RecordDamaged):
            # Not the store failing (a drive again would read the same bytes): no pass of this worker can
            # drive the run, and --once must not exit as for a store that is down.
            why = (
                f"its record {exc.key!r} is damaged ({damage_in_words(exc)}); it was edited or damaged in "
                "the database (bide never writes such a record): restore the store from a backup"
            )
            return self._skip(run_id, why, report)
        if isinstance(exc, JournalFormatError):  # written by another bide version: its to drive
            return self._skip(run_id, str(exc), report)
        self._back_off(self._state.setdefault(run_id, _Backoff()))
        log.warning("run %s: drive failed, retrying with backoff: %s", run_id, exc)
        if report is not None:
            report.errors[run_id] = f"{type(exc).__name__}: {exc}"
            cause = "output" if isinstance(exc, OutputInvalid) else "error"
            report.causes[run_id] = "store" if isinstance(exc, StoreError) else cause
        return "failed"

    def _skip(self, run_id: str, why: str, report: PassReport | None) -> str:
        """A run this worker cannot drive (no agent of its knows how): said once, and in the pass's report."""
        state = self._state.setdefault(run_id, _Backoff())
        if state.failures == 0:
            log.warning("run %s not resumed: %s", run_id, why)
        if report is not None:
            report.unresumable[run_id] = why
        self._back_off(state)
        return "skipped"

    def _other_agents(
        self, run_id: str, entry: str, report: PassReport | None, listed: _Listed, journal: Journal
    ) -> str:
        """A run started by an agent this worker does not define (`entry`): in the pass's report, and parked
        like an idle run (read again once its lease or journal changes: another app's worker drove it).
        Logged at debug level only: on a store another app shares, a line per run at every pass of a
        `--once` from cron was thousands of lines of nothing wrong (the report counts them). `run_forever`,
        which has no report, says it at info level once per agent name: a renamed agent's runs are never
        resumed, and nothing else would say so."""
        state = self._state.setdefault(run_id, _Backoff())
        log.debug(
            "run %s not resumed: started by %r, which this worker's agents do not define (another app's "
            "run? a worker whose app defines it resumes it)",
            run_id, entry,
        )  # fmt: skip
        if report is not None:
            report.other_agents[run_id] = entry
        elif (name := _agent_name(entry)) not in self._other_agents_said:
            self._other_agents_said.add(name)
            log.info(
                "runs of agent %r are left alone: no agent of this worker is named so (another app's agent "
                "on a shared store, or one renamed since they started); a worker whose app defines it drives "
                "them (this is said once per agent name; run %s is one)",
                name, run_id,
            )  # fmt: skip
        self._park(state, listed, journal)
        return "skipped"

    def _local(self, wall: float) -> float:
        """The time on the worker's own timer when `clock` will read `wall` (a wake-up, a retry-after)."""
        return self._timer() + (wall - self.clock())

    def _wait_until(self, state: _Backoff, when: float, records: int, token: int) -> None:
        """Drive the run again at `when` (on the worker's timer), or sooner once its journal no longer has
        `records` records (-1: only the time counts) or its lease token is no longer `token` (-1: the next
        listing's)."""
        state.drive_after, state.waiting_at_records, state.wake_wall = when, records, 0.0
        state.not_before = min(when, self._timer() + max(PARKED_RECHECK_S, self.poll_interval))
        state.waiting_token, state.waiting_seq = token, None  # after a drive: its journal is not known

    def _back_off(self, state: _Backoff) -> None:
        delay = min(self.max_backoff, self.backoff * 2**state.failures)
        state.failures += 1
        # A failed drive waits for its backoff, whatever changes meanwhile.
        state.waiting_token = state.waiting_seq = None
        state.not_before = self._timer() + random.uniform(delay / 2, delay)

    async def _drain(self) -> None:
        tasks = list(self._in_flight.values())
        if not tasks:
            return
        _done, pending = await asyncio.wait(tasks, timeout=self.grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


@dataclass(frozen=True, slots=True)
class _Listed:
    """A run as the listing its drive started from gave it: its lease token and the seq of its latest
    record (-1: the store does not say)."""

    token: int
    seq: int

    def token_after_drive(self) -> int:
        """The lease token a drive from this listing left: the one listed, plus its own grant (every grant
        adds one, in every store: S9). Another grant since (a decision announced, a resolution) makes the
        next listing differ."""
        return self.token + 1

    def seen_seq(self, journal: Journal) -> int:
        """The seq of the latest record of `journal` as read for a decision, when the listing says each
        run's latest record, so that a change shows there; -1 otherwise (see _Backoff)."""
        return -1 if self.seq < 0 else journal.last_seq


class _Stopped(Exception):
    """A listing of the runs to recover left unanswered: `stop()` was called while it ran."""


def _answer(future: asyncio.Future[_T], result: _T) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _drop(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _count(report: PassReport, outcome: str) -> None:
    setattr(report, outcome, getattr(report, outcome) + 1)


def _shared_clock(listed: list[AnyAgent] | None) -> Callable[[], float]:
    """The clock every listed agent stamps its leases with (the wall clock for a lookup function, whose
    agents are not known in advance: `listed` None); ConfigError when they differ."""
    if listed is None:
        return time.time
    clocks = {id(agent.clock): agent.clock for agent in listed}  # by identity: a clock may be unhashable
    if len(clocks) > 1:
        raise ConfigError(
            "the worker's agents stamp their leases with different clocks (clock=): it judges which leases "
            "expired with one; give every agent the same clock object, or (in Python) the worker its own "
            "with Worker(clock=...)"
        )
    return next(iter(clocks.values())) if clocks else time.time


def _agent_lookup(
    agents: AgentSource, store: Store
) -> tuple[Callable[[str], AnyAgent | None], list[AnyAgent] | None]:
    """The worker's agent by run entry name, and the agents listed (None for a lookup function)."""
    if isinstance(agents, Agent):
        agents = [agents]
    if isinstance(agents, Mapping):
        by_name = dict(agents)
    elif callable(agents):
        return agents, None
    else:
        by_name = {}
        for agent in agents:
            if not isinstance(agent, Agent):
                raise ConfigError(f"{agent!r} is not a bide.Agent")
            if agent.name in by_name:
                raise ConfigError(f"two agents are named {agent.name!r}: a run names its agent by name")
            by_name[agent.name] = agent
    for name, agent in by_name.items():
        if agent.store is not store:
            raise ConfigError(f"agent {name!r} uses another store than the worker: give both the same store")
    return by_name.get, list(by_name.values())
