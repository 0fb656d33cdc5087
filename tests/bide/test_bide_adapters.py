"""The HTTP model adapters (OpenAI-compatible and Anthropic) against loopback servers the tests start:
pooling, usage and finish_reason journaled and summed, retries honouring Retry-After, streaming, request
shapes, and a run killed mid-run that does not ask the model again for journaled turns."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpx
import pytest

import bide
from bide._http import parse_retry_after
from bide.testing import (
    LoopbackServer,
    Received,
    Reply,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)

HERE = Path(__file__).parent
ROOT = HERE.parent.parent

Respond = Callable[[Received], Reply]


def by_turn(*replies: Reply) -> Respond:
    """Answer request n with replies[n-1] (the last one after that)."""
    return lambda got: replies[min(got.n, len(replies)) - 1]


@bide.tool(safety=bide.ReadOnly)
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def request(text: str = "hi", tools: tuple[bide.ToolSpec, ...] = ()) -> bide.ModelRequest:
    return bide.ModelRequest(run_id="r", turn=0, messages=[bide.UserMessage(content=text)], tools=tools)


# -- OpenAI-compatible -------------------------------------------------------------------------------------


def test_one_pooled_client_serves_a_run_and_usage_is_journaled_and_summed(
    serve: Callable[[Respond], LoopbackServer],
) -> None:
    server = serve(
        by_turn(
            openai_completion(calls=[("call_1", "weather", {"city": "Paris"})], usage=(10, 5)),
            openai_completion("Sunny.", usage=(30, 7), finish_reason="stop"),
        )
    )
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1")
    store = bide.open_store("memory://")
    agent = bide.Agent(model, store=store, tools=[weather])

    async def main() -> bide.RunResult:
        async with model:
            return await agent.run("r", "weather?")

    result = asyncio.run(main())
    assert result.answer == "Sunny."
    assert result.usage == bide.Usage(input_tokens=40, output_tokens=12)
    assert len(server.requests) == 2 and server.connections == 1 and model.clients_made == 1
    turns = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ModelTurn)]
    assert [(t.message.usage, t.message.finish_reason) for t in turns] == [
        (bide.Usage(input_tokens=10, output_tokens=5), "tool_calls"),
        (bide.Usage(input_tokens=30, output_tokens=7), "stop"),
    ]
    again = agent.run_sync("r", "weather?")  # replayed from the journal: same usage, no request
    assert again.replayed and again.usage == result.usage and len(server.requests) == 2


def test_a_client_of_a_finished_event_loop_is_replaced(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(lambda got: openai_completion("ok"))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1")
    agent = bide.Agent(model, store=bide.open_store("memory://"))
    assert agent.run_sync("a", "hi").answer == "ok"
    assert agent.run_sync("b", "hi").answer == "ok"  # a new event loop: the old client cannot serve it
    assert model.clients_made == 2

    async def two() -> None:
        await agent.run("c", "hi")
        await agent.run("d", "hi")
        await model.aclose()

    asyncio.run(two())
    assert model.clients_made == 3 and len(server.requests) == 4


def test_429_waits_what_retry_after_asks(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(
        by_turn(
            Reply(status=429, headers={"retry-after": "1"}, body={"error": {"message": "slow down"}}),
            Reply(status=429, headers={"retry-after-ms": "300"}, body={"error": {"message": "slow down"}}),
            openai_completion("ok"),
        )
    )
    # The policy's own wait is zero: every wait measured is the server's hint.
    policy = bide.RetryPolicy(attempts=4, initial=0.0, maximum=5.0, jitter=False)
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1", retry=policy)
    assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "ok"
    at = [r.at for r in server.requests]
    assert len(at) == 3
    assert at[1] - at[0] >= 1.0
    assert at[2] - at[1] >= 0.3


def test_retry_after_as_an_http_date_and_capped() -> None:
    now = 1_800_000_000.0
    date = formatdate(now + 7, usegmt=True)
    assert parse_retry_after(httpx.Headers({"retry-after": date}), now=lambda: now) == 7.0
    assert (
        parse_retry_after(httpx.Headers({"retry-after": formatdate(now - 5, usegmt=True)}), lambda: now) == 0
    )
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"})) == 0.25
    assert parse_retry_after(httpx.Headers({})) is None
    policy = bide.RetryPolicy(initial=0.0, maximum=2.0)
    assert policy.wait(0, 7.0) == 2.0  # a hint longer than the policy's maximum waits the maximum


def test_5xx_is_retried_then_succeeds_and_400_is_not(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(
        by_turn(
            Reply(status=503, body={"error": {"message": "overloaded"}}),
            Reply(status=500, body={"error": {"message": "internal"}}),
            openai_completion("ok"),
        )
    )
    policy = bide.RetryPolicy(attempts=3, initial=0.001, maximum=0.01)
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1", retry=policy)
    assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "ok"
    assert len(server.requests) == 3

    bad = serve(lambda got: Reply(status=400, body={"error": {"message": "unknown parameter 'x'"}}))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{bad.url}/v1", retry=policy)
    with pytest.raises(bide.ModelError, match="400: unknown parameter 'x'; this is not retried") as info:
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")
    assert info.value.status == 400 and len(bad.requests) == 1


def test_connection_errors_are_retried_until_the_policy_gives_up() -> None:
    with LoopbackServer(lambda got: openai_completion("unused")) as gone:
        url = f"{gone.url}/v1"
    policy = bide.RetryPolicy(attempts=3, initial=0.001, maximum=0.01)
    model = bide.OpenAIModel("m", api_key="k", base_url=url, retry=policy)
    with pytest.raises(bide.ModelError, match="failed after 3 attempts: ConnectError"):
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")


def test_openai_stream_yields_deltas_and_assembles_tool_calls(
    serve: Callable[[Respond], LoopbackServer],
) -> None:
    server = serve(
        lambda got: openai_stream(
            ["It ", "is ", "sunny."],
            [("call_a", "weather", {"city": "Paris"}), ("call_b", "weather", {"city": "Rome"})],
            usage=(21, 9),
        )
    )
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1")

    async def collect() -> list[Any]:
        try:
            return [e async for e in model.stream(request(tools=(weather.spec,)))]
        finally:
            await model.aclose()

    events = asyncio.run(collect())
    assert [e.text for e in events[:-1]] == ["It ", "is ", "sunny."]
    assert all(isinstance(e, bide.TextDelta) for e in events[:-1])
    final = events[-1]
    assert isinstance(final, bide.AssistantMessage)
    assert final.content == "It is sunny."
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls] == [
        ("call_a", "weather", {"city": "Paris"}),
        ("call_b", "weather", {"city": "Rome"}),
    ]
    assert final.usage == bide.Usage(input_tokens=21, output_tokens=9) and final.finish_reason == "tool_calls"
    body = server.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_a_stream_that_breaks_off_raises_model_error(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(lambda got: openai_stream(["a", "b", "c"], cut_after=2))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1")

    async def collect() -> list[Any]:
        return [e async for e in model.stream(request())]

    with pytest.raises(bide.ModelError, match="nothing was journaled, run again"):
        asyncio.run(collect())


def test_a_streamed_request_is_retried_before_it_answers(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(by_turn(Reply(status=429, headers={"retry-after": "0"}), openai_stream(["ok"])))
    model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1", backoff=0.001)

    async def collect() -> list[Any]:
        return [e async for e in model.stream(request())]

    events = asyncio.run(collect())
    assert events[-1].content == "ok" and len(server.requests) == 2


# -- Anthropic ---------------------------------------------------------------------------------------------


def test_anthropic_request_and_response_shapes(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(
        by_turn(
            anthropic_message(
                "Let me look.",
                [("toolu_1", "weather", {"city": "Paris"}), ("toolu_2", "weather", {"city": "Rome"})],
                usage=(100, 20),
            ),
            anthropic_message("Sunny in both.", usage=(150, 10)),
        )
    )
    model = bide.AnthropicModel("claude-test", api_key="sk-ant", base_url=server.url, max_tokens=512)
    store = bide.open_store("memory://")
    agent = bide.Agent(model, store=store, tools=[weather], system="Be brief.")
    result = agent.run_sync("r", "Paris and Rome?")
    assert result.answer == "Sunny in both."
    assert result.usage == bide.Usage(input_tokens=250, output_tokens=30)
    first, second = server.requests
    assert first.path == "/v1/messages"
    assert first.headers["x-api-key"] == "sk-ant" and first.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in first.headers
    assert first.body["system"] == "Be brief." and first.body["max_tokens"] == 512
    assert first.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Paris and Rome?"}]}
    ]
    assert first.body["tools"][0]["name"] == "weather"
    assert first.body["tools"][0]["input_schema"]["properties"]["city"]["type"] == "string"
    assert second.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny in Paris"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "sunny in Rome"},
            ],
        },
    ]
    turns = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.ModelTurn)]
    assert [t.message.finish_reason for t in turns] == ["tool_use", "end_turn"]


def test_anthropic_errors_and_retries(serve: Callable[[Respond], LoopbackServer]) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server = serve(by_turn(Reply(status=529, body=overloaded), anthropic_message("ok")))
    model = bide.AnthropicModel("c", api_key="k", base_url=server.url, backoff=0.001)
    assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "ok"
    assert len(server.requests) == 2
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}
    bad = serve(lambda got: Reply(status=400, body=invalid))
    model = bide.AnthropicModel("c", api_key="k", base_url=bad.url, backoff=0.001)
    with pytest.raises(bide.ModelError, match="400: max_tokens: too big"):
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")
    assert len(bad.requests) == 1


def test_anthropic_stream(serve: Callable[[Respond], LoopbackServer]) -> None:
    server = serve(
        lambda got: anthropic_stream(["Checking ", "now."], [("toolu_9", "weather", {"city": "Oslo"})])
    )
    model = bide.AnthropicModel("c", api_key="k", base_url=server.url)

    async def collect() -> list[Any]:
        async with model:
            return [e async for e in model.stream(request(tools=(weather.spec,)))]

    events = asyncio.run(collect())
    assert [e.text for e in events[:-1]] == ["Checking ", "now."]
    final = events[-1]
    assert isinstance(final, bide.AssistantMessage) and final.content == "Checking now."
    assert [(c.id, c.name, c.arguments) for c in final.tool_calls] == [
        ("toolu_9", "weather", {"city": "Oslo"})
    ]
    assert final.usage == bide.Usage(input_tokens=10, output_tokens=5) and final.finish_reason == "tool_use"
    assert server.requests[0].body["stream"] is True


def test_stream_and_complete_give_the_same_turn(serve: Callable[[Respond], LoopbackServer]) -> None:
    calls = [("call_1", "weather", {"city": "Lima"})]
    whole = serve(lambda got: openai_completion("Hm.", calls, usage=(3, 4)))
    streamed = serve(lambda got: openai_stream(["H", "m."], calls, usage=(3, 4)))

    async def both() -> tuple[Any, Any]:
        a = await bide.OpenAIModel("m", api_key="k", base_url=f"{whole.url}/v1").complete(request())
        events = [
            e
            async for e in bide.OpenAIModel("m", api_key="k", base_url=f"{streamed.url}/v1").stream(request())
        ]
        return a, events[-1]

    a, b = asyncio.run(both())
    assert a == b


# -- a crash -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_run_is_resumed_without_asking_journaled_turns_again(
    serve: Callable[[Respond], LoopbackServer], tmp_path: Path
) -> None:
    def respond(got: Received) -> Reply:
        if len(got.body["messages"]) == 1:  # turn 0: the user's message only
            return openai_completion(calls=[("call_w", "wait_here", {"seconds": 1})], usage=(11, 2))
        return openai_completion("done", usage=(13, 3))

    server = serve(respond)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    signal_file = tmp_path / "signal"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "http_child.py"), url, f"{server.url}/v1", str(signal_file)], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not signal_file.exists():
            assert child.poll() is None, "the child exited before reaching the tool"
            assert time.monotonic() < deadline, "the child never reached the tool"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert len(server.requests) == 1  # turn 0 journaled, then killed inside the tool

    @bide.tool(safety=bide.ReadOnly)
    def wait_here(seconds: int) -> str:
        """Wait."""
        return "waited"

    model = bide.OpenAIModel("loopback", api_key="k", base_url=f"{server.url}/v1")
    store = bide.open_store(url)
    try:
        agent = bide.Agent(model, store=store, tools=[wait_here], lease_wait=10.0)
        result = agent.run_sync("crash-1", "go")
    finally:
        store.close()
    assert result.answer == "done" and not result.replayed
    assert len(server.requests) == 2  # only turn 1 was asked after the crash
    assert result.usage == bide.Usage(input_tokens=24, output_tokens=5)  # the journaled turn 0 counts


def test_usage_is_summed_from_the_turns_not_from_look_alikes_in_arguments() -> None:
    decoy = {"a": {"usage": {"input_tokens": 500, "output_tokens": 500}}, "model": 1, "usage": None}

    class Reporting:
        name = "reporting"

        async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
            if request.turn == 0:
                return bide.AssistantMessage(
                    tool_calls=[bide.ToolCall(id="1", name="echo", arguments=decoy)],
                    usage=bide.Usage(input_tokens=7, output_tokens=1),
                    finish_reason="tool_calls",
                )
            if request.turn == 1:
                return bide.AssistantMessage(tool_calls=[bide.ToolCall(id="2", name="echo", arguments=decoy)])
            return bide.AssistantMessage(
                content='"usage":{"input_tokens":9', usage=bide.Usage(output_tokens=2)
            )

    @bide.tool(safety=bide.ReadOnly)
    def echo(a: dict[str, Any], model: int, usage: None) -> str:
        """Echo."""
        return "ok"

    agent = bide.Agent(Reporting(), store=bide.open_store("memory://"), tools=[echo])
    result = agent.run_sync("r", "go")
    assert result.turns == 3
    assert result.usage == bide.Usage(input_tokens=7, output_tokens=3)
    assert agent.run_sync("r", "go").usage == result.usage


def test_a_password_in_base_url_is_never_printed(serve: Callable[[Respond], LoopbackServer]) -> None:
    """A proxy's user and password in base_url came out whole in every ModelError (and so in the run's
    log line and `bide worker`'s report); and with an OpenAI API key beside them, httpx sent the URL's
    credentials as the Authorization header in place of the key, which the server never saw."""
    server = serve(lambda got: Reply(status=401, body={"error": {"message": "who are you"}}))
    base = server.url.replace("http://", "http://proxyuser:PROXY-SECRET@") + "/v1"
    policy = bide.RetryPolicy(attempts=1)
    for model in (
        bide.OpenAIModel("m", api_key="", base_url=base, retry=policy),
        bide.AnthropicModel("m", api_key="k", base_url=base, retry=policy),
    ):
        with pytest.raises(bide.ModelError, match="answered 401") as info:
            bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")
        assert "PROXY-SECRET" not in str(info.value) and "proxyuser:***@" in str(info.value)
    with pytest.raises(bide.ConfigError, match="in place of the API key") as refused:
        bide.OpenAIModel("m", api_key="sk-real", base_url=base)
    assert "PROXY-SECRET" not in str(refused.value)


@pytest.mark.parametrize("kind", [bide.OpenAIModel, bide.AnthropicModel])
def test_a_key_no_header_can_carry_and_a_url_without_scheme_are_refused_unshown(
    kind: type[bide.OpenAIModel] | type[bide.AnthropicModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key read from a file (its last line break kept) failed every request, retried five times, with the
    key quoted in the error, the retry log lines and the run's failure; a base_url without its scheme
    failed every request too, with its password shown whole."""
    for key in ("sk-SECRET-KEY\n", "sk-SECRET\r\nX-Evil: 1", "sk-SECRET\x00", " sk-SECRET-KEY", "sk-SECRÉT"):
        with pytest.raises(bide.ConfigError, match="strip it") as refused:
            kind("m", api_key=key, base_url="http://127.0.0.1:9/v1")
        assert "SECRET" not in str(refused.value) and "SECRÉT" not in str(refused.value)
    env = "OPENAI_API_KEY" if kind is bide.OpenAIModel else "ANTHROPIC_API_KEY"
    monkeypatch.setenv(env, "sk-FROM-ENV-SECRET\n")
    with pytest.raises(bide.ConfigError, match=env) as refused:
        kind("m", base_url="http://127.0.0.1:9/v1")
    assert "FROM-ENV" not in str(refused.value)
    for url in ("proxyuser:SECRETPW@127.0.0.1:9/v1", "ftp://127.0.0.1/v1", "127.0.0.1:9"):
        with pytest.raises(bide.ConfigError, match="starts with http:// or https://") as refused:
            kind("m", api_key="k", base_url=url)
        assert "SECRETPW" not in str(refused.value)
    assert kind("m", api_key="sk-fine_key.1", base_url="HTTPS://host/v1").base_url == "HTTPS://host/v1"


