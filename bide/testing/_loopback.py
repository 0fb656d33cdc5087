"""`LoopbackServer`: a model API on 127.0.0.1 for tests and examples (no network).

It answers every POST with what `respond(request)` returns and records each request (path, headers, JSON
body, arrival time on `time.monotonic()` and the client connection it came on), so a test can count model
calls, check what was sent, see that one pooled connection served them, and measure waits between retries
from the server's side. Helpers build answers in the OpenAI chat-completions and Anthropic Messages shapes,
as whole JSON bodies or as server-sent-event streams.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "LoopbackServer",
    "Received",
    "Reply",
    "anthropic_message",
    "anthropic_stream",
    "openai_completion",
    "openai_stream",
]


@dataclass(frozen=True, slots=True)
class Received:
    """One request the server received: `n` counts from 1; `at` is its arrival on `time.monotonic()`;
    `peer` is the client's (host, port), one per connection."""

    n: int
    path: str
    headers: dict[str, str]
    body: Any
    at: float
    peer: tuple[str, int]


@dataclass(slots=True)
class Reply:
    """An answer: `status`, `headers` and a JSON `body`, or `events` ((event, data) pairs, sent as a
    server-sent-event stream; event "" sends only data). `cut_after` closes the connection after that many
    events without finishing the stream."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: Sequence[tuple[str, str]] | None = None
    cut_after: int | None = None


class LoopbackServer:
    """An HTTP server on a free loopback port, in a thread, until `close()` (or the end of a `with`)."""

    def __init__(self, respond: Callable[[Received], Reply]) -> None:
        self.respond = respond
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._answering = 0  # requests being answered (each in a thread of its own)
        self._idle = threading.Condition(self._lock)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a pooled client reuses its connection

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with server._lock:
                    got = Received(
                        len(server.requests) + 1,
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                        time.monotonic(),
                        (str(self.client_address[0]), int(self.client_address[1])),
                    )
                    server.requests.append(got)
                    server._answering += 1
                try:
                    self._send(server.respond(got))
                except (BrokenPipeError, ConnectionResetError):
                    # The client hung up mid-answer (it refused what it read so far): nothing more to send,
                    # and no error of the server's (a traceback in a thread outliving its test, too).
                    self.close_connection = True
                finally:
                    with server._lock:
                        server._answering -= 1
                        server._idle.notify_all()

            def _send(self, reply: Reply) -> None:
                if reply.events is None:
                    data = json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                for i, (event, payload) in enumerate(reply.events):
                    if reply.cut_after is not None and i >= reply.cut_after:
                        self.wfile.write(b'data: {"trunc')  # half an event, then the connection drops
                        self.wfile.flush()
                        return
                    frame = (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
                    self.wfile.write(frame.encode())
                    self.wfile.flush()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """How many client connections the recorded requests came on."""
        return len({r.peer for r in self.requests})

    def close(self) -> None:
        """Stop serving, and wait (up to 10 s) for the answers still being sent: none goes on writing
        into the next test."""
        self._server.shutdown()
        self._server.server_close()
        with self._idle:
            self._idle.wait_for(lambda: self._answering == 0, timeout=10)

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _openai_calls(calls: Sequence[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for cid, name, args in calls
    ]


def openai_completion(
    text: str = "",
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
    *,
    usage: tuple[int, int] | None = (10, 5),
    finish_reason: str | None = None,
) -> Reply:
    """A chat completion: `text`, tool `calls` ((id, name, arguments)), `usage` (prompt, completion)."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = _openai_calls(calls)
    body: dict[str, Any] = {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if calls else "stop"),
            }
        ],
    }
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return Reply(body=body)


def openai_stream(
    pieces: Sequence[str] = (),
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
    *,
    usage: tuple[int, int] | None = (10, 5),
    cut_after: int | None = None,
) -> Reply:
    """A streamed chat completion: text in `pieces`, each tool call's arguments split in two chunks, a
    usage chunk, then ``[DONE]``."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[str, str]:
        return "", json.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        )

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in pieces]
    for i, (cid, name, args) in enumerate(calls):
        text = json.dumps(args)
        half = len(text) // 2
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": cid,
                            "type": "function",
                            "function": {"name": name, "arguments": text[:half]},
                        }
                    ]
                }
            )
        )
        events.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": text[half:]}}]}))
    events.append(chunk({}, "tool_calls" if calls else "stop"))
    if usage is not None:
        events.append(
            (
                "",
                json.dumps(
                    {
                        "id": "c",
                        "choices": [],
                        "usage": {
                            "prompt_tokens": usage[0],
                            "completion_tokens": usage[1],
                            "total_tokens": sum(usage),
                        },
                    }
                ),
            )
        )
    events.append(("", "[DONE]"))
    return Reply(events=events, cut_after=cut_after)


def anthropic_message(
    text: str = "",
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
    *,
    usage: tuple[int, int] = (10, 5),
    stop_reason: str | None = None,
) -> Reply:
    """A Messages API answer: a text block, then one tool_use block per call ((id, name, input))."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in calls]
    return Reply(
        body={
            "id": "msg_loopback",
            "type": "message",
            "role": "assistant",
            "model": "loopback",
            "content": content,
            "stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def anthropic_stream(
    pieces: Sequence[str] = (),
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
    *,
    usage: tuple[int, int] = (10, 5),
) -> Reply:
    """A streamed Messages API answer with its event types (message_start, content_block_start/delta/stop,
    message_delta, message_stop, and a ping)."""

    def ev(kind: str, **data: Any) -> tuple[str, str]:
        return kind, json.dumps({"type": kind, **data})

    events = [
        ev(
            "message_start",
            message={
                "id": "msg_loopback",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "loopback",
                "stop_reason": None,
                "usage": {"input_tokens": usage[0], "output_tokens": 1},
            },
        ),
        ev("ping"),
    ]
    index = 0
    if pieces:
        events.append(ev("content_block_start", index=index, content_block={"type": "text", "text": ""}))
        events += [
            ev("content_block_delta", index=index, delta={"type": "text_delta", "text": p}) for p in pieces
        ]
        events.append(ev("content_block_stop", index=index))
        index += 1
    for cid, name, args in calls:
        text = json.dumps(args)
        half = len(text) // 2
        events.append(
            ev(
                "content_block_start",
                index=index,
                content_block={"type": "tool_use", "id": cid, "name": name, "input": {}},
            )
        )
        for part in (text[:half], text[half:]):
            events.append(
                ev(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": part},
                )
            )
        events.append(ev("content_block_stop", index=index))
        index += 1
    events.append(
        ev(
            "message_delta",
            delta={"stop_reason": "tool_use" if calls else "end_turn"},
            usage={"output_tokens": usage[1]},
        )
    )
    events.append(ev("message_stop"))
    return Reply(events=events)
