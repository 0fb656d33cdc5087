"""The agent loop and the side-effect protocol: replay, refusal, halts, resolution, reconcilers, gates."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import pytest
from pydantic import BaseModel

import bide
from bide._inflight import forget_claims
from bide._journal import Journal
from bide.testing import Call, Fail, ScriptedModel, Turn, call, reply

RUN_INPUT = "charge alice"


class Ledger:
    """A fake system of record for a payment provider."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int, str]] = []

    def tool(self, **kwargs: Any) -> bide.Tool:
        ledger = self

        def charge_card(customer: str, cents: int, idempotency_key: str) -> str:
            """Charge a customer's card."""
            ledger.charges.append((customer, cents, idempotency_key))
            return f"charged {customer} {cents}"

        return bide.Tool.from_function(charge_card, **kwargs)


def charge_script(*extra: Any) -> ScriptedModel:
    return ScriptedModel([call("charge_card", customer="alice", cents=500), *extra, reply("done")])


def keys(store: bide.Store, run_id: str) -> list[str]:
    return [e.key for e in store.load(run_id)]


def test_one_tool_run_end_to_end(store: bide.Store) -> None:
    ledger = Ledger()
    model = charge_script()
    agent = bide.Agent(model, store=store, tools=[ledger.tool()], system="You charge cards.")
    result = agent.run_sync("r1", RUN_INPUT)
    assert result.answer == "done" and not result.replayed
    assert len(ledger.charges) == 1 and len(model.requests) == 2
    assert keys(store, "r1") == [
        "@journal",
        "run:start",
        "model:0",
        "attempt:c0.0:0",
        "result:c0.0",
        "model:1",
        "run:end",
    ]
    # The model saw the system prompt, the input, its call and the tool result.
    second = model.requests[1].messages
    assert [m.role for m in second] == ["system", "user", "assistant", "tool"]
    assert second[3].content == "charged alice 500"  # type: ignore[union-attr]
    # A finished run returns its journaled answer without calling the model or the tool.
    again = bide.Agent(ScriptedModel([]), store=store, tools=[ledger.tool()], system="changed prompt")
    replay = again.run_sync("r1", RUN_INPUT)
    assert replay.answer == "done" and replay.replayed
    assert len(ledger.charges) == 1
    assert bide.run_status(store, "r1").status == "completed"


def test_every_record_is_canonical_and_salted(store: bide.Store) -> None:
    agent = bide.Agent(charge_script(), store=store, tools=[Ledger().tool()])
    agent.run_sync("r", RUN_INPUT)
    salts = set()
    for e in store.load("r"):
        obj = json.loads(e.data)
        assert bide.canonical_json(obj) == e.data
        assert obj["key"] == e.key
        salts.add(obj["salt"])
        assert len(__import__("base64").b64decode(obj["salt"])) == 32
        assert bide.encode_record(bide.decode_record(e.key, e.data)) == e.data
    assert len(salts) == len(store.load("r"))


def test_different_input_or_entry_point_is_refused() -> None:
    store = bide.open_store("memory://")
    agent = bide.Agent(charge_script(), store=store, tools=[Ledger().tool()])
    agent.run_sync("r", RUN_INPUT)
    with pytest.raises(bide.RunMismatch, match="different input"):
        agent.run_sync("r", "charge bob")
    other = bide.Agent(charge_script(), store=store, tools=[Ledger().tool()], name="billing")
    with pytest.raises(bide.RunMismatch, match="agent:billing"):
        other.run_sync("r", RUN_INPUT)
    # Refused before anything is written.
    assert len(store.load("r")) == 7


def test_resume_replays_recorded_result_without_calling_tool() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    agent = bide.Agent(charge_script(Fail(bide.ModelError("model down"))), store=store, tools=[ledger.tool()])
    with pytest.raises(bide.ModelError):
        agent.run_sync("r", RUN_INPUT)
    assert len(ledger.charges) == 1
    model = charge_script()
    result = bide.Agent(model, store=store, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)
    assert result.answer == "done"
    assert len(ledger.charges) == 1
    assert len(model.requests) == 1  # turn 0 came from the journal


def _halt_by_losing_result(
    store: bide.Store, ledger: Ledger, *, timeout: float = 60.0, fire: bool = True
) -> None:
    """Leave run "r" with an attempt marker and no result, as a crash in the window would."""
    agent = bide.Agent(charge_script(), store=store, tools=[ledger.tool(timeout=timeout)])
    journal = Journal(store, "r").load()
    journal.write([bide.Start(key="run:start", entry=agent.entry, input=RUN_INPUT)])
    model_turn = asyncio.run(
        agent.model.complete(
            bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content=RUN_INPUT)], tools=[])
        )
    )
    calls = [dataclasses.replace(c, call_id="c0.0") for c in model_turn.tool_calls]
    journal.write(
        [bide.ModelTurn(key="model:0", turn=0, message=dataclasses.replace(model_turn, tool_calls=calls))]
    )
    now = int(time.time() * 1000)
    journal.write(
        [
            bide.Attempt(
                key="attempt:c0.0:0",
                call_id="c0.0",
                tool="charge_card",
                arguments={"customer": "alice", "cents": 500},
                gen=0,
                claim="ab" * 16,
                attempted_at_ms=now,
                deadline_ms=now + int(timeout * 1000),
            )
        ]
    )
    if fire:
        ledger.charges.append(("alice", 500, bide.idempotency_key_for("r", "c0.0")))


