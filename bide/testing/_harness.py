"""A crash-point harness: crash a durable run at every store write, and at random schedules.

The protocol is small so other frameworks can be driven through the same schedules:

- `CrashSystem.new_run()` returns a fresh `CrashRun` (a one-side-effect run over a surviving store);
  `CrashSystem.writes()` says how many crash points a clean run passes.
- `CrashRun.step(crash_at)` starts or resumes the run in a fresh "process"; with `crash_at=k` the process
  dies at crash point k (counted from 1 within this step). It returns "completed", "halted" (the run stopped
  and asks for a decision), "crashed", or "in_flight" (nothing happened: another driver's lease is live).
  `CrashRun.fired()` counts how often the side effect really fired.

For each schedule the harness reports `max_fired` (must be 1 at most), whether the run completed, whether it
halted, and whether a halt was false (the effect had not fired) or an answer was missed (completed without
the effect).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._agent import Agent
from .._canonical import new_claim
from .._errors import ConfigError, OutcomeUnknown, RunHalted, RunInFlight, ToolNotStarted
from .._inflight import forget_claims
from .._memory import MemoryStore
from .._open import open_store
from .._outcome import Outcome
from .._store import BlockingStore, Entry, Fence, Lease, Store
from .._tools import AttemptInfo, Safety, SideEffect, Tool
from ._scripted import ScriptedModel, call, reply

__all__ = [
    "BideCrashSystem",
    "CrashReport",
    "CrashRun",
    "CrashSystem",
    "CrashingStore",
    "ScheduleResult",
    "SimulatedCrash",
    "run_crash_schedules",
]


class SimulatedCrash(BaseException):
    """The simulated process died. A BaseException so no `except Exception` in the code under test can
    swallow it."""


class CrashRun(Protocol):
    def step(self, crash_at: int | None) -> str: ...

    def fired(self) -> int: ...


class CrashSystem(Protocol):
    name: str

    def new_run(self) -> CrashRun: ...

    def writes(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """One schedule: the crash points used, steps taken, times fired, and how the run ended."""

    schedule: tuple[int, ...]
    steps: int
    fired: int
    completed: bool
    halted: bool

    @property
    def false_halt(self) -> bool:
        """Halted although the effect never fired (a halt the store could not rule out)."""
        return self.halted and self.fired == 0

    @property
    def missed(self) -> bool:
        """Completed without the effect having fired."""
        return self.completed and self.fired == 0


@dataclass
class CrashReport:
    """All schedules of one system. `ok` means no schedule fired twice and no completed run missed it."""

    system: str
    results: list[ScheduleResult] = field(default_factory=list)

    @property
    def max_fired(self) -> int:
        return max((r.fired for r in self.results), default=0)

    @property
    def completed(self) -> int:
        return sum(r.completed for r in self.results)

    @property
    def halts(self) -> int:
        return sum(r.halted for r in self.results)

    @property
    def false_halts(self) -> int:
        return sum(r.false_halt for r in self.results)

    @property
    def missed(self) -> int:
        return sum(r.missed for r in self.results)

    @property
    def ok(self) -> bool:
        return self.max_fired <= 1 and self.missed == 0

    def summary(self) -> str:
        n = len(self.results)
        return (
            f"{self.system}: {n} schedules, max_fired={self.max_fired}, completed={self.completed}, "
            f"halted={self.halts} (false halts {self.false_halts}), missed={self.missed}, "
            f"{'OK' if self.ok else 'VIOLATION'}"
        )


def _drive(run: CrashRun, schedule: Sequence[int], max_steps: int) -> ScheduleResult:
    steps = 0
    outcome = "crashed"
    pending = list(schedule)
    while steps < max_steps:
        crash_at = pending.pop(0) if pending else None
        outcome = run.step(crash_at)
        steps += 1
        if outcome in ("completed", "halted"):
            break
    return ScheduleResult(tuple(schedule), steps, run.fired(), outcome == "completed", outcome == "halted")


def run_crash_schedules(
    system: CrashSystem,
    *,
    random_schedules: int = 200,
    max_crashes: int = 4,
    seed: int = 0,
    max_steps: int = 64,
) -> CrashReport:
    """Crash `system` at every crash point one by one (then resume to the end), and at `random_schedules`
    random schedules of up to `max_crashes` crashes; return the per-schedule report."""
    report = CrashReport(system.name)
    points = system.writes() + 2
    for k in range(1, points + 1):
        report.results.append(_drive(system.new_run(), [k], max_steps))
    rng = random.Random(seed)
    for _ in range(random_schedules):
        schedule = [rng.randint(1, points) for _ in range(rng.randint(1, max_crashes))]
        report.results.append(_drive(system.new_run(), schedule, max_steps))
    return report


class CrashingStore(BlockingStore):
    """Wraps a store and kills the "process" at crash point k of this store object; every store call after
    that dies too. Write n has three crash points: 3n-2 just before it is sent (it is lost), 3n-1 just after
    it committed (the caller never hears back), and 3n at whatever the process does next after the write
    returned (inside a tool call, after its effect, when the tool checks `crash_pending`; else the next
    store call)."""

    def __init__(self, inner: Any, crash_at: int | None) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.crash_at = crash_at
        self.writes = 0
        self.dead = False

    @property
    def crash_pending(self) -> bool:
        """True when the process must die at its next action (crash point 3n)."""
        return self.crash_at is not None and self.crash_at == 3 * self.writes

    def _alive(self) -> None:
        if self.dead or self.crash_pending:
            self.dead = True
            raise SimulatedCrash("process is dead")

    def insert_many(
        self,
        run_id: str,
        items: Sequence[tuple[str, bytes]],
        *,
        exclusive: bool = False,
        fence: Fence | None = None,
    ) -> list[Entry]:
        self._alive()
        self.writes += 1
        if self.crash_at is not None and self.crash_at == 3 * self.writes - 2:
            self.dead = True
            raise SimulatedCrash(f"crash before write {self.writes}")
        out: list[Entry] = self.inner.insert_many(run_id, items, exclusive=exclusive, fence=fence)
        if self.crash_at is not None and self.crash_at == 3 * self.writes - 1:
            self.dead = True
            raise SimulatedCrash(f"crash after write {self.writes}")
        return out

    def lease(self, run_id: str, holder: str, *, now_ms: int, ttl_ms: int, token: int = 0) -> Lease:
        self._alive()
        result: Lease = self.inner.lease(run_id, holder, now_ms=now_ms, ttl_ms=ttl_ms, token=token)
        return result

    def release(self, run_id: str, holder: str, token: int) -> bool:
        self._alive()
        result: bool = self.inner.release(run_id, holder, token)
        return result

    def expired_leases(self, *, now_ms: int, after: str = "", limit: int = 500) -> list[Lease]:
        self._alive()
        result: list[Lease] = self.inner.expired_leases(now_ms=now_ms, after=after, limit=limit)
        return result

    def get(self, run_id: str, key: str) -> Entry | None:
        self._alive()
        result: Entry | None = self.inner.get(run_id, key)
        return result

    def load(self, run_id: str, after: int = 0) -> list[Entry]:
        self._alive()
        result: list[Entry] = self.inner.load(run_id, after)
        return result

    def runs(
        self, *, prefix: str = "", after: str = "", limit: int = 500, open_only: bool = False
    ) -> list[str]:
        self._alive()
        result: list[str] = self.inner.runs(prefix=prefix, after=after, limit=limit, open_only=open_only)
        return result


class _BideRun:
    def __init__(self, system: BideCrashSystem, run_id: str) -> None:
        self.system = system
        self.run_id = run_id
        self.ledger: dict[str, int] = {}  # the system of record: idempotency key -> times charged
        self.store = system._store()
        self.now = 1_800_000_000.0
        self.steps = 0

    def fired(self) -> int:
        return max(self.ledger.values(), default=0)

    def _tool(self, crashing: CrashingStore) -> Tool:
        ledger = self.ledger

        def charge(customer: str, cents: int, idempotency_key: str) -> str:
            """Charge a customer (appends to the ledger)."""
            ledger[idempotency_key] = ledger.get(idempotency_key, 0) + 1
            if crashing.crash_pending:
                crashing.dead = True
                raise SimulatedCrash("crash inside the call, after the effect")
            return f"charged {customer} {cents}"

        def reconcile(attempt: AttemptInfo) -> Outcome:
            if ledger.get(attempt.idempotency_key, 0) > 0:
                return Outcome.succeeded(
                    f"charged {attempt.arguments['customer']} {attempt.arguments['cents']}",
                    evidence={"ledger": attempt.idempotency_key},
                )
            return Outcome.not_started(evidence={"ledger": "no charge"})

        return Tool.from_function(
            charge,
            safety=self.system.safety,
            timeout=60.0,
            reconcile=reconcile if self.system.reconcile else None,
        )

    def step(self, crash_at: int | None) -> str:
        forget_claims()  # a new process remembers nothing
        steps = self.system.clock_steps
        self.now += steps[self.steps % len(steps)]  # the restart's clock: later, or a little earlier
        self.steps += 1
        outcomes = asyncio.run(self._drives(crash_at))
        for outcome in ("completed", "halted", "crashed"):
            if outcome in outcomes:
                return outcome
        return "in_flight"  # every driver found the run's lease held (or its call's window closed)

    async def _drives(self, crash_at: int | None) -> list[str]:
        """The step's drivers, all at once; the first crashes at `crash_at`."""

        async def drive(k: int) -> str:
            crashing = CrashingStore(self.store, crash_at if k == 0 else None)
            # A model that yields to the event loop, so the drivers interleave.
            model = ScriptedModel([call("charge", customer="alice", cents=500), reply("done")], delay=1e-4)
            agent = Agent(
                model, store=crashing, tools=[self._tool(crashing)], system="charge", clock=lambda: self.now
            )
            try:
                await agent.run(self.run_id, "charge alice")
            except SimulatedCrash:
                return "crashed"
            except OutcomeUnknown:
                return "halted"
            except RunHalted:
                return "halted"
            except (RunInFlight, ToolNotStarted):
                return "in_flight"
            return "completed"

        return list(await asyncio.gather(*(drive(k) for k in range(self.system.drivers))))


