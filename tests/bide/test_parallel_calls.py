"""Parallel tool calls: the calls of one model turn run concurrently, each under the side-effect protocol,
their results go back in call order, and one call's halt loses none of the others' results."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from child_harness import effect_lines, finish, kill_at_point, spawn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide._inflight import forget_claims
from bide._journal import Journal
from bide._resolve import live_attempt
from bide.testing import Call, CrashingStore, ScriptedModel, SimulatedCrash, Turn, reply


def turn_of(*calls: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(calls=tuple(Call(name, args) for name, args in calls))


def keys(store: bide.Store, run_id: str) -> list[str]:
    return [e.key for e in store.load(run_id)]


def tool_messages(model: ScriptedModel, request: int = 1) -> list[tuple[str, str]]:
    return [(m.tool_call_id, m.content) for m in model.requests[request].messages if m.role == "tool"]  # type: ignore[union-attr]


def test_the_calls_of_one_turn_overlap() -> None:
    """Each tool waits until all three are running at once: only concurrent calls get past the barrier (run
    one after another, the first would time out)."""
    barrier = asyncio.Barrier(3)
    fired: list[str] = []

    async def meet(name: str) -> str:
        await asyncio.wait_for(barrier.wait(), 5.0)
        fired.append(name)
        return f"{name} done"

    @bide.tool(timeout=10)
    async def charge(customer: str) -> str:
        """A side effect."""
        return await meet(f"charge {customer}")

    @bide.tool(safety=bide.ReadOnly, timeout=10)
    async def lookup(customer: str) -> str:
        """A read."""
        return await meet(f"lookup {customer}")

    model = ScriptedModel(
        [
            turn_of(
                ("charge", {"customer": "a"}), ("lookup", {"customer": "b"}), ("charge", {"customer": "c"})
            ),
            reply("ok"),
        ]
    )
    store = bide.open_store("memory://")
    result = bide.Agent(model, store=store, tools=[charge, lookup]).run_sync("r", "go")
    assert result.answer == "ok"
    assert sorted(fired) == ["charge a", "charge c", "lookup b"]
    assert tool_messages(model) == [
        ("call_0_0", "charge a done"),
        ("call_0_1", "lookup b done"),
        ("call_0_2", "charge c done"),
    ]
    # Each side effect has its own marker; the turn was journaled on its own before any call acted.
    k = keys(store, "r")
    assert k.index("model:0") < min(k.index("attempt:c0.0:0"), k.index("attempt:c0.2:0"))
    assert "attempt:c0.1:0" not in k and {"result:c0.0", "result:c0.1", "result:c0.2"} <= set(k)


def test_results_go_back_in_call_order_whatever_order_they_finish_in() -> None:
    """c0 waits for c1 to finish, c1 for c2: they finish c2, c1, c0; the model sees c0, c1, c2."""
    done = {i: asyncio.Event() for i in range(3)}
    finished: list[int] = []

    @bide.tool(safety=bide.Idempotent, timeout=10)
    async def step(i: int) -> str:
        """A step."""
        if i < 2:
            await asyncio.wait_for(done[i + 1].wait(), 5.0)
        finished.append(i)
        done[i].set()
        return f"step {i}"

    model = ScriptedModel([turn_of(*(("step", {"i": i}) for i in range(3))), reply("ok")])
    store = bide.open_store("memory://")
    bide.Agent(model, store=store, tools=[step]).run_sync("r", "go")
    assert finished == [2, 1, 0]
    assert tool_messages(model) == [(f"call_0_{i}", f"step {i}") for i in range(3)]
    # The journal holds them in the order they finished; the messages are in call order all the same.
    k = [x for x in keys(store, "r") if x.startswith("result:")]
    assert k == ["result:c0.2", "result:c0.1", "result:c0.0"]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_max_parallel_bounds_the_calls_in_flight(limit: int) -> None:
    active = 0
    peak = 0

    @bide.tool(safety=bide.ReadOnly)
    async def work(i: int) -> int:
        """Work."""
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        for _ in range(5):  # stay running across several event-loop iterations
            await asyncio.sleep(0)
        active -= 1
        return i

    model = ScriptedModel([turn_of(*(("work", {"i": i}) for i in range(5))), reply("ok")])
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[work], max_parallel=limit)
    agent.run_sync("r", "go")
    assert peak == limit
    assert tool_messages(model) == [(f"call_0_{i}", str(i)) for i in range(5)]


def test_max_parallel_must_be_a_positive_whole_number() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(bide.ConfigError, match="max_parallel"):
            bide.Agent(ScriptedModel([]), store=bide.open_store("memory://"), max_parallel=bad)  # type: ignore[arg-type]


def test_sequential_turn_writes_the_turn_with_the_first_marker() -> None:
    """max_parallel=1 keeps the one-after-another path: the turn rides with the first marker."""
    calls: list[str] = []

    @bide.tool
    async def charge(customer: str) -> str:
        """Charge."""
        calls.append(customer)
        return "ok"

    store = bide.open_store("memory://")
    model = ScriptedModel(
        [turn_of(("charge", {"customer": "a"}), ("charge", {"customer": "b"})), reply("ok")]
    )
    bide.Agent(model, store=store, tools=[charge], max_parallel=1).run_sync("r", "go")
    assert calls == ["a", "b"]
    assert keys(store, "r")[2:] == [
        "model:0",
        "attempt:c0.0:0",
        "result:c0.0",
        "attempt:c0.1:0",
        "result:c0.1",
        "model:1",
        "run:end",
    ]


def test_each_side_effect_halts_on_its_own_and_the_others_results_are_kept() -> None:
    """Four side effects in one turn: one succeeds, one fails in a known way, one raises (unknown outcome),
    one proves it did not start. The run halts on the unknown one (the not-started one rides along in
    `also`); the two results are journaled and reused; a resumed run retries the not-started call, halts
    again on the unknown one until it is resolved, then completes. Nothing fires twice."""
    fires: dict[str, int] = {}
    refused = [True]

    @bide.tool(timeout=0.2)
    async def act(name: str) -> str:
        """Act."""
        if name == "unstarted" and refused[0]:
            refused[0] = False
            raise bide.NotCalled("connection refused before sending")
        fires[name] = fires.get(name, 0) + 1
        if name == "declined":
            raise bide.ToolError("card declined")
        if name == "lost":
            raise ConnectionResetError("reset after the request went out")
        return f"{name} ok"

    names = ["fine", "declined", "lost", "unstarted"]
    script = [turn_of(*(("act", {"name": n}) for n in names)), reply("ok")]
    store = bide.open_store("memory://")

    def agent() -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[act], clock_skew=0)  # as resolved below

    with pytest.raises(bide.OutcomeUnknown) as halt:
        agent().run_sync("r", "go")
    assert halt.value.call_id == "c0.2"
    assert [type(e) for e in halt.value.also] == [bide.ToolNotStarted]
    assert any("also: ToolNotStarted" in note for note in halt.value.__notes__)
    assert "bide.NotCalled" in str(halt.value) and "reconcile" in str(halt.value)
    assert "retry=bide.RetryPolicy" in str(halt.value) and "bide.ToolError" in str(halt.value)
    journal = Journal(store, "r").load()
    assert journal.has("result:c0.0") and journal.has("result:c0.1")
    assert not journal.has("result:c0.2") and not journal.has("result:c0.3")
    assert fires == {"fine": 1, "declined": 1, "lost": 1}

    with pytest.raises(bide.OutcomeUnknown) as again:
        agent().run_sync("r", "go")
    assert again.value.call_id == "c0.2" and again.value.also == ()
    assert fires == {"fine": 1, "declined": 1, "lost": 1, "unstarted": 1}  # only the not-started one ran

    time.sleep(0.25)
    bide.resolve_halt(store, "r", "c0.2", outcome=bide.Outcome.failed("reset; not charged"), clock_skew=0)
    model = ScriptedModel(script)
    assert bide.Agent(model, store=store, tools=[act]).run_sync("r", "go").answer == "ok"
    assert fires == {"fine": 1, "declined": 1, "lost": 1, "unstarted": 1}
    assert tool_messages(model, 0) == [
        ("call_0_0", "fine ok"),
        ("call_0_1", "card declined"),
        ("call_0_2", "reset; not charged"),
        ("call_0_3", "unstarted ok"),
    ]


def test_a_halt_and_a_sleep_in_one_turn_raise_the_halt() -> None:
    """The worst failure of a turn is raised: a lost outcome over a timer that sleeps."""

    @bide.tool(timeout=0.5)
    async def lost() -> str:
        """Lose the outcome."""
        raise RuntimeError("boom")

    model = ScriptedModel([turn_of(("wait", {"seconds": 3600}), ("lost", {})), reply("ok")])
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[lost, bide.timer()])
    with pytest.raises(bide.OutcomeUnknown) as halt:
        agent.run_sync("r", "go")
    assert [type(e) for e in halt.value.also] == [bide.RunSleeping]
    # The run's status says the same (it waits for a person, not for time), whatever the call order.
    status = bide.run_status(agent.store, "r")
    assert (status.status, status.call_id, status.tool) == ("halted", "c0.1", "lost")


def test_a_run_waits_for_the_call_that_needs_the_most() -> None:
    """Whatever their order in the turn: a call never started says nothing, an approval outranks a timer,
    a lost outcome outranks both."""

    @bide.tool(timeout=0.5)
    async def lost() -> str:
        """Lose the outcome."""
        raise RuntimeError("boom")

    class Hold:
        async def check(self, request: bide.GateRequest) -> bide.GateDecision:
            return bide.Pending("a manager must approve")

    @bide.tool(gate=Hold())
    async def pay() -> str:
        """Pay."""
        return "paid"

    def status_after(*calls: tuple[str, dict[str, Any]]) -> tuple[str, str | None]:
        store = bide.open_store("memory://")
        agent = bide.Agent(
            ScriptedModel([turn_of(*calls), reply("ok")]), store=store, tools=[lost, pay, bide.timer()]
        )
        with pytest.raises((bide.OutcomeUnknown, bide.ApprovalPending, bide.RunSleeping)):
            agent.run_sync("r", "go")
        status = bide.run_status(store, "r")
        return status.status, status.tool

    wait = ("wait", {"seconds": 3600})
    assert status_after(wait, ("pay", {})) == ("awaiting_approval", "pay")
    assert status_after(("pay", {}), wait) == ("awaiting_approval", "pay")
    assert status_after(wait, ("pay", {}), ("lost", {})) == ("halted", "lost")
    assert status_after(("lost", {}), wait) == ("halted", "lost")


def test_a_cancelled_drive_cancels_its_calls_and_voids_the_unstarted_ones() -> None:
    """Cancelling the drive cancels every call of the turn; each call that had not started is remembered as
    never started, so the next drive in this process voids its marker instead of halting."""
    started = asyncio.Event()
    fired: list[str] = []

    @bide.tool(timeout=30)
    async def slow(name: str) -> str:
        """Slow."""
        if name == "first":
            started.set()
            await asyncio.sleep(30)
        fired.append(name)
        return name

    store = bide.open_store("memory://")

    async def main() -> None:
        model = ScriptedModel(
            [turn_of(("slow", {"name": "first"}), ("slow", {"name": "second"})), reply("ok")]
        )
        task = asyncio.ensure_future(bide.Agent(model, store=store, tools=[slow]).run("r", "go"))
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert fired == ["second"]
    # The first call started and was cancelled mid-call: its outcome is unknown, the second has its result.
    with pytest.raises(bide.OutcomeUnknown) as halt:
        bide.Agent(ScriptedModel([]), store=store, tools=[slow]).run_sync("r", "go")
    assert halt.value.call_id == "c0.0"
    assert Journal(store, "r").load().has("result:c0.1")


class OverLimit:
    """Approves small charges at once; a larger one waits for an approval record in the journal."""

    async def check(self, request: bide.GateRequest) -> bide.GateDecision:
        if request.arguments["cents"] <= 1000:
            return bide.Approved(evidence="under the limit")
        if request.journal.get(f"approval:{request.call_id}") is not None:
            return bide.Approved(evidence="manager")
        return bide.Pending("over the limit: a manager must approve")


def test_a_gate_pausing_one_call_of_a_parallel_turn_keeps_the_others() -> None:
    charged: list[int] = []

    @bide.tool(gate=OverLimit())
    async def charge(cents: int) -> str:
        """Charge."""
        charged.append(cents)
        return f"charged {cents}"

    script = [turn_of(*(("charge", {"cents": c}) for c in (500, 5000, 700))), reply("ok")]
    store = bide.open_store("memory://")
    with pytest.raises(bide.ApprovalPending) as paused:
        bide.Agent(ScriptedModel(script), store=store, tools=[charge]).run_sync("r", "go")
    assert paused.value.call_id == "c0.1" and sorted(charged) == [500, 700]
    assert bide.run_status(store, "r").status == "awaiting_approval"

    async def approve() -> None:
        await bide.GateJournal(await Journal(store, "r").aload()).put("approval:c0.1", {"by": "carol"})

    asyncio.run(approve())
    model = ScriptedModel(script)
    assert bide.Agent(model, store=store, tools=[charge]).run_sync("r", "go").answer == "ok"
    assert sorted(charged) == [500, 700, 5000]  # each once
    assert tool_messages(model, 0) == [
        ("call_0_0", "charged 500"),
        ("call_0_1", "charged 5000"),
        ("call_0_2", "charged 700"),
    ]


def test_a_lease_taken_over_mid_turn_fences_the_calls_still_running() -> None:
    """While one call of the turn runs, another driver takes the expired lease over: the running call's
    result write is refused (nothing written), the drive raises RunInFlight, and the new holder halts on
    that call instead of firing it again; the call that finished before keeps its result."""
    now = [1_800_000_000.0]
    release = asyncio.Event()
    fired: list[str] = []

    @bide.tool(timeout=1000)
    async def act(name: str) -> str:
        """Act."""
        if name == "slow":
            await release.wait()
        fired.append(name)
        return name

    store = bide.open_store("memory://")
    script = [turn_of(("act", {"name": "fast"}), ("act", {"name": "slow"})), reply("ok")]

    def agent() -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[act], clock=lambda: now[0])

    async def main() -> None:
        task = asyncio.ensure_future(agent().run("r", "go"))
        while "result:c0.0" not in keys(store, "r"):
            await asyncio.sleep(0.005)
        now[0] += 100  # the drive's lease has expired; another driver takes it over
        assert store.lease("r", "other", now_ms=int(now[0] * 1000), ttl_ms=30_000).held
        release.set()
        with pytest.raises(bide.RunInFlight):
            await task

    asyncio.run(main())
    assert fired == ["fast", "slow"]
    assert "result:c0.1" not in keys(store, "r")
    now[0] += 100
    forget_claims()  # the new holder is another process: it knows nothing of this one's calls
    with pytest.raises(bide.OutcomeUnknown) as halt:
        agent().run_sync("r", "go")
    assert halt.value.call_id == "c0.1" and fired == ["fast", "slow"]


def test_sync_calls_of_one_turn_past_their_deadline_keep_the_lease_until_all_return() -> None:
    """Two synchronous side effects of one turn run on past their timeout: the drive halts, the run stays in
    flight (its lease kept, no resolution accepted) until both have returned, then both real results are
    journaled and the next drive finishes without calling either again. The timeout (2 s) leaves a loaded
    machine room to start both calls: a synchronous call starts only inside its window, once a worker
    thread picks it up (with 0.3 s, one could be given up on before it started)."""
    import threading

    fired: list[str] = []
    release = {"x": threading.Event(), "y": threading.Event()}

    @bide.tool(timeout=2.0)
    def slow_charge(to: str) -> str:
        """Charge, slowly."""
        fired.append(to)
        release[to].wait(10)
        return f"charged {to} late"

    store = bide.open_store("memory://")
    script = [turn_of(("slow_charge", {"to": "x"}), ("slow_charge", {"to": "y"})), reply("done")]

    def agent(**lease: float) -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[slow_charge], lease_ttl=0.6, **lease)

    async def scenario() -> bide.RunResult:
        with pytest.raises(bide.OutcomeUnknown, match="still running past") as halt:
            await agent().run("r", "go")
        assert len(halt.value.also) == 1
        release["x"].set()
        await asyncio.sleep(1.0)  # x returned; y still runs past the first lease: the keeper renews
        with pytest.raises(bide.RunInFlight):
            await agent().run("r", "go")
        for call_id in ("c0.0", "c0.1"):
            with pytest.raises(bide.HaltInFlight):
                await bide.aresolve_halt(
                    store, "r", call_id, outcome=bide.Outcome.not_started(), clock_skew=0
                )
        release["y"].set()
        return await agent(lease_wait=10).run("r", "go")

    result = asyncio.run(scenario())
    assert result.answer == "done" and sorted(fired) == ["x", "y"]
    journal = Journal(store, "r").load()
    for call_id, to in (("c0.0", "x"), ("c0.1", "y")):
        late = journal.get(f"result:{call_id}")
        assert isinstance(late, bide.ToolResult) and late.result == f"charged {to} late"


# -- a property: random turns of random tools and outcomes, crashed and resumed --------------------------

KINDS = {"side": bide.SideEffect, "idem": bide.Idempotent, "read": bide.ReadOnly}
# What one try of a call does: return, fail in a known way, prove it did not start, raise (outcome unknown),
# or the process dies right after the effect or right before it.
BEHAVIOURS = ["ok", "tool_error", "not_called", "raise", "crash_after", "crash_before"]


class World:
    """The system of record: how often each call's effect really happened, and a simulated process."""

    def __init__(self, plans: list[tuple[str, list[str]]], limit: int) -> None:
        self.plans = plans
        self.limit = limit
        self.fired: dict[int, int] = {}
        self.tries: dict[int, int] = {}
        self.now = 1_800_000_000.0
        self.store = bide.open_store("memory://")
        self.crashing: CrashingStore | None = None

    def tools(self) -> list[bide.Tool]:
        out = []
        for kind in KINDS:
            out.append(bide.Tool.from_function(self._fn(), name=f"t_{kind}", safety=KINDS[kind], timeout=5.0))
        return out

    def _fn(self) -> Any:
        world = self

        async def act(i: int) -> str:
            """Act."""
            n = world.tries.get(i, 0)
            world.tries[i] = n + 1
            plan = world.plans[i][1]
            what = plan[n] if n < len(plan) else "ok"
            await asyncio.sleep(0)  # let the other calls of the turn interleave
            if what == "crash_before":
                world.die()
            if what == "not_called":
                raise bide.NotCalled("refused")
            world.fired[i] = world.fired.get(i, 0) + 1
            if what == "crash_after":
                world.die()
            if what == "tool_error":
                raise bide.ToolError("declined")
            if what == "raise":
                raise RuntimeError("lost")
            return f"done {i}"

        return act

    def die(self) -> None:
        assert self.crashing is not None
        self.crashing.dead = True  # every later store call of this "process" dies too
        raise SimulatedCrash("killed")

    def step(self, script: list[Turn]) -> str:
        forget_claims()  # a new process remembers nothing
        self.now += 100.0  # past every deadline and lease of the last step
        self.crashing = CrashingStore(self.store, None)
        agent = bide.Agent(
            ScriptedModel(script),
            store=self.crashing,  # type: ignore[arg-type]
            tools=self.tools(),
            clock=lambda: self.now,
            max_parallel=self.limit,
        )
        try:
            agent.run_sync("r", "go")
        except SimulatedCrash:
            return "crashed"
        except bide.ToolNotStarted:
            return "not_started"
        except bide.OutcomeUnknown as halt:
            if self.limit > 1:
                # Every call left with a live marker and no result is reported, the raised one or in `also`.
                reported = {halt.call_id} | {
                    e.call_id for e in halt.also if isinstance(e, bide.OutcomeUnknown)
                }
                journal = Journal(self.store, "r").load()
                open_calls = {
                    f"c0.{i}"
                    for i in range(len(self.plans))
                    if live_attempt(journal, f"c0.{i}") is not None and not journal.has(f"result:c0.{i}")
                }
                assert reported == open_calls, (reported, open_calls, self.plans)
            self.resolve()
            return "halted"
        return "completed"

    def resolve(self) -> None:
        """Decide every call with a lost outcome from the system of record, as an operator would: for the
        attempt live as they look (`bide show` names it)."""
        journal = Journal(self.store, "r").load()
        for i in range(len(self.plans)):
            outcome = bide.Outcome.succeeded(f"done {i}") if self.fired.get(i) else bide.Outcome.not_started()
            live = live_attempt(journal, f"c0.{i}")
            with contextlib.suppress(bide.NoLiveAttempt, bide.HaltAlreadyResolved):
                bide.resolve_halt(
                    self.store,
                    "r",
                    f"c0.{i}",
                    outcome=outcome,
                    clock=lambda: self.now + 10,
                    attempt=None if live is None else live.gen,
                )


