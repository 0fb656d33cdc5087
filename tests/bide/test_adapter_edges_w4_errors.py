"""What the adapters' errors say, and what they carry: a network failure names its innermost reason (a refused
connection says so), masked; a server's error mid-stream is cut as an HTTP error body is; no exception
chained to an error, nor its context, holds the server's text (which may quote the API key); a retry is
logged only when one happens; the key percent-encoded, as a URL carries it, is masked too."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.parse
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from raw_http import StartServer, one_turn

import bide

KEY = "sk-AbCd/EfGhIj+KlMnOp/QrStUv"


def _shows_the_key(text: str, key: str = KEY) -> bool:
    """Whether `text` holds 8 characters of `key` in a row, as it is or as JSON, repr or a URL write it."""
    forms = {key, json.dumps(key)[1:-1], repr(key)[1:-1], key.replace("/", "\\/")}
    forms.add(urllib.parse.quote(key, safe=""))
    return any(form[i : i + 8] in text for form in forms for i in range(len(form) - 7))


def _model(kind: str, url: str, attempts: int = 1, **options: Any) -> bide.Model:
    retry = bide.RetryPolicy(attempts=attempts, initial=0.01, maximum=0.01)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=KEY, base_url=f"{url}/v1", retry=retry, timeout=10, **options)
    return bide.AnthropicModel("m", api_key=KEY, base_url=url, retry=retry, timeout=10, **options)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _failure(model: bide.Model, stream: bool) -> bide.ModelError:
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, stream))
    return caught.value


def _http(body: bytes, kind: bytes = b"text/event-stream", status: bytes = b"200 OK") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: " + kind + b"\r\nconnection: close\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )


def _events(*payloads: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)


# -- 1. a network failure names its innermost reason -------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_refused_connection_says_it_was_refused(
    kind: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, the error and the log said only "ConnectError: All connection attempts failed": the refusal
    (ConnectionRefusedError, errno 111) was in the exceptions behind it, which are no longer chained."""
    caplog.set_level(logging.INFO, logger="bide")
    error = _failure(_model(kind, f"http://127.0.0.1:{_closed_port()}"), stream)
    assert "ConnectError: All connection attempts failed (ConnectionRefusedError: " in str(error), str(error)
    assert "Connect call failed" in str(error)
    gave_up = [r.getMessage() for r in caplog.records if "giving up" in r.getMessage()]
    assert len(gave_up) == 1 and "ConnectionRefusedError" in gave_up[0], gave_up