def test_marker_without_result_halts_with_outcome_unknown() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger)
    model = charge_script()
    agent = bide.Agent(model, store=store, tools=[ledger.tool()])
    with pytest.raises(bide.OutcomeUnknown) as info:
        agent.run_sync("r", RUN_INPUT)
    halt = info.value
    assert isinstance(halt, bide.RunHalted) and halt.status == "halted"
    assert (halt.run_id, halt.call_id, halt.tool) == ("r", "c0.0", "charge_card")
    assert halt.arguments == {"customer": "alice", "cents": 500}
    assert "resolve_halt" in str(halt) and halt.cause == "crashed"
    assert len(ledger.charges) == 1 and model.requests == []
    # Halting again and again never calls the tool.
    with pytest.raises(bide.OutcomeUnknown):
        agent.run_sync("r", RUN_INPUT)
    assert len(ledger.charges) == 1
    st = bide.run_status(store, "r")
    assert (st.status, st.call_id, st.tool) == ("halted", "c0.0", "charge_card")


@pytest.mark.parametrize("skew", [float("nan"), -100.0, float("-inf"), float("inf"), "1", True])
def test_a_clock_skew_that_is_not_a_duration_is_refused_before_anything_is_decided(skew: Any) -> None:
    """A NaN margin made every "not yet" comparison false and a negative one moved the deadline earlier:
    either let a resolver (or a reconciler) decide a call that could still be running, inside its window."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=30.0)
    with pytest.raises(bide.ConfigError, match="clock_skew must be a number of seconds"):
        bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=skew)
    with pytest.raises(bide.ConfigError, match="clock_skew must be a number of seconds"):
        bide.Agent(charge_script(), store=store, tools=[ledger.tool()], clock_skew=skew)
    with pytest.raises(bide.HaltInFlight):  # inside the window, as with the default margin
        bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started())
    assert bide.run_status(store, "r").status == "halted" and len(ledger.charges) == 1


@pytest.mark.parametrize(
    "options",
    [
        {"lease_ttl": float("inf")},
        {"lease_ttl": 0},
        {"lease_wait": float("nan")},
        {"cancel_check": float("nan")},
        {"max_turns": "3"},
        {"max_turns": 0},
    ],
)
def test_agent_durations_and_counts_are_checked_when_it_is_made(options: dict[str, Any]) -> None:
    """Each of these was accepted and failed later, inside a run (OverflowError, TypeError), after the model
    had been called."""
    with pytest.raises(bide.ConfigError, match=next(iter(options))):
        bide.Agent(charge_script(), store=bide.open_store("memory://"), **options)


def test_a_tool_timeout_must_be_a_finite_duration() -> None:
    with pytest.raises(bide.ConfigError, match="timeout must be a number of seconds"):
        Ledger().tool(timeout=float("inf"))


@pytest.mark.parametrize("skew", ["nan", "-5", "inf", "soon"])
def test_bide_resolve_refuses_a_clock_skew_that_is_not_a_duration(tmp_path: Any, skew: str) -> None:
    url = f"sqlite:///{tmp_path}/runs.db"
    store = bide.open_store(url)
    _halt_by_losing_result(store, Ledger(), timeout=30.0)
    store.close()
    command = ["resolve", "--store", url, "r", "c0.0", "--not-started", f"--clock-skew={skew}"]
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--clock-skew" in done.stderr, done
    assert bide.run_status(bide.open_store(url), "r").status == "halted"


def test_resolve_halt_refuses_while_call_may_run_then_records() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.2)
    with pytest.raises(bide.HaltInFlight) as info:
        bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.succeeded("charged alice 500"))
    assert info.value.retry_after is not None
    time.sleep(0.25)
    bide.resolve_halt(
        store,
        "r",
        "c0.0",
        outcome=bide.Outcome.succeeded("charged alice 500", evidence={"provider": "ch_1"}),
        clock_skew=0.0,
    )
    # The same outcome again is accepted; a different one is refused.
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.succeeded("charged alice 500"), clock_skew=0)
    with pytest.raises(bide.HaltAlreadyResolved):
        bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.failed("declined"), clock_skew=0)
    with pytest.raises(bide.NoLiveAttempt):
        bide.resolve_halt(store, "nope", "c0.0", outcome=bide.Outcome.not_started())
    model = charge_script()
    result = bide.Agent(model, store=store, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)
    assert result.answer == "done" and len(ledger.charges) == 1
    rec = Journal(store, "r").load().get("result:c0.0")
    assert isinstance(rec, bide.ToolResult) and rec.reconciled and rec.evidence == {"provider": "ch_1"}
    assert model.requests[0].messages[-1].content == "charged alice 500"  # type: ignore[union-attr]


def test_resolve_not_started_retries_the_call_once() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=False)
    time.sleep(0.02)
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=0)
    # The same decision again is accepted (nothing more is written); a different one is refused.
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=0)
    with pytest.raises(bide.HaltAlreadyResolved):
        bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.failed("declined"), clock_skew=0)
    result = bide.Agent(charge_script(), store=store, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)
    assert result.answer == "done"
    assert len(ledger.charges) == 1
    assert "attempt:c0.0:2" in keys(store, "r")  # gen 0 lost, gen 1 the resolver, gen 2 the real call


def test_a_not_started_resolution_journals_its_evidence() -> None:
    """The not-started record has no evidence field: its reason carries the resolver's evidence (it was
    dropped, so an auditor could not see why a call was declared never made)."""
    store = bide.open_store("memory://")
    _halt_by_losing_result(store, Ledger(), timeout=0.01, fire=False)
    time.sleep(0.02)
    outcome = bide.Outcome.not_started(evidence={"ledger": "no charge", "by": "ops"})
    bide.resolve_halt(store, "r", "c0.0", outcome=outcome, clock_skew=0)
    voided = [r for r in Journal(store, "r").load().records() if isinstance(r, bide.NotStarted)]
    said = 'resolved as not started; evidence: {"by":"ops","ledger":"no charge"}'
    assert [r.reason for r in voided] == [said]


def test_resolve_failed_gives_model_an_error() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=False)
    time.sleep(0.02)
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.failed("card declined"), clock_skew=0)
    model = charge_script()
    bide.Agent(model, store=store, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)
    last = model.requests[0].messages[-1]
    assert last.role == "tool" and last.is_error and last.content == "card declined"  # type: ignore[union-attr]
    assert ledger.charges == []


@pytest.mark.parametrize("charged", [True, False])
def test_reconciler_resolves_automatically(charged: bool) -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=charged)
    seen: list[bide.AttemptInfo] = []

    async def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        seen.append(attempt)
        hits = [c for c in ledger.charges if c[2] == attempt.idempotency_key]
        return bide.Outcome.succeeded("charged alice 500") if hits else bide.Outcome.not_started()

    later = time.time() + 3600  # an hour later: the lost attempt's deadline has passed
    agent = bide.Agent(
        charge_script(), store=store, tools=[ledger.tool(reconcile=reconcile)], clock=lambda: later
    )
    assert agent.run_sync("r", RUN_INPUT).answer == "done"
    assert len(ledger.charges) == 1
    assert seen[0].arguments == {"customer": "alice", "cents": 500} and seen[0].call_id == "c0.0"


def test_a_reconciler_that_raises_is_named_in_the_halt() -> None:
    """The halt, its log line and OutcomeUnknown.cause said only "(crashed)": an operator could not tell a
    reconciler that keeps failing (its system of record down) from one that was never asked."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=0.01, fire=True)

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        raise RuntimeError("ledger API returned 503")

    later = time.time() + 3600
    agent = bide.Agent(
        charge_script(), store=store, tools=[ledger.tool(reconcile=reconcile)], clock=lambda: later
    )
    with pytest.raises(bide.OutcomeUnknown) as halted:
        agent.run_sync("r", RUN_INPUT)
    assert "its reconciler raised RuntimeError: ledger API returned 503" in str(halted.value)
    assert isinstance(halted.value.__cause__, RuntimeError)
    assert len(ledger.charges) == 1


