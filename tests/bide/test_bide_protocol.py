"""The claim/lease/resolve protocol as a hypothesis state machine: several drivers of one run over one
store, on a fake clock, each pausing before any store call for as long as hypothesis likes, crashing
(before or after a store call commits) and waking up after the clock moved on; a resolver that decides from
the system of record whenever it is allowed to.

Invariants after every step: the side effect fired at most once; nothing is journaled after `run:end`; a
run that completed stays completed; a resolution is accepted only for a call that did not fire or with its
real outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import bide
from bide._inflight import forget_claims
from bide.testing import ScriptedModel, call, reply

DRIVERS = 2


class Crash(BaseException):
    """The driver's process died."""


class Driver:
    """One driver process: its task, and the gate its next store call waits at."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.task: asyncio.Task[Any] | None = None
        self.go = asyncio.Event()
        self.waiting = False
        self.crash: str | None = None  # "before" or "after" its next store call
        self.claimed = False  # paused right after its attempt marker committed
        self.outcomes: list[str] = []


class GatedStore:
    """The shared store as one driver sees it: every async call waits for the driver's gate first."""

    def __init__(self, inner: bide.Store, driver: Driver) -> None:
        self.inner = inner
        self.driver = driver
        self.url = inner.url
        self.durable = inner.durable

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def _through(self, name: str, *args: Any, **kwargs: Any) -> Any:
        # Two pause points per call: before it is sent, and after it committed, before its answer arrives
        # (a marker committed, its driver paused before the tool starts).
        self.driver.claimed = False
        await self._pause()
        if self.driver.crash == "before":
            raise Crash
        out = await getattr(self.inner, name)(*args, **kwargs)
        if name == "ainsert_many":
            self.driver.claimed = any(k.startswith("attempt:") for k, _ in args[1])
        await self._pause()
        if self.driver.crash is not None:
            raise Crash
        return out

    async def _pause(self) -> None:
        d = self.driver
        d.waiting = True
        await d.go.wait()
        d.go.clear()
        d.waiting = False

    def alease(self, *args: Any, **kwargs: Any) -> Any:
        return self._through("alease", *args, **kwargs)

    def arelease(self, *args: Any, **kwargs: Any) -> Any:
        return self._through("arelease", *args, **kwargs)

    def aload(self, *args: Any, **kwargs: Any) -> Any:
        return self._through("aload", *args, **kwargs)

    def ainsert_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._through("ainsert_many", *args, **kwargs)


class Protocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        forget_claims()
        self.loop = asyncio.new_event_loop()
        self.store = bide.MemoryStore()
        self.now = 1_800_000_000.0
        self.fired = 0
        self.completed = False
        self.drivers = [Driver(i) for i in range(DRIVERS)]

        async def charge(to: str) -> str:
            """Charge (the side effect; the ledger is the system of record)."""
            self.fired += 1
            return "charged"

        self.tool = bide.Tool.from_function(charge, timeout=5.0)

    def settle(self) -> None:
        for _ in range(30):
            self.loop.run_until_complete(asyncio.sleep(0))

    def agent(self, d: Driver) -> bide.Agent:
        return bide.Agent(
            ScriptedModel([call("charge", to="alice"), reply("done")]),
            store=GatedStore(self.store, d),
            tools=[self.tool],
            clock=lambda: self.now,
            lease_ttl=10.0,
            clock_skew=1.0,
        )

    def _collect(self, d: Driver) -> None:
        task = d.task
        if task is None or not task.done():
            return
        d.task = None
        if task.cancelled():
            d.outcomes.append("cancelled")
            return
        exc = task.exception()
        if exc is None:
            d.outcomes.append("completed")
            self.completed = True
        elif isinstance(exc, Crash):
            forget_claims()  # the process's memory died with it
            d.outcomes.append("crashed")
        else:
            assert isinstance(exc, (bide.RunInFlight, bide.OutcomeUnknown, bide.ToolNotStarted)), exc
            assert not (self.completed and isinstance(exc, bide.OutcomeUnknown)), "a finished run halted"
            d.outcomes.append(type(exc).__name__)

    def start(self, i: int) -> None:
        d = self.drivers[i]
        if d.task is None:
            d.crash = None
            d.task = self.loop.create_task(self.agent(d).run("r", "charge alice"))
            self.settle()

    def step(self, i: int, points: int = 1, *, to_claim: bool = False) -> None:
        """Let driver i pass `points` pause points, or (`to_claim`) go on until it is paused right after an
        attempt marker of its committed (before its tool starts); stop early when it stops."""
        d = self.drivers[i]
        for _ in range(points):
            if d.task is None or not d.waiting or (to_claim and d.claimed):
                break
            d.go.set()
            self.settle()
            self._collect(d)

    @rule(i=st.integers(0, DRIVERS - 1), to=st.sampled_from(["pause", "claim", "end"]))
    def drive(self, i: int, to: str) -> None:
        """Start driver i if it is idle, then let it go on: one pause point, up to its next claim, or to its
        end."""
        self.start(i)
        if to == "pause":
            self.step(i)
        else:
            self.step(i, 40, to_claim=to == "claim")

    @rule(i=st.integers(0, DRIVERS - 1))
    def stall(self, i: int) -> None:
        """Driver i stalls (a long GC pause, SIGSTOP) right after its next claim commits, until its lease
        and its window are long past."""
        self.start(i)
        self.step(i, 40, to_claim=True)
        self.advance(3600.0)

    @rule(i=st.integers(0, DRIVERS - 1), when=st.sampled_from(["before", "after"]))
    def crash(self, i: int, when: str) -> None:
        """The driver dies at its pause point ("before": a call not yet sent is lost; a committed call's
        answer is lost either way)."""
        d = self.drivers[i]
        if d.task is not None and d.waiting:
            d.crash = when
            d.go.set()
            self.settle()
            self._collect(d)

    @rule(seconds=st.sampled_from([2.0, 12.0]))
    def advance(self, seconds: float) -> None:
        """Time passes; the resolver, which polls, tries to decide at once."""
        self.now += seconds
        if self.store.load("r"):
            self.resolve()

    @precondition(lambda self: self.store.load("r") != [])
    @rule()
    def resolve(self) -> None:
        outcome = bide.Outcome.succeeded("charged") if self.fired else bide.Outcome.not_started()
        before = self.fired
        with contextlib.suppress(bide.ResolveRefused):
            self.loop.run_until_complete(
                bide.aresolve_halt(self.store, "r", "c0.0", outcome=outcome, clock=lambda: self.now)
            )
        assert self.fired == before
        self.settle()

    @invariant()
    def at_most_once(self) -> None:
        assert self.fired <= 1

    @invariant()
    def nothing_after_the_end(self) -> None:
        keys = [e.key for e in self.store.load("r")]
        if "run:end" in keys:
            assert keys[-1] == "run:end"
            assert self.fired == 1  # the run answers only after its charge

    @invariant()
    def completed_stays_completed(self) -> None:
        if self.completed:
            assert bide.run_status(self.store, "r").status == "completed"

    def teardown(self) -> None:
        # Every driver still running dies at its next pause point (its clean-up store calls too).
        for d in self.drivers:
            d.crash = "before"
        for _ in range(100):
            live = [d for d in self.drivers if d.task is not None and not d.task.done()]
            if not live:
                break
            for d in live:
                d.go.set()
            self.settle()
        for d in self.drivers:
            if d.task is not None and d.task.done() and not d.task.cancelled():
                d.task.exception()  # retrieved: a crash at teardown is expected
        self.loop.close()


TestProtocol = Protocol.TestCase
TestProtocol.settings = settings(
    max_examples=400, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_a_driver_paused_after_its_marker_committed_does_not_fire_after_a_resolution() -> None:
    """The schedule the state machine looks for, spelled out: driver A's marker commits and A pauses before
    its tool starts; its lease and its window pass; a resolver records not-started from the system of
    record; driver B fires the call and finishes the run. A wakes up: its window closed, so it does not
    fire, and it returns the run's answer."""
    m = Protocol()
    try:
        m.start(0)
        m.step(0, 40, to_claim=True)
        assert [e.key for e in m.store.load("r")][-1] == "attempt:c0.0:0"
        m.advance(3600.0)
        m.resolve()
        assert "not-started:c0.0:1" in [e.key for e in m.store.load("r")]
        m.start(1)
        m.step(1, 12)
        assert m.drivers[1].outcomes == ["completed"] and m.fired == 1
        m.step(0, 6)
        assert m.drivers[0].outcomes == ["completed"] and m.fired == 1
        m.at_most_once()
        m.nothing_after_the_end()
    finally:
        m.teardown()
