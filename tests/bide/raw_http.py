"""What the hostile-model tests share: a loopback HTTP server that reads each request and hands the
connection to a function that answers it however badly the test wants (the `raw_server` fixture in
conftest.py), `one_turn`, a model asked once, whole or streamed, and `tool_results_sent`."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Sequence

import bide
from bide.testing import Received


class RawServer:
    """A loopback HTTP server that reads each request (keeping its headers) and then runs `answer(conn)`,
    one connection per request."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.headers: list[dict[str, str]] = []
        self._answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            head, _, body = data.partition(b"\r\n\r\n")
            fields = dict(line.decode().split(":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
            headers = {k.strip().lower(): v.strip() for k, v in fields.items()}
            self.headers.append(headers)
            while len(body) < int(headers.get("content-length", "0")):
                body += conn.recv(65536)
            with contextlib.suppress(OSError):  # the client gave up: what these tests want
                self._answer(conn)

    def close(self) -> None:
        self._listener.close()


StartServer = Callable[[Callable[[socket.socket], None]], RawServer]
"""The `raw_server` fixture: start a `RawServer` answering with a function; closed after the test."""


def hi(tools: Sequence[bide.ToolSpec] = ()) -> bide.ModelRequest:
    """A first turn that says "hi" and offers `tools`."""
    messages: list[bide.Message] = [bide.UserMessage(content="hi")]
    return bide.ModelRequest(run_id="r", turn=0, messages=messages, tools=tuple(tools))


async def one_turn(
    model: bide.Model, stream: bool, request: bide.ModelRequest | None = None
) -> bide.AssistantMessage:
    """`model`'s turn for `request` (by default `hi()`): its whole answer, or the turn ending its stream."""
    request = request or hi()
    if not stream:
        return await model.complete(request)
    last: object = None
    async for piece in model.stream(request):  # type: ignore[attr-defined]
        last = piece
    assert isinstance(last, bide.AssistantMessage)
    return last


def tool_results_sent(request: Received) -> bool:
    """Whether a request to a model carries a tool result (the run is past its call), in either API."""
    for m in request.body.get("messages", []):
        if m.get("role") == "tool":
            return True
        if isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"]):
            return True
    return False