def test_reconciler_waits_for_deadline_and_may_say_unknown() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger, timeout=30)
    calls: list[bide.AttemptInfo] = []

    def reconcile(attempt: bide.AttemptInfo) -> None:
        calls.append(attempt)

    agent = bide.Agent(charge_script(), store=store, tools=[ledger.tool(reconcile=reconcile, timeout=30)])
    with pytest.raises(bide.OutcomeUnknown):
        agent.run_sync("r", RUN_INPUT)
    assert calls == []  # the deadline has not passed: another driver may still be running it
    store2 = bide.open_store("memory://")
    _halt_by_losing_result(store2, ledger, timeout=30)
    later = time.time() + 3600
    agent2 = bide.Agent(
        charge_script(),
        store=store2,
        tools=[ledger.tool(reconcile=reconcile, timeout=30)],
        clock=lambda: later,
    )
    with pytest.raises(bide.OutcomeUnknown):
        agent2.run_sync("r", RUN_INPUT)
    assert len(calls) == 1  # consulted, said "unknown": still halted


def test_not_called_is_recorded_and_retried() -> None:
    store = bide.open_store("memory://")
    attempts: list[int] = []

    @bide.tool
    def send_email(to: str) -> str:
        """Send an email."""
        attempts.append(bide.current_call().attempt)
        if len(attempts) == 1:
            raise bide.NotCalled("mail server refused the connection before sending")
        return "sent"

    script = [call("send_email", to="a@example.com"), reply("ok")]
    with pytest.raises(bide.ToolNotStarted):
        bide.Agent(ScriptedModel(script), store=store, tools=[send_email]).run_sync("r", "mail")
    assert "not-started:c0.0:0" in keys(store, "r")
    assert bide.run_status(store, "r").status == "running"
    assert (
        bide.Agent(ScriptedModel(script), store=store, tools=[send_email]).run_sync("r", "mail").answer
        == "ok"
    )
    assert attempts == [0, 1]


