"""A proxy setting httpx cannot read (a password with an unencoded '/', a bracketed IPv6 host in NO_PROXY,
a SOCKS proxy without socksio) is a ConfigError naming the variable, not a ModelError saying "run again"
with part of the password; a proxy quoting its own credentials back has them masked; the retry log shows a
wait as it is waited; proxy advice is given only for the proxy's failures; a whole OpenAI answer whose
finish_reason is not a string is refused; a base_url with a query or fragment is refused."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import sys

import pytest
from raw_http import StartServer, one_turn

import bide
from bide._http import TransientStatus

PROXY_VARIABLES = [f"{scheme}_proxy" for scheme in ("http", "https", "all", "no")] + [
    f"{scheme}_PROXY" for scheme in ("HTTP", "HTTPS", "ALL", "NO")
]


@pytest.fixture(autouse=True)
def _no_proxy_of_our_own(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("REQUEST_METHOD", raising=False)


def _http_reply(status: bytes, body: bytes) -> bytes:
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
    return head % (status, len(body)) + body


@pytest.mark.parametrize(
    ("variable", "value", "says", "hidden"),
    [
        ("HTTPS_PROXY", "http://proxyuser:s3cr3t/PW@127.0.0.1:9", "percent-encode", "s3cr3t"),
        ("HTTPS_PROXY", "http://proxyuser:s3cr3t#PW@127.0.0.1:9", "percent-encode", "s3cr3t"),
        ("https_proxy", "http://proxyuser:s3cr3t?PW@127.0.0.1:9", "percent-encode", "s3cr3t"),
        ("NO_PROXY", "localhost,[::1]", "without brackets", "Invalid port"),
        ("ALL_PROXY", "socks5://proxyuser:s3cr3t@127.0.0.1:9", "httpx[socks]", "s3cr3t"),
    ],
)
def test_a_proxy_setting_httpx_cannot_read_is_a_config_error(
    variable: str, value: str, says: str, hidden: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "model 'm' failed on turn 0 of run 'r': Invalid port: 's3cr3t'; run again to retry" (or a
    raw ImportError for SOCKS). socksio is made unimportable here, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "socksio", None)
    monkeypatch.setenv(variable, value)
    model = bide.OpenAIModel("m", api_key="", base_url="https://model.invalid/v1", max_retries=0)
    agent = bide.Agent(model, store=bide.open_store("memory://"))
    with pytest.raises(bide.ConfigError) as caught:
        agent.run_sync("r", "hi")
    message = str(caught.value)
    assert variable in message and says in message, message
    assert hidden not in message and "run again" not in message, message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_proxy_quoting_its_own_credentials_has_them_masked(
    stream: bool, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, only the API key was masked: "denied for proxyuser:s3cr3t-PW (Proxy-Authorization: Basic
    cHJveHl1c2VyOnMzY3IzdC1QVw==)" was in the error and its body."""
    creds = "proxyuser:s3cr3t-PW"
    sent = base64.b64encode(creds.encode()).decode()
    said = f"denied for {creds} (Proxy-Authorization: Basic {sent}); password s3cr3t-PW"
    body = json.dumps({"error": {"message": said}}).encode()
    reply = _http_reply(b"407 Proxy Authentication Required", body)
    proxy = raw_server(lambda conn: conn.sendall(reply))
    monkeypatch.setenv("HTTP_PROXY", f"http://{creds}@{proxy.url.removeprefix('http://')}")
    model = bide.OpenAIModel("m", api_key="", base_url="http://model.invalid/v1", max_retries=0)
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, stream))
    shown = f"{caught.value}\n{caught.value.body}"
    assert "denied for" in shown and "through the proxy" in shown, shown
    for secret in ("s3cr3t", sent, sent[:12]):
        assert secret not in shown, shown


def test_the_retry_log_shows_a_wait_as_it_is_waited(caplog: pytest.LogCaptureFixture) -> None:
    """Before: "waiting 1.23e+03s" for a 1234 s wait, and "the server asked 0.3s; waiting 0.3s, the retry
    policy's maximum" when 0.30000001 s was asked."""
    caplog.set_level(logging.INFO, logger="bide")
    model = bide.OpenAIModel("m", api_key="", base_url="http://127.0.0.1:9/v1")
    busy = TransientStatus("HTTP 429: busy", status=429, body="", retry_after=5000.0)
    model._retrying(busy, 5000.0, bide.RetryPolicy(attempts=2, maximum=1234.0).wait(0, 5000.0))
    model._retrying(busy, 0.30000001, bide.RetryPolicy(attempts=2, maximum=0.3).wait(0, 0.30000001))
    lines = [r.getMessage() for r in caplog.records if r.name == "bide"]
    assert lines[0].endswith("(the server asked 5000s; waiting 1234s, the retry policy's maximum)"), lines
    assert lines[1].endswith("(waiting 0.3s; the server asked 0.3s)"), lines


def test_a_status_through_a_proxy_gets_no_proxy_advice(
    raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 the model server sent, passed on by the proxy, ended "check the proxy (or name the host in
    NO_PROXY ...)"; a refused connection to the proxy still says so."""
    reply = _http_reply(b"429 Too Many Requests", json.dumps({"error": {"message": "slow down"}}).encode())
    proxy = raw_server(lambda conn: conn.sendall(reply))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    retry = bide.RetryPolicy(attempts=2, initial=0.001, maximum=0.001)
    model = bide.OpenAIModel("m", api_key="", base_url="http://model.invalid/v1", retry=retry)
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, False))
    assert "HTTP 429: slow down" in str(caught.value) and "check the proxy" not in str(caught.value)
    assert str(caught.value).endswith("run again to retry"), str(caught.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed}")
    model = bide.OpenAIModel("m", api_key="", base_url="http://model.invalid/v1", retry=retry)
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, False))
    assert "check the proxy" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("reason", [["content_filter"], {"type": "length"}, 7, True])
def test_a_whole_answer_whose_finish_reason_is_not_a_string_is_refused(
    reason: object, raw_server: StartServer
) -> None:
    """Before, read as no finish reason: the partial text was journaled as the final answer."""
    answer = {"choices": [{"message": {"role": "assistant", "content": "partial"}, "finish_reason": reason}]}
    reply = _http_reply(b"200 OK", json.dumps(answer).encode())
    server = raw_server(lambda conn: conn.sendall(reply))
    store = bide.open_store("memory://")
    model = bide.OpenAIModel("m", api_key="", base_url=server.url + "/v1", max_retries=0)
    agent = bide.Agent(model, store=store)
    with pytest.raises(bide.ModelError) as caught:
        agent.run_sync("r", "hi")
    assert "a finish_reason that is not a string or null" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("url", ["http://gw.example/v1?api-version=2024", "http://gw.example/v1#top", "http://gw.example?"])
def test_a_base_url_with_a_query_or_fragment_is_refused(kind: str, url: str) -> None:
    """Before, the API's path went after it ("/v1?api-version=2024/chat/completions"): every request to the
    wrong path, silently."""
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    with pytest.raises(bide.ConfigError, match="without a query"):
        cls("m", api_key="", base_url=url)