def _raises_with_the_key(request: httpx.Request) -> httpx.Response:
    try:
        raise OSError(f"proxy said: 407 for key {KEY} at {request.url}")
    except OSError as inner:
        raise httpx.ConnectError("All connection attempts failed") from inner


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_innermost_reason_is_shown_with_the_key_masked(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The innermost exception is server text too (a proxy's answer): shown, but with the key masked, in
    the message and in both log lines (the retry and the giving up)."""
    caplog.set_level(logging.INFO, logger="bide")
    transport = httpx.MockTransport(_raises_with_the_key)
    model = _model("openai", "http://127.0.0.1:9", attempts=2, transport=transport)
    error = _failure(model, stream)
    assert "(OSError: proxy said: 407 for key *** at http://127.0.0.1:9/v1/chat/completions)" in str(error)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("bide"))
    assert logged.count("OSError: proxy said: 407 for key ***") == 2, logged
    assert not _shows_the_key(str(error) + logged)


# -- 2. an error event mid-stream is cut ------------------------------------------------------------------

_HUGE = "overloaded " + "y" * 1980 + KEY + "z" * 3_000_000  # the key runs across the cut at 2,000 characters
_MID_STREAM = {
    "anthropic": _events(
        {"type": "message_start", "message": {"usage": {}}},
        {"type": "error", "error": {"type": "overloaded_error", "message": _HUGE}},
    ),
    "openai": _events({"error": {"message": _HUGE}}),
}


@pytest.mark.parametrize("kind", list(_MID_STREAM))
def test_an_error_event_mid_stream_is_cut_after_the_key_is_masked(
    kind: str, raw_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, a 3 MB error event made a 3 MB message (printed and logged whole). Now its first 2,000
    characters are shown, as of an HTTP error body, the key masked before the cut, and the cut is said."""
    caplog.set_level(logging.INFO, logger="bide")
    raw = _http(_MID_STREAM[kind])
    server = raw_server(lambda conn: conn.sendall(raw))
    error = _failure(_model(kind, server.url), True)
    message = str(error)
    assert len(message) < 2300, len(message)
    assert "failed mid-stream: overloaded yyy" in message
    assert "y***zzz" in message and "zzz... (cut here, of 3,001,994 characters);" in message, message[-300:]
    assert message.endswith("nothing was journaled, run again to retry")
    assert not _shows_the_key(message)


# -- 3. nothing chained to an error, nor its context, holds what the server sent ------------------------


def _chain(error: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    inner = error.__cause__ or error.__context__
    while inner is not None and len(out) < 50:
        out.append(inner)
        inner = inner.__cause__ or inner.__context__
    return out


_CHUNKED = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
Answer = Callable[[str], bytes]
# (the adapter, whether streamed, the raw answer made with the key)
_ANSWERS: dict[str, tuple[str, bool, Answer]] = {
    "whole, a bad header line": (
        "openai",
        False,
        lambda k: b"HTTP/1.1 200 OK\r\nx-note " + k.encode() + b"\r\ncontent-length: 2\r\n\r\n{}",
    ),
    "streamed, a bad header line": (
        "anthropic", True, lambda k: b"HTTP/1.1 200 OK\r\nx-note " + k.encode() + b"\r\n\r\n"
    ),
    "streamed, a broken chunk": ("openai", True, lambda k: _CHUNKED + k.encode() + b"\r\n"),
    "whole, a key twice": (
        "openai", False, lambda k: _http(f'{{"{k}": 1, "{k}": 2}}'.encode(), b"application/json")
    ),
    "streamed, an event with a key twice": (
        "anthropic", True, lambda k: _http(f'data: {{"{k}": 1, "{k}": 2}}\n\n'.encode())
    ),
    "streamed, a line that is not UTF-8": (
        "openai", True, lambda k: _http(f'data: {{"x": "{k}'.encode() + b'\xff"}\n\n')
    ),
    "streamed, whole JSON that is not UTF-8": (
        "anthropic", True, lambda k: _http(f'{{"x": "{k}'.encode() + b'\xff"}', b"application/json")
    ),
}


@pytest.mark.parametrize("case", list(_ANSWERS))
def test_no_exception_behind_an_error_holds_the_server_text(case: str, raw_server: StartServer) -> None:
    """Before, these errors were raised `from None` inside the `except`: not chained, but the exception
    they replaced (httpx's, a UnicodeDecodeError holding the line, a JSON error holding the key) stayed in
    `__context__`, the key in it. Now nothing is behind them."""
    kind, stream, answer = _ANSWERS[case]
    raw = answer(KEY)
    server = raw_server(lambda conn: conn.sendall(raw))
    error = _failure(_model(kind, server.url), stream)
    assert _chain(error) == [], [repr(e)[:200] for e in _chain(error)]
    assert not _shows_the_key(str(error)), str(error)


# -- 4. a retry is logged only when one happens -----------------------------------------------------------


@pytest.mark.parametrize("attempts", [1, 3])
def test_only_a_retry_that_happens_is_logged(attempts: int, caplog: pytest.LogCaptureFixture) -> None:
    """Before, every failed attempt was logged as "retrying", the last one too (right before "giving up
    after N attempts"), and with attempts=1 a retry that never happened was logged."""
    caplog.set_level(logging.INFO, logger="bide")
    _failure(_model("openai", f"http://127.0.0.1:{_closed_port()}", attempts=attempts), False)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("bide")]
    assert sum("; retrying" in m for m in said) == attempts - 1, said
    assert sum(f"giving up after {attempts} attempts" in m for m in said) == 1, said


# -- 5. the key percent-encoded is masked ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["upper", "lower", "every character"])
def test_the_key_percent_encoded_is_masked(case: str, raw_server: StartServer) -> None:
    """A server (or proxy) quoting the request URL back quotes the key percent-encoded (%2F for '/', in
    either case of hex digit, or every character encoded): it was shown, 8 characters at a time."""
    quoted = urllib.parse.quote(KEY, safe="")
    if case == "lower":
        quoted = quoted.replace("%2F", "%2f").replace("%2B", "%2b")
    elif case == "every character":
        quoted = "".join(f"%{ord(c):02X}" for c in KEY)
    said = f"key rejected: GET https://gw.example/v1?key={quoted}&x=1"
    raw = _http(json.dumps({"error": {"message": said}}).encode(), b"application/json", b"401 X")
    server = raw_server(lambda conn: conn.sendall(raw))
    error = _failure(_model("openai", server.url), False)
    assert "key rejected: GET https://gw.example/v1?key=***&x=1" in str(error), str(error)
    assert "?key=***&x=1" in (error.body or "")
    every = "".join(f"%{ord(c):02X}" for c in KEY)
    assert not _shows_the_key(str(error) + (error.body or "")) and every[:24] not in str(error)


def test_a_failures_own_text_is_cut_short_with_the_key_masked_first() -> None:
    # httpx quotes what a server sent: a 100 KB header line was a 100 KB message, and a log line of that
    # size at every retry. The key stands across the cut.
    from bide._http import _FAILURE_SHOWN, failure

    key = "sk-test-" + "K" * 40
    text = "x" * (_FAILURE_SHOWN - 10) + key + "y" * 100_000
    error = httpx.RemoteProtocolError(f"illegal header line: {text}")
    error.__cause__ = ValueError(f"illegal header line: {text}")  # httpcore's own, which httpx's repeats
    shown = failure(error, lambda t: t.replace(key, "***"))
    assert len(shown) < _FAILURE_SHOWN + 100 and "(cut here, of " in shown, shown[-200:]
    assert shown.count("illegal header line") == 1, shown[-300:]  # not said again as its own reason
    assert "sk-test-" not in shown  # masked whole, before the cut (cut first, a part of it was shown)


def test_a_timeout_names_no_reason_behind_it() -> None:
    # A RequestTimeout over HTTPS is raised over anyio's cancelled read (an SSLWantReadError): naming it
    # made every timeout look like a TLS failure.
    from bide._http import RequestTimeout, failure

    def timed_out() -> BaseException:
        try:
            try:
                raise OSError("The operation did not complete (read)")
            except OSError:
                raise TimeoutError() from None
        except TimeoutError:
            try:
                raise RequestTimeout("no answer within the model's timeout of 1s") from None
            except RequestTimeout as exc:
                return exc

    shown = failure(timed_out(), lambda t: t)
    assert shown == "RequestTimeout: no answer within the model's timeout of 1s", shown
    # A network failure still names what happened (httpx's ConnectError over the refused connection).
    try:
        raise httpx.ConnectError("All connection attempts failed") from ConnectionRefusedError(111, "refused")
    except httpx.ConnectError as exc:
        assert failure(exc, lambda t: t).endswith("(ConnectionRefusedError: [Errno 111] refused)")