def test_tool_error_is_a_known_failure_other_exceptions_halt() -> None:
    store = bide.open_store("memory://")

    @bide.tool
    def pay(amount: int) -> str:
        """Pay."""
        if amount > 100:
            raise bide.ToolError("amount over limit")
        raise ConnectionResetError("connection reset after sending")

    model = ScriptedModel([call("pay", amount=500), reply("ok")])
    assert bide.Agent(model, store=store, tools=[pay]).run_sync("a", "x").answer == "ok"
    assert model.requests[1].messages[-1].content == "amount over limit"  # type: ignore[union-attr]
    with pytest.raises(bide.OutcomeUnknown, match="ConnectionResetError") as info:
        bide.Agent(ScriptedModel([call("pay", amount=5), reply("ok")]), store=store, tools=[pay]).run_sync(
            "b", "x"
        )
    assert info.value.cause.startswith("the tool raised")


def test_a_halt_quotes_a_huge_error_cut_short_and_chains_it_whole() -> None:
    """A side effect's 5 MB error message became a 5 MB halt message, in every log line and traceback that
    shows it: the halt quotes its first 2,000 characters, and the error itself is the halt's cause."""
    store = bide.open_store("memory://")

    @bide.tool
    async def pay(amount: int) -> str:
        """Pay."""
        raise ValueError("x" * 5_000_000)

    with pytest.raises(bide.OutcomeUnknown) as info:
        bide.Agent(ScriptedModel([call("pay", amount=5), reply("ok")]), store=store, tools=[pay]).run_sync(
            "r", "x"
        )
    assert len(str(info.value)) < 5_000 and "4,998,028 more characters: see its __cause__" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError) and len(str(info.value.__cause__)) == 5_000_000


def test_async_side_effect_timeout_halts() -> None:
    """A claimed async call that outlasts its timeout is cancelled and the run halts. The timeout (1 s)
    leaves a loaded machine room to start the call inside its window (with 50 ms, a scheduling delay
    between the marker and the call made it ToolNotStarted instead)."""
    store = bide.open_store("memory://")

    @bide.tool(timeout=1.0)
    async def slow_transfer(amount: int) -> str:
        """Transfer money slowly."""
        await asyncio.sleep(5)
        return "done"

    with pytest.raises(bide.OutcomeUnknown, match="timed out"):
        bide.Agent(
            ScriptedModel([call("slow_transfer", amount=1), reply("ok")]), store=store, tools=[slow_transfer]
        ).run_sync("r", "x")


def test_store_failure_before_call_is_voided_in_process() -> None:
    """The marker write raised (it may have committed): the tool was not called, and this process
    remembers that, so the next drive voids the marker and calls the tool instead of halting."""
    inner = bide.open_store("memory://")
    ledger = Ledger()

    class FlakyStore:
        url = inner.url
        durable = False
        fail_next_marker = True

        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        async def ainsert_many(self, run_id: str, items: Any, **options: Any) -> Any:
            out = await inner.ainsert_many(run_id, items, **options)
            if self.fail_next_marker and any(k.startswith("attempt:") for k, _ in items):
                self.fail_next_marker = False
                raise bide.StoreError("connection lost during commit")  # committed, reply lost
            return out

    flaky = FlakyStore()
    forget_claims()
    with pytest.raises(bide.StoreError):
        bide.Agent(charge_script(), store=flaky, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)  # type: ignore[arg-type]
    assert ledger.charges == []
    result = bide.Agent(charge_script(), store=flaky, tools=[ledger.tool()]).run_sync("r", RUN_INPUT)  # type: ignore[arg-type]
    assert result.answer == "done" and len(ledger.charges) == 1
    assert "not-started:c0.0:0" in keys(inner, "r")
    # A different process (memory forgotten) would have halted instead: that is the documented price.


