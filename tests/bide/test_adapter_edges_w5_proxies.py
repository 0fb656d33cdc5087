"""A failure of a request that went through a proxy of the environment (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY,
which httpx honours) names the proxy, its URL without credentials, and the variable that set it: a proxy
that refuses the connection, answers 407 or closes the CONNECT tunnel read before as the model server's
failure. A host NO_PROXY names goes around the proxy, and its failures name none. The proxies here are
loopback servers (or a closed port); the model's host, reached only through them, is never resolved."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
from raw_http import StartServer, one_turn

import bide

KINDS = ["openai", "anthropic"]
PROXY_VARIABLES = [
    f"{scheme}_proxy" for scheme in ("http", "https", "all", "no")
] + [f"{scheme}_PROXY" for scheme in ("HTTP", "HTTPS", "ALL", "NO")]


@pytest.fixture(autouse=True)
def _no_proxy_of_our_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)  # urllib ignores HTTP_PROXY under CGI


def _model(kind: str, url: str, attempts: int = 1) -> bide.Model:
    retry = bide.RetryPolicy(attempts=attempts, initial=0.01, maximum=0.01)
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    return cls("m", api_key="sk-test-key-0123456789", base_url=url, retry=retry, timeout=10)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _failure(model: bide.Model, stream: bool) -> str:
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, stream))
    return str(caught.value)


@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_proxy_that_refuses_the_connection_is_named(
    kind: str, stream: bool, variable: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: "model 'm' at https://model.invalid/... failed after 2 attempts: ConnectError: All connection
    attempts failed (ConnectionRefusedError ...)", as if the model's server had refused. The retry and the
    giving up are logged with the proxy too; its password is in none of them."""
    caplog.set_level(logging.INFO, logger="bide")
    port = _closed_port()
    monkeypatch.setenv(variable, f"http://proxy-user:proxy-secret@127.0.0.1:{port}")
    said = _failure(_model(kind, "https://model.invalid/v1", attempts=2), stream)
    proxy = f"through the proxy http://127.0.0.1:{port} (from {variable})"
    assert proxy in said, said
    assert "ConnectionRefusedError" in said and "check the proxy" in said, said
    logged = [r.getMessage() for r in caplog.records if r.name == "bide"]
    assert len(logged) == 2 and all(proxy in line for line in logged), logged
    assert "proxy-secret" not in said + "".join(logged) and "proxy-user" not in said


def _answers_connect(reply: bytes) -> Any:
    def answer(conn: socket.socket) -> None:
        conn.sendall(reply)

    return answer


@pytest.mark.parametrize("kind", KINDS)
def test_a_proxy_that_answers_407_to_connect_is_named(
    kind: str, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "... failed after 1 attempts: ProxyError: 407 Proxy Authentication Required", which proxy
    not said (one may be set far from the code, in a container's environment)."""
    proxy = raw_server(
        _answers_connect(b"HTTP/1.1 407 Proxy Authentication Required\r\nproxy-authenticate: Basic\r\n\r\n")
    )
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    said = _failure(_model(kind, "https://model.invalid/v1"), False)
    assert "407 Proxy Authentication Required" in said, said
    assert f"through the proxy {proxy.url} (from HTTPS_PROXY)" in said, said
    assert proxy.headers and proxy.headers[0]["host"] == "model.invalid:443"  # the tunnel was asked


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_proxy_that_closes_the_tunnel_is_named(
    kind: str, stream: bool, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy opens the tunnel, then closes it: TLS cannot start. Before, nothing said a proxy did it."""
    proxy = raw_server(_answers_connect(b"HTTP/1.1 200 Connection established\r\n\r\n"))
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    said = _failure(_model(kind, "https://model.invalid/v1"), stream)
    assert f"through the proxy {proxy.url} (from HTTPS_PROXY) failed after 1 attempts" in said, said


@pytest.mark.parametrize("kind", KINDS)
def test_a_407_from_a_forwarding_proxy_names_it_and_what_it_wants(
    kind: str, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """For http://, the proxy forwards the request and answers it: its 407 read as the model server's
    ("check the model name, API key and request")."""
    body = b'{"error": {"message": "proxy authentication required"}}'
    proxy = raw_server(
        _answers_connect(
            b"HTTP/1.1 407 Proxy Authentication Required\r\nconnection: close\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
    )
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    said = _failure(_model(kind, "http://model.invalid/v1"), False)
    assert f"through the proxy {proxy.url} (from HTTP_PROXY) answered 407" in said, said
    assert "check the proxy's credentials, given in its URL" in said, said


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_a_proxy_breaks_names_it(
    kind: str, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy (answering for the server, as a forwarding proxy's reply does) starts a stream, then cuts
    it short: "the stream broke off" names the proxy."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 1000\r\n\r\n"
    proxy = raw_server(_answers_connect(head + b": keep-alive\n\n"))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    said = _failure(_model(kind, "http://model.invalid/v1"), True)
    assert f"model 'm' through the proxy {proxy.url} (from HTTP_PROXY): the stream broke off" in said, said


@pytest.mark.parametrize("kind", KINDS)
def test_a_host_no_proxy_names_goes_around_and_names_no_proxy(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = _closed_port()
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    said = _failure(_model(kind, f"http://127.0.0.1:{port}"), False)
    assert "ConnectionRefusedError" in said and "proxy" not in said.lower(), said
    assert f"127.0.0.1:{port}" in said
