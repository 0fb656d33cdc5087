"""The retry log says how long bide waits before the retry, and when the retry policy's `maximum` cut a
server's `Retry-After` short ("the server asked 600s; waiting 0.05s, the retry policy's maximum"): before,
it said "(the server asks to wait 600s)" and then waited the policy's maximum. `RetryPolicy.run` and
`run_sync` tell a `waiting` callback of each retry, with the server's hint and the wait."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from raw_http import StartServer, one_turn

import bide


def _busy(headers: bytes) -> bytes:
    body = b'{"error": {"message": "busy"}}'
    return (
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nconnection: close\r\n"
        + headers
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _retries_logged(
    kind: str, stream: bool, raw_server: StartServer, headers: bytes, caplog: pytest.LogCaptureFixture
) -> list[logging.LogRecord]:
    caplog.set_level(logging.INFO, logger="bide")
    reply = _busy(headers)
    server = raw_server(lambda conn: conn.sendall(reply))
    retry = bide.RetryPolicy(attempts=2, initial=0.01, maximum=0.05)
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    model = cls("m", api_key="", base_url=server.url, retry=retry, timeout=10)
    with pytest.raises(bide.ModelError):
        asyncio.run(one_turn(model, stream))
    return [r for r in caplog.records if "; retrying" in r.getMessage()]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_retry_after_past_the_policy_maximum_is_said_to_be_cut(
    kind: str, stream: bool, raw_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    [record] = _retries_logged(kind, stream, raw_server, b"retry-after: 600\r\n", caplog)
    said = record.getMessage()
    assert said.endswith(
        "HTTP 429; retrying (the server asked 600s; waiting 0.05s, the retry policy's maximum)"
    ), said
    assert record.retry_after == 600.0 and record.retry_wait == 0.05  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_retry_after_within_the_maximum_is_said_as_waited(
    kind: str, raw_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    [record] = _retries_logged(kind, False, raw_server, b"retry-after-ms: 30\r\n", caplog)
    said = record.getMessage()
    assert said.endswith("HTTP 429; retrying (waiting 0.03s; the server asked 0.03s)"), said
    assert "maximum" not in said


def test_a_retry_without_a_hint_says_its_own_wait(
    raw_server: StartServer, caplog: pytest.LogCaptureFixture
) -> None:
    [record] = _retries_logged("openai", False, raw_server, b"", caplog)
    said = record.getMessage()
    wait = re.fullmatch(r".*HTTP 429; retrying \(waiting ([0-9.e-]+)s\)", said)
    assert wait is not None, said
    assert 0 <= float(wait.group(1)) <= 0.01 and record.retry_after is None  # type: ignore[attr-defined]


def test_the_policy_tells_of_each_retry_and_its_wait() -> None:
    """`waiting` hears (exception, hint, wait) before each retry's wait, never after the last attempt."""
    policy = bide.RetryPolicy(attempts=3, initial=0.001, maximum=0.002, jitter=False)
    heard: list[tuple[str, float | None, float]] = []
    failures = iter([ValueError("a"), ValueError("b"), ValueError("c")])

    def attempt() -> None:
        raise next(failures)

    def classify(exc: BaseException) -> bool | float:
        return 60.0 if str(exc) == "a" else True

    with pytest.raises(ValueError, match="c"):
        policy.run_sync(attempt, classify, lambda exc, hint, wait: heard.append((str(exc), hint, wait)))
    assert heard == [("a", 60.0, 0.002), ("b", None, 0.002)]

    heard.clear()
    failures = iter([ValueError("a"), ValueError("b"), ValueError("c")])

    async def attempt_async() -> None:
        raise next(failures)

    with pytest.raises(ValueError, match="c"):
        asyncio.run(policy.run(attempt_async, classify, lambda e, h, w: heard.append((str(e), h, w))))
    assert heard == [("a", 60.0, 0.002), ("b", None, 0.002)]