def test_second_driver_of_a_live_run_is_told_it_is_in_flight() -> None:
    """A second drive of a run whose lease a live driver holds does nothing and raises RunInFlight (saying
    who holds it and until when); with a lease_wait it waits and returns the answer the holder journaled."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    started = asyncio.Event()
    release = asyncio.Event()

    async def charge_card(customer: str, cents: int) -> str:
        """Charge."""
        ledger.charges.append((customer, cents, ""))
        started.set()
        await release.wait()
        return "charged"

    async def go() -> tuple[Any, Any]:
        t = bide.Tool.from_function(charge_card)
        a1 = bide.Agent(charge_script(), store=store, tools=[t])
        a2 = bide.Agent(charge_script(), store=store, tools=[t])
        first = asyncio.create_task(a1.run("r", RUN_INPUT))
        await started.wait()
        before = keys(store, "r")
        try:
            await a2.run("r", RUN_INPUT)
            second: Any = None
        except bide.RunInFlight as exc:
            second = exc
        assert keys(store, "r") == before  # the second drive wrote nothing
        waiting = bide.Agent(charge_script(), store=store, tools=[t], lease_wait=30).run("r", RUN_INPUT)
        third = asyncio.create_task(waiting)
        await asyncio.sleep(0.05)
        release.set()
        return await first, second, await third

    first, second, third = asyncio.run(go())
    assert first.answer == "done" and isinstance(second, bide.RunInFlight)
    assert second.holder and second.expires_at and second.retry_after <= second.expires_at
    assert "being driven by another driver" in str(second) and "Z (in " in str(second)
    assert third.answer == "done" and third.replayed
    assert len(ledger.charges) == 1


def test_a_drive_the_run_refuses_is_refused_while_another_driver_holds_it(store: bide.Store) -> None:
    """A run's start never changes, so a drive it refuses (another input, a thread driven as a run, a run
    sent messages as a thread) gets RunMismatch while a live driver holds the run: not RunInFlight, whose
    advice (run it again later) can never work, and not after a lease_wait spent waiting for the holder."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def charge_card(customer: str, cents: int) -> str:
        """Charge."""
        started.set()
        await release.wait()
        return "charged"

    async def go() -> list[BaseException]:
        t = bide.Tool.from_function(charge_card)
        first = asyncio.create_task(bide.Agent(charge_script(), store=store, tools=[t]).run("r", RUN_INPUT))
        await started.wait()
        refused: list[BaseException] = []
        for wait in (0.0, 5.0):  # (the holder lets go only once this loop is over)
            other = bide.Agent(charge_script(), store=store, tools=[t], lease_wait=wait)
            attempts = [other.run("r", "another input"), other.thread("r").send("hello")]
            for attempt in attempts:
                with pytest.raises(bide.RunMismatch) as exc:
                    await attempt
                refused.append(exc.value)
        release.set()
        assert (await first).answer == "done"
        return refused

    refused = asyncio.run(go())
    assert len(refused) == 4
    assert all("different input" in str(e) for e in refused[::2])
    assert all("not a conversation thread" in str(e) for e in refused[1::2])


def test_concurrent_drivers_fire_side_effect_at_most_once(store: bide.Store) -> None:
    ledger = Ledger()

    async def go() -> list[Any]:
        agents = [
            bide.Agent(charge_script(), store=store, tools=[ledger.tool()], lease_wait=30) for _ in range(16)
        ]
        return await asyncio.gather(*(a.run("race", RUN_INPUT) for a in agents), return_exceptions=True)

    outcomes = asyncio.run(go())
    assert len(ledger.charges) == 1
    assert [getattr(o, "answer", o) for o in outcomes] == ["done"] * 16  # nobody halted


def test_read_only_reruns_and_idempotent_key_is_stable() -> None:
    store = bide.open_store("memory://")
    reads: list[str] = []
    keys_seen: list[str] = []

    @bide.tool(safety=bide.ReadOnly)
    async def get_weather(city: str) -> str:
        """Weather for a city."""
        reads.append(city)
        return f"sunny in {city}"

    @bide.tool(safety=bide.Idempotent)
    def create_ticket(title: str, idempotency_key: str) -> dict[str, str]:
        """Create a ticket."""
        keys_seen.append(idempotency_key)
        assert bide.current_call().idempotency_key == idempotency_key
        if len(keys_seen) == 1:
            raise KeyboardInterrupt  # the process dies inside the call (after the provider saw the key)
        return {"ticket": "T-1", "key": idempotency_key}

    script = [
        Turn(calls=(Call("get_weather", {"city": "SF"}), Call("create_ticket", {"title": "x"}))),
        reply("ok"),
    ]
    assert "idempotency_key" not in create_ticket.spec.parameters["properties"]
    with pytest.raises(KeyboardInterrupt):
        bide.Agent(ScriptedModel(script), store=store, tools=[get_weather, create_ticket]).run_sync("r", "go")
    result = bide.Agent(ScriptedModel(script), store=store, tools=[get_weather, create_ticket]).run_sync(
        "r", "go"
    )
    assert result.answer == "ok"
    assert reads == ["SF"]  # its result was journaled before the crash
    assert len(keys_seen) == 2 and keys_seen[0] == keys_seen[1] == bide.idempotency_key_for("r", "c0.1")
    rec = Journal(store, "r").load().get("result:c0.1")
    assert isinstance(rec, bide.ToolResult) and rec.idempotency_key == keys_seen[0]
    assert rec.safety == "idempotent" and not any(k.startswith("attempt:") for k in keys(store, "r"))