plans = st.lists(
    st.tuples(st.sampled_from(sorted(KINDS)), st.lists(st.sampled_from(BEHAVIOURS), max_size=3)),
    min_size=2,
    max_size=5,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=plans, limit=st.sampled_from([1, 2, 8]))
def test_resumed_parallel_turns_never_fire_a_side_effect_twice(
    plans: list[tuple[str, list[str]]], limit: int
) -> None:
    world = World(plans, limit)
    script = [
        Turn(calls=tuple(Call(f"t_{kind}", {"i": i}) for i, (kind, _) in enumerate(plans))),
        reply("ok"),
    ]
    outcome = ""
    for _ in range(40):
        outcome = world.step(script)
        if outcome == "completed":
            break
    assert outcome == "completed"
    for i, (kind, _) in enumerate(plans):
        if kind == "side":
            assert world.fired.get(i, 0) <= 1, (i, plans, world.fired)
    # Every call has exactly one journaled result, and the model saw them in call order.
    journal = Journal(world.store, "r").load()
    for i in range(len(plans)):
        assert journal.has(f"result:c0.{i}")


# -- a real crash: SIGKILL between two side effects of one parallel turn ------------------------------------

CHILD = Path(__file__).with_name("parallel_child.py")


def child(url: str, effects: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return spawn(CHILD, url, "run-1", str(effects), env=env)


def finished(proc: subprocess.Popen[str]) -> dict[str, Any]:
    return finish(proc, timeout=60)[0]


def fired(effects: Path) -> dict[str, int]:
    return {n: len(effect_lines(effects / n)) for n in "abc"}


def resolve(url: str, call_id: str, *what: str) -> None:
    """Resolve a halted call through the CLI once its deadline (plus a small skew) has passed."""
    for _ in range(100):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "bide._cli",
                "resolve",
                "--store",
                url,
                "run-1",
                call_id,
                *what,
                "--clock-skew",
                "0.1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # Not yet (exit 7) while the call's deadline plus the skew has not passed: wait and retry.
        if res.returncode != 7 or "may still be running" not in res.stderr:
            break
        time.sleep(0.1)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("point", ["between", "after_b"])
def test_sigkill_between_two_side_effects_of_a_parallel_turn(point: str, tmp_path: Path) -> None:
    """Killed with a's result journaled, b claimed (and fired, for "after_b") and c claimed but waiting:
    the restart reuses a's result and halts on b and c together (both outcomes are unknown to it); once
    they are resolved from the system of record, the run completes, and every effect fired exactly once."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    effects = tmp_path / "effects"
    effects.mkdir()
    signal_file = tmp_path / "signal"
    kill_at_point(CHILD, url, "run-1", str(effects), point=point, signal_file=signal_file)
    b_fired = 1 if point == "after_b" else 0
    assert fired(effects) == {"a": 1, "b": b_fired, "c": 0}

    again = finished(child(url, effects))
    assert again == {"outcome": "halted", "halted": ["c0.1", "c0.2"]}
    assert fired(effects) == {"a": 1, "b": b_fired, "c": 0}  # nothing fired on the restart
    shown = subprocess.run(
        [sys.executable, "-m", "bide._cli", "show", "--store", url, "run-1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and json.loads(shown.stdout)["run"]["status"] == "halted"

    # The operator checks the system of record (the files) and decides both calls.
    resolve(url, "c0.1", *(["--succeeded", '"b done"'] if b_fired else ["--not-started"]))
    resolve(url, "c0.2", "--not-started")
    assert finished(child(url, effects)) == {"outcome": "completed", "answer": "done"}
    assert fired(effects) == {"a": 1, "b": 1, "c": 1}


@pytest.mark.parametrize("url", ["sqlite", "memory"])
def test_an_overrunning_call_is_journaled_as_soon_as_it_returns_while_its_turn_runs_on(
    url: str, tmp_path: Path
) -> None:
    """A synchronous side effect runs past its timeout while a sibling call of its turn still runs. Its
    result is journaled (committed, seen by another store object) as soon as it returns, not when the whole
    turn ends: a crash between the two finds the result instead of halting a call whose outcome was known.
    The drive still halts on it (it overran), and the next drive goes on with the journaled result. The
    timeout (2 s) leaves a loaded machine room to start the call (a synchronous call starts only inside its
    window, once the marker committed and a worker thread picked it up); the call returns past it whenever
    it started."""
    import threading

    returned = threading.Event()
    fired: list[str] = []

    @bide.tool(timeout=2.0)
    def charge(to: str) -> str:
        """Charge, slowly: a second past the deadline, which is at most the timeout after the call started
        (the drive finds it still running when its timeout fires, even a second late)."""
        time.sleep(3.0)
        fired.append(to)
        returned.set()
        return f"charged {to}"

    sibling_may_end = asyncio.Event()

    @bide.tool(timeout=30.0)
    async def ship(to: str) -> str:
        """Ship, once the test lets it."""
        await sibling_may_end.wait()
        return f"shipped {to}"

    url = f"sqlite:///{tmp_path / 'runs.db'}" if url == "sqlite" else "memory://"
    store = bide.open_store(url)
    reader = bide.open_store(url) if url.startswith("sqlite") else store
    script = [turn_of(("charge", {"to": "x"}), ("ship", {"to": "x"})), reply("done")]

    def agent() -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[charge, ship], lease_ttl=3.0)

    async def scenario() -> list[str]:
        drive = asyncio.ensure_future(agent().run("r", "go"))
        await asyncio.to_thread(returned.wait, 10)
        seen: list[str] = []
        for _ in range(500):  # up to 5 s; the sibling call is still running all along
            seen = keys(reader, "r")
            if "result:c0.0" in seen:
                break
            await asyncio.sleep(0.01)
        assert not drive.done()
        sibling_may_end.set()
        with pytest.raises(bide.OutcomeUnknown, match="still running past"):
            await drive
        return seen

    seen = asyncio.run(scenario())
    assert "result:c0.0" in seen and "result:c0.1" not in seen
    late = Journal(store, "r").load().get("result:c0.0")
    assert isinstance(late, bide.ToolResult) and late.result == "charged x"
    again = bide.Agent(ScriptedModel(script), store=store, tools=[charge, ship], lease_wait=10)
    result = asyncio.run(again.run("r", "go"))
    assert result.answer == "done" and fired == ["x"]