class BideCrashSystem:
    """bide's harness adapter: a one-tool run (model turn, `charge` side effect, final answer) on a store
    that survives crashes. `reconcile=True` gives the tool a reconciler that reads the ledger (the system of
    record), so lost outcomes are decided automatically instead of halting. `safety=bide.Idempotent`
    mislabels the charge, which must make the harness report double fires (non-vacuity).

    `store_url` picks the store every run lives in (default: a fresh memory store per run; a
    ``sqlite:///path`` store is shared by the runs, each under its own run id). `drivers` drives each step
    from that many drivers at once (the first one crashes at the step's crash point). `clock_steps` moves
    the fake clock at each restart, in turn: by default an hour later (past every lease and deadline);
    give small and negative steps for restarts while leases are live and clocks that go back.
    """

    def __init__(
        self,
        *,
        reconcile: bool = False,
        safety: Safety = SideEffect,
        store_url: str = "memory://",
        drivers: int = 1,
        clock_steps: Sequence[float] = (3600.0,),
    ) -> None:
        if drivers < 1 or not clock_steps:
            raise ConfigError("drivers must be 1 or more and clock_steps must not be empty")
        self.reconcile = reconcile
        self.safety = safety
        self.store_url = store_url
        self.drivers = drivers
        self.clock_steps = tuple(clock_steps)
        self.name = (
            f"bide(safety={safety.value}, reconcile={reconcile}, store={store_url.split(':')[0]}, "
            f"drivers={drivers})"
        )
        self._n = 0
        self._tag = new_claim()[:8]
        self._shared: Store | None = None

    def _store(self) -> Store:
        if self.store_url.startswith("memory:"):
            return MemoryStore()
        if self._shared is None:
            self._shared = open_store(self.store_url)
        return self._shared

    def close(self) -> None:
        """Close the shared store (SQL stores)."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def new_run(self) -> CrashRun:
        self._n += 1
        return _BideRun(self, f"crash-{self._tag}-{self._n}")

    def writes(self) -> int:
        run = _BideRun(self, "probe")
        run.store = MemoryStore()  # the count of writes is the store's business, not the kind's
        crashing = CrashingStore(run.store, None)
        model = ScriptedModel([call("charge", customer="alice", cents=500), reply("done")])
        agent = Agent(model, store=crashing, tools=[run._tool(crashing)], system="charge")
        asyncio.run(agent.run("probe", "charge alice"))
        return 3 * crashing.writes