def test_invalid_arguments_and_unknown_tool_go_back_to_the_model() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    model = ScriptedModel(
        [
            Turn(
                calls=(
                    Call("charge_card", {"customer": "alice", "cents": "lots"}),
                    Call("charge_card", {"customer": "alice", "cents": 5, "extra": 1}),
                    Call("charge_card", "not json"),
                    Call("refund", {}),
                )
            ),
            reply("sorry"),
        ]
    )
    result = bide.Agent(model, store=store, tools=[ledger.tool()]).run_sync("r", "x")
    assert result.answer == "sorry" and ledger.charges == []
    tool_msgs = [m for m in model.requests[1].messages if m.role == "tool"]
    assert [m.is_error for m in tool_msgs] == [True, True, True, True]  # type: ignore[union-attr]
    assert "cents" in tool_msgs[0].content and "extra" in tool_msgs[1].content
    assert "JSON object" in tool_msgs[2].content and "unknown tool 'refund'" in tool_msgs[3].content


def test_programmatic_tool_from_args_model() -> None:
    class Transfer(BaseModel):
        """Move money."""

        source: str
        target: str
        cents: int

    moved: list[Transfer] = []

    def do_transfer(args: Transfer) -> str:
        moved.append(args)
        return "moved"

    t = bide.Tool(
        name="transfer",
        description="Move money between accounts",
        args=Transfer,
        fn=do_transfer,
        safety=bide.SideEffect,
    )
    assert t.spec.parameters["required"] == ["source", "target", "cents"]
    model = ScriptedModel([call("transfer", source="a", target="b", cents=3), reply("ok")])
    assert bide.Agent(model, store=bide.open_store("memory://"), tools=[t]).run_sync("r", "x").answer == "ok"
    assert moved == [Transfer(source="a", target="b", cents=3)]


def test_tool_definition_errors() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(bide.ConfigError, match="annotation"):
        bide.tool(untyped)
    with pytest.raises(bide.ConfigError, match="reserved"):
        bide.tool(name="final_answer")(lambda: None)
    with pytest.raises(bide.ConfigError, match="two tools"):
        t = Ledger().tool()
        bide.Agent(ScriptedModel([]), store=bide.open_store("memory://"), tools=[t, t])
    with pytest.raises(bide.ConfigError, match="timeout"):
        Ledger().tool(timeout=0)
    with pytest.raises(bide.ConfigError):
        bide.Agent(ScriptedModel([]), store=bide.open_store("memory://")).run_sync("", "x")
    with pytest.raises(bide.ConfigError):
        bide.current_call()


def test_max_turns() -> None:
    store = bide.open_store("memory://")

    @bide.tool(safety=bide.ReadOnly)
    def ping() -> str:
        """Ping."""
        return "pong"

    model = ScriptedModel([call("ping")] * 5)
    with pytest.raises(bide.RunLimitExceeded):
        bide.Agent(model, store=store, tools=[ping], max_turns=3).run_sync("r", "x")


def test_model_errors_are_wrapped_and_retried_on_next_drive() -> None:
    store = bide.open_store("memory://")
    model = ScriptedModel([Fail(RuntimeError("boom")), reply("hello")])
    agent = bide.Agent(model, store=store)
    with pytest.raises(bide.ModelError, match="boom"):
        agent.run_sync("r", "hi")
    assert agent.run_sync("r", "hi").answer == "hello"


def test_two_first_drives_with_different_inputs_one_run_one_effect() -> None:
    """Two first drives racing with different inputs: one holds the lease and runs, the other waits for it
    and is then refused (the run exists with another input); the tool fires once."""
    store = bide.open_store("memory://")
    ledger = Ledger()

    async def race() -> list[Any]:
        agents = [
            bide.Agent(
                ScriptedModel([call("charge_card", customer=c, cents=5), reply("ok")], delay=0.01),
                store=store,
                tools=[ledger.tool()],
                lease_wait=30,
            )
            for c in ("alice", "bob")
        ]
        return list(
            await asyncio.gather(
                agents[0].run("r", "charge alice"), agents[1].run("r", "charge bob"), return_exceptions=True
            )
        )

    outcomes = asyncio.run(race())
    assert sorted(type(o).__name__ for o in outcomes) == ["RunMismatch", "RunResult"]
    assert len(ledger.charges) == 1
    stored = keys(store, "r")
    assert stored[:3] == ["@journal", "run:start", "model:0"] and stored[-1] == "run:end"


@pytest.mark.parametrize(
    "bad",
    [
        "just text",
        bide.AssistantMessage(content=3),  # type: ignore[arg-type]
        bide.AssistantMessage(tool_calls=[{"id": "1", "name": "ping", "arguments": {}}]),  # type: ignore[list-item]
        bide.AssistantMessage(tool_calls=[bide.ToolCall(id="1", name="ping", arguments=[1])]),  # type: ignore[arg-type]
    ],
)
def test_malformed_model_replies_are_refused_before_anything_is_journaled(bad: Any) -> None:
    class Broken:
        name = "broken"

        async def complete(self, request: bide.ModelRequest) -> Any:
            return bad

    store = bide.open_store("memory://")
    with pytest.raises(bide.ModelError, match=r"AssistantMessage|tool call"):
        bide.Agent(Broken(), store=store).run_sync("r", "hi")
    assert store.load("r") == []  # a run exists from its first journaled turn on


