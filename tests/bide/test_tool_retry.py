"""Per-tool retry policies: retry-safe tools are retried on exceptions; a side effect only when an attempt
provably did not start, each try its own claimed attempt, so a crash mid-retry stays at most once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import bide
from bide._inflight import forget_claims
from bide._journal import Journal
from bide.testing import ScriptedModel, call, reply

NOW = bide.RetryPolicy(attempts=3, initial=0, jitter=False)  # retries without waiting


def keys(store: bide.Store, run_id: str) -> list[str]:
    return [e.key for e in store.load(run_id)]


def run(
    tool: bide.Tool, store: bide.Store | None = None, **args: Any
) -> tuple[bide.RunResult, ScriptedModel]:
    model = ScriptedModel([call(tool.name, **args), reply("ok")])
    agent = bide.Agent(model, store=store or bide.open_store("memory://"), tools=[tool])
    return agent.run_sync("r", "go"), model


def tool_result(model: ScriptedModel) -> tuple[str, bool]:
    [msg] = [m for m in model.requests[1].messages if m.role == "tool"]
    return msg.content, msg.is_error  # type: ignore[union-attr]


@pytest.mark.parametrize("safety", [bide.ReadOnly, bide.Idempotent])
def test_retry_safe_tools_are_retried_on_exceptions(safety: bide.Safety) -> None:
    tries: list[tuple[int, str]] = []

    @bide.tool(safety=safety, retry=NOW)
    async def fetch(url: str) -> str:
        """Fetch."""
        ctx = bide.current_call()
        tries.append((ctx.attempt, ctx.idempotency_key))
        if len(tries) < 3:
            raise ConnectionResetError("flaky")
        return "page"

    result, model = run(fetch, url="u")
    assert result.answer == "ok" and tool_result(model) == ("page", False)
    assert [a for a, _ in tries] == [0, 1, 2]
    assert len({k for _, k in tries}) == 1  # one idempotency key for every try of the call


def test_retry_safe_tools_give_up_after_the_policy_and_the_model_sees_the_last_error() -> None:
    tries = 0

    @bide.tool(safety=bide.ReadOnly, retry=NOW)
    def fetch(url: str) -> str:
        """Fetch."""
        nonlocal tries
        tries += 1
        raise RuntimeError(f"down {tries}")

    _, model = run(fetch, url="u")
    assert tries == 3 and tool_result(model) == ("down 3", True)


def test_tool_error_is_a_known_failure_and_never_retried() -> None:
    tries = 0

    @bide.tool(safety=bide.ReadOnly, retry=NOW)
    async def fetch(url: str) -> str:
        """Fetch."""
        nonlocal tries
        tries += 1
        raise bide.ToolError("404 not found")

    _, model = run(fetch, url="u")
    assert tries == 1 and tool_result(model) == ("404 not found", True)


def test_a_retry_safe_tool_without_a_policy_is_tried_once() -> None:
    tries = 0

    @bide.tool(safety=bide.ReadOnly)
    async def fetch(url: str) -> str:
        """Fetch."""
        nonlocal tries
        tries += 1
        raise RuntimeError("down")

    _, model = run(fetch, url="u")
    assert tries == 1 and tool_result(model) == ("down", True)


def test_retry_safe_timeouts_are_retried() -> None:
    tries = 0

    @bide.tool(safety=bide.ReadOnly, retry=NOW, timeout=0.05)
    async def fetch(url: str) -> str:
        """Fetch."""
        nonlocal tries
        tries += 1
        if tries == 1:
            await asyncio.sleep(10)
        return "page"

    _, model = run(fetch, url="u")
    assert tries == 2 and tool_result(model) == ("page", False)


def test_a_side_effect_is_retried_when_it_provably_did_not_start() -> None:
    """NotCalled twice, then the charge goes through: three claimed attempts, two voided, one result."""
    fired = 0
    tries = 0

    @bide.tool(retry=NOW)
    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal fired, tries
        tries += 1
        if tries < 3:
            raise bide.NotCalled("the provider refused the connection")
        fired += 1
        return "charged"

    store = bide.open_store("memory://")
    result, model = run(charge, store, cents=5)
    assert result.answer == "ok" and fired == 1 and tool_result(model) == ("charged", False)
    assert keys(store, "r")[3:-2] == [
        "attempt:c0.0:0",
        "not-started:c0.0:0",
        "attempt:c0.0:1",
        "not-started:c0.0:1",
        "attempt:c0.0:2",
        "result:c0.0",
    ]


def test_declared_not_started_exceptions_void_the_attempt() -> None:
    """ConnectionRefusedError declared as proof of not starting: retried under the policy; without one it
    is ToolNotStarted (run again), never a halt."""
    fired = 0
    tries = 0

    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal fired, tries
        tries += 1
        if tries == 1:
            raise ConnectionRefusedError("nobody listening")
        fired += 1
        return "charged"

    retried = bide.Tool.from_function(charge, retry=NOW, not_started=(ConnectionRefusedError,))
    result, _ = run(retried, cents=5)
    assert result.answer == "ok" and (tries, fired) == (2, 1)

    tries = fired = 0
    once = bide.Tool.from_function(charge, not_started=(ConnectionRefusedError,))
    store = bide.open_store("memory://")
    with pytest.raises(bide.ToolNotStarted, match="ConnectionRefusedError: nobody listening"):
        run(once, store, cents=5)
    assert fired == 0
    result, _ = run(once, store, cents=5)
    assert result.answer == "ok" and (tries, fired) == (2, 1)


def test_other_exceptions_of_a_side_effect_halt_and_name_the_options() -> None:
    tries = 0

    @bide.tool(retry=NOW, not_started=(ConnectionRefusedError,))
    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal tries
        tries += 1
        raise ConnectionResetError("reset after the request went out")

    with pytest.raises(bide.OutcomeUnknown) as halt:
        run(charge, cents=5)
    assert tries == 1  # never retried: it may have charged
    text = str(halt.value)
    for option in (
        "bide.ToolError",
        "bide.NotCalled",
        "not_started=",
        "retry=bide.RetryPolicy",
        "reconcile=",
    ):
        assert option in text


def test_a_side_effect_timeout_is_never_retried() -> None:
    tries = 0

    @bide.tool(retry=NOW, timeout=0.05)
    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal tries
        tries += 1
        await asyncio.sleep(10)
        return "charged"

    with pytest.raises(bide.OutcomeUnknown, match="timed out"):
        run(charge, cents=5)
    assert tries == 1


def test_a_side_effect_gives_up_after_the_policy_and_the_next_drive_tries_again() -> None:
    tries = 0

    @bide.tool(retry=bide.RetryPolicy(attempts=2, initial=0))
    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal tries
        tries += 1
        if tries <= 2:
            raise bide.NotCalled("refused")
        return "charged"

    store = bide.open_store("memory://")
    with pytest.raises(bide.ToolNotStarted, match="tried 2 times"):
        run(charge, store, cents=5)
    result, _ = run(charge, store, cents=5)
    assert result.answer == "ok" and tries == 3
    assert "attempt:c0.0:2" in keys(store, "r")


class Watch:
    """A store that sets `voided` when a not-started record is journaled (the retry's wait begins)."""

    def __init__(self, inner: bide.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.voided = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ainsert_many(self, run_id: str, items: Any, **options: Any) -> Any:
        out = await self.inner.ainsert_many(run_id, items, **options)
        if any(k.startswith("not-started:") for k, _ in items):
            self.voided.set()
        return out


def test_a_crash_during_the_backoff_leaves_nothing_live_and_the_effect_fires_once() -> None:
    """The drive dies while it waits to retry: the voided attempt is in the journal, so the next drive (of
    another process) neither halts nor fires twice; it claims a new attempt at once."""
    fired = 0
    tries = 0

    @bide.tool(retry=bide.RetryPolicy(attempts=5, initial=60, jitter=False))
    async def charge(cents: int) -> str:
        """Charge."""
        nonlocal fired, tries
        tries += 1
        if tries == 1:
            raise bide.NotCalled("refused")
        fired += 1
        return "charged"

    store = bide.open_store("memory://")

    async def crash_in_backoff() -> None:
        watched = Watch(store)
        model = ScriptedModel([call("charge", cents=5), reply("ok")])
        agent = bide.Agent(model, store=watched, tools=[charge], lease_ttl=0.2)  # type: ignore[arg-type]
        task = asyncio.ensure_future(agent.run("r", "go"))
        await asyncio.wait_for(watched.voided.wait(), 5)
        await asyncio.sleep(0.01)  # the drive sleeps in its 60 s wait
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(crash_in_backoff())
    assert (tries, fired) == (1, 0)
    assert keys(store, "r")[-2:] == ["attempt:c0.0:0", "not-started:c0.0:0"]
    forget_claims()  # another process
    result, _ = run(charge, store, cents=5)
    assert result.answer == "ok" and (tries, fired) == (2, 1)
    journal = Journal(store, "r").load()
    assert journal.has("attempt:c0.0:1") and not journal.has("attempt:c0.0:2")


def test_retry_declarations_are_checked() -> None:
    async def f(x: int) -> int:
        """F."""
        return x

    with pytest.raises(bide.ConfigError, match=r"retry must be a bide\.RetryPolicy"):
        bide.Tool.from_function(f, retry=3)  # type: ignore[arg-type]
    for broad in (OSError, Exception, TimeoutError):
        with pytest.raises(bide.ConfigError, match="covers TimeoutError"):
            bide.Tool.from_function(f, not_started=(broad,))
    with pytest.raises(bide.ConfigError, match="tuple of exception types"):
        bide.Tool.from_function(f, not_started=("ConnectionRefusedError",))  # type: ignore[arg-type]
    t = bide.Tool.from_function(f, not_started=ConnectionRefusedError)  # type: ignore[arg-type]
    assert t.not_started == (ConnectionRefusedError,)