def test_a_server_that_quotes_the_api_key_back_never_gets_it_printed_or_logged(
    serve: Callable[[Respond], LoopbackServer], caplog: pytest.LogCaptureFixture
) -> None:
    """A server (or proxy) quoting the key in its error text ("Incorrect API key provided: sk-...") had it
    printed in the ModelError, logged at every retry, and kept in the error's body."""
    key = "sk-SECRET-KEY-123"
    server = serve(
        lambda got: Reply(status=401 if got.n == 1 else 503, body={"error": {"message": f"bad key {key}"}})
    )
    for attempts, status in ((1, "answered 401"), (2, "503")):
        policy = bide.RetryPolicy(attempts=attempts, initial=0.01)
        model = bide.OpenAIModel("m", api_key=key, base_url=server.url + "/v1", retry=policy)
        with caplog.at_level("INFO"), pytest.raises(bide.ModelError, match=status) as info:
            bide.Agent(model, store=bide.open_store("memory://")).run_sync(f"r{attempts}", "hi")
        assert "bad key ***" in str(info.value) and key not in str(info.value)
        assert key not in (info.value.body or "")
    assert key not in caplog.text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:S3CRET@X9@127.0.0.1:8/v1", "http://u:***@127.0.0.1:8/v1"),  # httpx splits at the last @
        ("http://S3CRET@host/v1", "http://***@host/v1"),  # a lone user name is often a token
        ("https://u:p%40ss@[::1]:8/v1?q=a@b", "https://u:***@[::1]:8/v1?q=a@b"),
        ("http://host/v1?user=a@b", "http://host/v1?user=a@b"),  # an @ past the authority is not credentials
    ],
)
def test_credentials_in_a_model_url_are_masked_as_httpx_reads_them(url: str, shown: str) -> None:
    from bide._http import masked_url

    assert masked_url(url) == shown