class AllowList:
    """A trivial gate: approves calls whose customer is allow-listed in the journal."""

    def __init__(self) -> None:
        self.requests: list[bide.GateRequest] = []

    async def check(self, request: bide.GateRequest) -> bide.GateDecision:
        self.requests.append(request)
        await request.journal.refresh()
        decision = request.journal.get(f"approval:{request.call_id}")
        if decision is None:
            await request.journal.put(
                f"approval:{request.call_id}:asked", {"digest": request.arguments_digest}
            )
            return bide.Pending("waiting for a human")
        if decision["digest"] != request.arguments_digest:
            return bide.Denied("approval was for other arguments")
        if decision["ok"]:
            return bide.Approved(evidence={"by": decision["by"]})
        return bide.Denied(decision.get("reason", "no"))


def test_gate_pending_then_approved() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()
    gate = AllowList()
    agent = bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=gate)])
    with pytest.raises(bide.ApprovalPending) as info:
        agent.run_sync("r", RUN_INPUT)
    assert info.value.status == "awaiting_approval" and info.value.call_id == "c0.0"
    assert ledger.charges == [] and "pause:c0.0" in keys(store, "r")
    st = bide.run_status(store, "r")
    assert (st.status, st.call_id) == ("awaiting_approval", "c0.0")
    req = gate.requests[0]
    assert req.arguments == {"customer": "alice", "cents": 500}
    assert req.arguments_json == b'{"cents":500,"customer":"alice"}'
    assert req.arguments_digest == __import__("hashlib").sha256(req.arguments_json).hexdigest()
    # Still pending: consulted again, nothing called.
    with pytest.raises(bide.ApprovalPending):
        bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=gate)]).run_sync("r", RUN_INPUT)

    # An approver (another process) writes its decision into the journal.
    async def approve() -> None:
        j = await Journal(store, "r").aload()
        await bide.GateJournal(j).put(
            "approval:c0.0", {"ok": True, "by": "carol", "digest": req.arguments_digest}
        )

    asyncio.run(approve())
    result = bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=gate)]).run_sync("r", RUN_INPUT)
    assert result.answer == "done" and len(ledger.charges) == 1
    rec = Journal(store, "r").load().get("result:c0.0")
    assert isinstance(rec, bide.ToolResult) and rec.approval == {"by": "carol"}
    gate_records = [k for k in keys(store, "r") if k.startswith("approval:")]
    assert gate_records == ["approval:c0.0:asked", "approval:c0.0"]


def test_gate_denied_goes_to_model_and_gate_cannot_write_outside_prefix() -> None:
    store = bide.open_store("memory://")
    ledger = Ledger()

    class Deny:
        def check(self, request: bide.GateRequest) -> bide.GateDecision:
            return bide.Denied("over budget")

    model = charge_script()
    assert (
        bide.Agent(model, store=store, tools=[ledger.tool(gate=Deny())]).run_sync("r", RUN_INPUT).answer
        == "done"
    )
    assert ledger.charges == []
    last = model.requests[1].messages[-1]
    assert last.is_error and last.content == "tool call denied: over budget"  # type: ignore[union-attr]

    class Sneaky:
        async def check(self, request: bide.GateRequest) -> bide.GateDecision:
            await request.journal.put("result:c0.0", {"forged": True})
            return bide.Approved()

    with pytest.raises(bide.ConfigError, match="approval:"):
        bide.Agent(charge_script(), store=store, tools=[ledger.tool(gate=Sneaky())]).run_sync("s", RUN_INPUT)
    assert ledger.charges == []


def test_a_driver_whose_lease_was_taken_over_writes_nothing() -> None:
    """A driver pauses in its model call past its lease; another takes the run over (a new token) and
    finishes it. The paused driver wakes up: its turn write is refused by the store (fencing), and it
    returns the answer the other journaled, without acting on its own proposal."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    now = [1_800_000_000.0]
    woke = asyncio.Event()

    class Paused:
        name = "paused"

        async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
            await woke.wait()
            return bide.AssistantMessage(content="from the paused driver")

    paused = bide.Agent(Paused(), store=store, tools=[ledger.tool()], clock=lambda: now[0])
    other = bide.Agent(charge_script(), store=store, tools=[ledger.tool()], clock=lambda: now[0])

    async def go() -> tuple[Any, Any]:
        first = asyncio.create_task(paused.run("r", RUN_INPUT))
        await asyncio.sleep(0.01)
        now[0] += 3600  # the paused driver's lease expired long ago
        second = await other.run("r", RUN_INPUT)
        woke.set()
        return await first, second

    first, second = asyncio.run(go())
    assert second.answer == "done" and len(ledger.charges) == 1
    assert first.answer == "done" and first.replayed
    records = Journal(store, "r").load().records()
    turns = [r.message.content for r in records if isinstance(r, bide.ModelTurn)]
    assert "from the paused driver" not in turns


def test_sync_tool_that_never_got_a_thread_is_not_started() -> None:
    """A sync side effect whose timeout passes while it waits for a worker thread provably never ran: the
    run records that (no halt) and the next run calls it. The timeout (1 s) leaves a loaded machine room
    to reach the thread pool, and the next run's call to start, inside the window."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    store = bide.open_store("memory://")
    calls: list[str] = []

    @bide.tool(timeout=1.0)
    def notify(to: str) -> str:
        """Notify someone."""
        calls.append(to)
        return "ok"

    release = threading.Event()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        blocker = loop.run_in_executor(None, release.wait)  # the only worker thread is busy
        try:
            with pytest.raises(bide.ToolNotStarted, match="never started"):
                await bide.Agent(
                    ScriptedModel([call("notify", to="x"), reply("done")]), store=store, tools=[notify]
                ).run("r", "go")
        finally:
            release.set()
            await blocker

    asyncio.run(go())
    assert calls == [] and "not-started:c0.0:0" in keys(store, "r")
    result = bide.Agent(
        ScriptedModel([call("notify", to="x"), reply("done")]), store=store, tools=[notify]
    ).run_sync("r", "go")
    assert result.answer == "done" and calls == ["x"]


