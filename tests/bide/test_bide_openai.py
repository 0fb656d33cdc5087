"""OpenAIModel against a small OpenAI-compatible chat-completions server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import bide

Handler = Callable[[dict[str, Any], int], tuple[int, dict[str, str], Any]]


class FakeOpenAI:
    """Serves /v1/chat/completions with answers from `respond(body, n)`; records every request."""

    def __init__(self, respond: Handler) -> None:
        self.respond = respond
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        fake = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = json.loads(self.rfile.read(length))
                fake.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/v1/chat/completions":
                    status, headers, payload = 404, {}, {"error": {"message": "no such path"}}
                else:
                    status, headers, payload = fake.respond(body, len(fake.requests))
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Handler], FakeOpenAI]]:
    servers: list[FakeOpenAI] = []

    def start(respond: Handler) -> FakeOpenAI:
        s = FakeOpenAI(respond)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


def completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


def test_tool_call_round_trip_through_agent(serve: Callable[[Handler], FakeOpenAI]) -> None:
    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], Any]:
        if n == 1:
            return (
                200,
                {},
                completion(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_abc",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                            }
                        ],
                    }
                ),
            )
        return 200, {}, completion({"role": "assistant", "content": "It is sunny in Paris."})

    server = serve(respond)

    @bide.tool(safety=bide.ReadOnly)
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        return f"sunny in {city}"

    model = bide.OpenAIModel("test-model", api_key="sk-test", base_url=server.base_url)
    agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[get_weather], system="Be brief.")
    assert agent.run_sync("r", "Weather in Paris?").answer == "It is sunny in Paris."
    headers, first = server.requests[0]
    assert headers["authorization"] == "Bearer sk-test"
    assert first["model"] == "test-model"
    assert first["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    assert first["tools"][0]["function"]["name"] == "get_weather"
    assert first["tools"][0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    _, second = server.requests[1]
    assert second["messages"][2]["tool_calls"][0]["id"] == "call_abc"
    assert second["messages"][3] == {"role": "tool", "tool_call_id": "call_abc", "content": "sunny in Paris"}


def test_transient_errors_are_retried_with_retry_after(serve: Callable[[Handler], FakeOpenAI]) -> None:
    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], Any]:
        if n == 1:
            return 429, {"retry-after": "0"}, {"error": {"message": "slow down"}}
        if n == 2:
            return 503, {}, b"upstream unavailable"
        return 200, {}, completion({"role": "assistant", "content": "ok"})

    server = serve(respond)
    model = bide.OpenAIModel("m", api_key="k", base_url=server.base_url, backoff=0.01)
    assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "ok"
    assert len(server.requests) == 3


def test_client_error_is_not_retried(serve: Callable[[Handler], FakeOpenAI]) -> None:
    server = serve(lambda body, n: (401, {}, {"error": {"message": "Incorrect API key provided"}}))
    model = bide.OpenAIModel("m", api_key="bad", base_url=server.base_url, backoff=0.01)
    with pytest.raises(bide.ModelError, match="401: Incorrect API key provided") as info:
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")
    assert info.value.status == 401 and len(server.requests) == 1


def test_retries_exhausted(serve: Callable[[Handler], FakeOpenAI]) -> None:
    server = serve(lambda body, n: (500, {}, {"error": {"message": "internal"}}))
    model = bide.OpenAIModel("m", api_key="k", base_url=server.base_url, backoff=0.001, max_retries=2)
    with pytest.raises(bide.ModelError, match="after 3 attempts: HTTP 500: internal"):
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")
    assert len(server.requests) == 3


def test_connection_refused_and_timeout(serve: Callable[[Handler], FakeOpenAI]) -> None:
    server = serve(lambda body, n: (200, {}, completion({"role": "assistant", "content": "x"})))
    dead = server.base_url
    server.close()
    model = bide.OpenAIModel("m", api_key="k", base_url=dead, backoff=0.001, max_retries=1)
    with pytest.raises(bide.ModelError, match="ConnectError"):
        bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi")

    import time

    def slow(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], Any]:
        time.sleep(0.5)
        return 200, {}, completion({"role": "assistant", "content": "late"})

    server2 = serve(slow)
    model2 = bide.OpenAIModel(
        "m", api_key="k", base_url=server2.base_url, timeout=0.1, backoff=0.001, max_retries=1
    )
    with pytest.raises(bide.ModelError, match="Timeout"):
        bide.Agent(model2, store=bide.open_store("memory://")).run_sync("r", "hi")


def test_env_configuration_and_bad_arguments(
    monkeypatch: pytest.MonkeyPatch, serve: Callable[[Handler], FakeOpenAI]
) -> None:
    server = serve(lambda body, n: (200, {}, completion({"role": "assistant", "content": "env ok"})))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    model = bide.OpenAIModel("m")
    assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "env ok"
    assert server.requests[0][0]["authorization"] == "Bearer sk-env"
    with pytest.raises(bide.ConfigError):
        bide.OpenAIModel("")


def test_a_provider_model_without_an_api_key_is_refused_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key for the provider's own endpoint, every request failed (401, or retried network errors
    when offline) long after the model was made, from inside a worker's drives: refused at once, naming
    the variable to set. A server of one's own (another base_url) may take no key."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(bide.ConfigError, match="set OPENAI_API_KEY or pass api_key="):
        bide.OpenAIModel("gpt-4o-mini")
    with pytest.raises(bide.ConfigError, match="set ANTHROPIC_API_KEY or pass api_key="):
        bide.AnthropicModel("claude-sonnet-4-5")
    for spelled in (
        "https://api.openai.com/v1/",
        "https://API.OPENAI.COM/v1",
        "HTTPS://api.openai.com/v1",
        "https://api.openai.com:443/v1",
        "https://api.openai.com./v1",
    ):
        with pytest.raises(bide.ConfigError, match="OPENAI_API_KEY"):
            bide.OpenAIModel("gpt-4o-mini", api_key="", base_url=spelled)
    for spelled in ("https://API.anthropic.com", "https://api.anthropic.com:443/"):
        with pytest.raises(bide.ConfigError, match="ANTHROPIC_API_KEY"):
            bide.AnthropicModel("claude-sonnet-4-5", base_url=spelled)
    assert bide.OpenAIModel("m", base_url="https://api.openai.com:8443/v1").api_key == ""  # one's own proxy
    for port in ("abc", "99999"):
        with pytest.raises(bide.ConfigError, match="port is a number"):
            bide.OpenAIModel("gpt-4o-mini", base_url=f"https://api.openai.com:{port}/v1")
    assert bide.OpenAIModel("local", base_url="http://127.0.0.1:8000/v1").api_key == ""
    assert bide.AnthropicModel("local", base_url="http://127.0.0.1:8000").api_key == ""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    assert bide.OpenAIModel("gpt-4o-mini").api_key == "sk-env"


def test_malformed_tool_arguments_reach_the_model_as_errors(serve: Callable[[Handler], FakeOpenAI]) -> None:
    def respond(body: dict[str, Any], n: int) -> tuple[int, dict[str, str], Any]:
        if n == 1:
            return (
                200,
                {},
                completion(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "add", "arguments": "{not json"},
                            }
                        ],
                    }
                ),
            )
        return 200, {}, completion({"role": "assistant", "content": "gave up"})

    server = serve(respond)

    @bide.tool(safety=bide.ReadOnly)
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    model = bide.OpenAIModel("m", api_key="k", base_url=server.base_url)
    assert (
        bide.Agent(model, store=bide.open_store("memory://"), tools=[add]).run_sync("r", "x").answer
        == "gave up"
    )
    tool_msg = server.requests[1][1]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["content"].startswith(
        "Error: arguments must be a JSON object"
    )
