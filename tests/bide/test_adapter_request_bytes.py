"""The HTTP adapters send a conversation as the same bytes whether its turns are live or read back from the
journal: a turn asked again after a failed or crashed drive is asked with the very request the first drive
sent, and each message of a thread is sent as the last request plus what came since (what a provider's
prompt cache needs). Tool-call arguments are where the two could differ: the model writes their keys in
its own order, the journal (canonical JSON) gives them back sorted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import bide
from bide._canonical import canonical_json
from bide.testing import Reply, anthropic_message, anthropic_stream, openai_completion, openai_stream

# Keys out of order at every depth, non-ASCII text in keys and values, and a list of objects.
_ARGUMENTS: dict[str, Any] = {
    "vendor": "Zürich Käse AG",
    "cents": 100,
    "meta": {"zeta": "ß", "alpha": {"yé": [{"k2": 1, "k1": "日本"}], "b": None}, "mid": 1.5},
}


class _Recorder:
    """A model server on 127.0.0.1 that keeps the exact bytes of each request body and answers with what
    `respond(n)` returns for the n-th request (from 1)."""

    def __init__(self, respond: Callable[[int], Reply]) -> None:
        self.bodies: list[bytes] = []
        lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                with lock:
                    recorder.bodies.append(raw)
                    n = len(recorder.bodies)
                reply = respond(n)
                self.send_response(reply.status)
                if reply.events is None:
                    data = json.dumps(reply.body).encode()
                    self.send_header("content-type", "application/json")
                else:
                    frames = [(f"event: {e}\n" if e else "") + f"data: {d}\n\n" for e, d in reply.events]
                    data = "".join(frames).encode()
                    self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def recorders() -> Iterator[Callable[[Callable[[int], Reply]], _Recorder]]:
    made: list[_Recorder] = []

    def start(respond: Callable[[int], Reply]) -> _Recorder:
        made.append(_Recorder(respond))
        return made[-1]

    yield start
    for r in made:
        r.close()


def _model(kind: str, url: str) -> bide.OpenAIModel | bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key="k", base_url=f"{url}/v1", retry=once, timeout=10)
    return bide.AnthropicModel("m", api_key="k", base_url=url, retry=once, timeout=10)


def _call(kind: str, stream: bool) -> Reply:
    calls = [("call_1", "pay", _ARGUMENTS)]
    if kind == "openai":
        return openai_stream(calls=calls) if stream else openai_completion(calls=calls)
    return anthropic_stream(calls=calls) if stream else anthropic_message(calls=calls)


def _text(kind: str, stream: bool, text: str) -> Reply:
    if kind == "openai":
        return openai_stream([text]) if stream else openai_completion(text)
    return anthropic_stream([text]) if stream else anthropic_message(text)


def _pay(paid: list[dict[str, Any]]) -> bide.Tool:
    @bide.tool
    def pay(vendor: str, cents: int, meta: dict[str, Any]) -> str:
        """Pay a vendor (a side effect)."""
        paid.append({"vendor": vendor, "cents": cents, "meta": meta})
        return f"paid {vendor} {cents}"

    return pay


async def _drive(agent: bide.Agent[Any], run_id: str, stream: bool) -> str:
    if not stream:
        return (await agent.run(run_id, "pay them")).answer
    async with contextlib.aclosing(agent.stream(run_id, "pay them")) as events:
        async for event in events:
            if isinstance(event, bide.Finished):
                return event.result.answer
    raise AssertionError("the stream ended without Finished")


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_turn_asked_again_after_a_failed_drive_is_sent_as_the_same_bytes(
    recorders: Callable[[Callable[[int], Reply]], _Recorder], tmp_path: Path, kind: str, stream: bool
) -> None:
    """Turn 1 is asked live (the tool call's turn is in memory as the model wrote it), fails, and is asked
    again by the next drive from the journal: both requests are the same bytes, and the call ran once."""

    def respond(n: int) -> Reply:
        if n == 1:
            return _call(kind, stream)
        if n == 2:  # the drive stops here, as after a crash before the answer came
            return Reply(status=400, body={"error": {"message": "not now"}})
        return _text(kind, stream, "Paid.")

    server = recorders(respond)
    paid: list[dict[str, Any]] = []
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    agent = bide.Agent(_model(kind, server.url), store=store, tools=[_pay(paid)], system="Pay.")
    with pytest.raises(bide.ModelError, match="not now"):
        asyncio.run(_drive(agent, "r1", stream))
    assert asyncio.run(_drive(agent, "r1", stream)) == "Paid."
    assert paid == [_ARGUMENTS]
    first_drive, second_drive = server.bodies[1], server.bodies[2]
    assert first_drive == second_drive


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_each_message_of_a_thread_extends_the_request_before_it(
    recorders: Callable[[Callable[[int], Reply]], _Recorder], tmp_path: Path, kind: str
) -> None:
    """Message 1 is sent with the history of message 0 from the journal: the messages of the last request
    of message 0 (its tool call's turn live then) open the request of message 1, unchanged."""
    replies = [_call(kind, False), _text(kind, False, "Paid."), _text(kind, False, "Yes, once.")]
    server = recorders(lambda n: replies[n - 1])
    paid: list[dict[str, Any]] = []
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    thread = bide.Agent(_model(kind, server.url), store=store, tools=[_pay(paid)]).thread("t1")
    assert thread.send_sync("pay them").answer == "Paid."
    assert thread.send_sync("did you?").answer == "Yes, once."
    before = json.loads(server.bodies[1])["messages"]
    after = json.loads(server.bodies[2])["messages"]

    def text(messages: list[Any]) -> list[str]:
        # json.loads keeps each object's key order: this is the text the request sent, message by message.
        return [json.dumps(m, ensure_ascii=False) for m in messages]

    assert text(after[: len(before)]) == text(before)
    assert len(after) > len(before)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_arguments_sent_back_are_the_ones_the_journal_holds(kind: str) -> None:
    """What the body renders for a call is the same for the arguments as the model wrote them and as the
    journal reads them back, at every depth, non-ASCII text included."""
    model = _model(kind, "http://127.0.0.1:9")
    back = json.loads(canonical_json(_ARGUMENTS))
    assert list(back) != list(_ARGUMENTS)  # the journal's order is not the model's

    def body(arguments: dict[str, Any]) -> str:
        call = bide.ToolCall(id="call_1", name="pay", arguments=arguments)
        messages: list[bide.Message] = [
            bide.UserMessage(content="pay"),
            bide.AssistantMessage(tool_calls=[call]),
            bide.ToolMessage(tool_call_id="call_1", name="pay", content="paid"),
        ]
        request = bide.ModelRequest(run_id="r", turn=1, messages=messages, tools=())
        return json.dumps(model.body(request), ensure_ascii=False)

    assert body(_ARGUMENTS) == body(back)