class CountingStore:
    """Counts store calls: the write budget of a run is part of the contract (group commit needs it)."""

    def __init__(self, inner: bide.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if callable(attr) and name in ("ainsert_many", "aload", "aget", "insert_many", "load", "get"):

            def counted(*args: Any, **kwargs: Any) -> Any:
                self.counts[name] = self.counts.get(name, 0) + 1
                return attr(*args, **kwargs)

            return counted
        return attr


def test_store_call_budget_of_a_run() -> None:
    """A one-tool run: one read and three transactions (header+start+turn+marker, result, final turn+end);
    replaying it afterwards: one read, no writes; a read-only tool call: one write."""
    counting = CountingStore(bide.open_store("memory://"))
    agent = bide.Agent(charge_script(), store=counting, tools=[Ledger().tool()])  # type: ignore[arg-type]
    agent.run_sync("r", RUN_INPUT)
    assert counting.counts == {"aload": 1, "ainsert_many": 3}
    counting.counts.clear()
    agent.run_sync("r", RUN_INPUT)
    assert counting.counts == {"aload": 1}

    @bide.tool(safety=bide.ReadOnly)
    def look(q: str) -> str:
        """Look something up."""
        return q

    counting.counts.clear()
    model = ScriptedModel([call("look", q="x"), reply("ok")])
    bide.Agent(model, store=counting, tools=[look]).run_sync("ro", "x")  # type: ignore[arg-type]
    assert counting.counts == {"aload": 1, "ainsert_many": 3}  # header+start+turn, result, final turn+end


def test_halt_follows_the_marker_not_the_current_declaration() -> None:
    """A call that ran as a side effect and lost its result halts on resume even if the tool is now declared
    read-only, or is gone from the agent: relabelling code never re-fires an effect."""
    store = bide.open_store("memory://")
    ledger = Ledger()
    _halt_by_losing_result(store, ledger)
    relabelled = ledger.tool(safety=bide.ReadOnly)
    with pytest.raises(bide.OutcomeUnknown):
        bide.Agent(charge_script(), store=store, tools=[relabelled]).run_sync("r", RUN_INPUT)
    with pytest.raises(bide.OutcomeUnknown, match="no longer registered"):
        bide.Agent(charge_script(), store=store, tools=[]).run_sync("r", RUN_INPUT)

    class Stricter(BaseModel):
        customer: str
        cents: int
        currency: str

    def charge(args: Stricter) -> str:
        return "x"

    changed = bide.Tool(name="charge_card", description="Charge", args=Stricter, fn=charge)
    with pytest.raises(bide.OutcomeUnknown):
        bide.Agent(charge_script(), store=store, tools=[changed]).run_sync("r", RUN_INPUT)
    assert len(ledger.charges) == 1 and "result:c0.0" not in keys(store, "r")


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_text_no_store_can_keep_is_refused_before_the_model_is_asked(url: str, tmp_path: Any) -> None:
    """A lone surrogate in the input failed after the model was called (UnicodeEncodeError), and in a run id
    as a StoreError that said a write "may or may not have committed"."""
    store = bide.open_store(f"sqlite:///{tmp_path}/runs.db" if url == "sqlite" else url)
    model = ScriptedModel([reply("ok")])
    agent = bide.Agent(model, store=store)
    with pytest.raises(bide.ConfigError, match="input is not Unicode text"):
        agent.run_sync("r", "hi \ud800")
    with pytest.raises(bide.ConfigError, match="lone surrogate"):
        agent.run_sync("r\udfff", "hi")
    with pytest.raises(bide.ConfigError, match="message is not Unicode text"):
        agent.thread("t").send_sync("hi \ud800")
    assert model.requests == [] and store.runs() == []
    assert agent.run_sync("r", "hi").answer == "ok"  # the same run, with text, goes ahead
