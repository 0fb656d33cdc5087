"""The adapters' errors and URLs: a long error body says it was cut and how long it was, the key masked at
any cut; a streamed finish_reason that is not text says so, as a whole answer's does; a '?' in base_url's
password is told to be percent-encoded; query parameters (an Azure api-version) are given as `query=`,
sent with every request, checked when the model is made, and masked in what a server sends back."""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import one_turn

import bide
from bide.testing import LoopbackServer, Received, Reply, anthropic_message, openai_completion

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
KEY = "sk-AbCd/EfGhIj+KlMnOp/QrStUv"


def _model(kind: str, url: str, **options: Any) -> bide.OpenAIModel | bide.AnthropicModel:
    once = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=KEY, base_url=f"{url}/v1", retry=once, timeout=10, **options)
    return bide.AnthropicModel("m", api_key=KEY, base_url=url, retry=once, timeout=10, **options)


def _shows(text: str, secret: str) -> bool:
    """Whether `text` holds 8 characters of `secret` in a row, as it is or as JSON or a URL write it."""
    forms = {secret, json.dumps(secret)[1:-1], urllib.parse.quote(secret, safe="")}
    return any(form[i : i + 8] in text for form in forms for i in range(len(form) - 7))


def _failure(model: bide.Model, stream: bool) -> bide.ModelError:
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, stream))
    return caught.value


# -- a long error body says it was cut ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_long_error_message_says_it_was_cut_and_how_long_it_was(
    serve: Serve, kind: str, stream: bool
) -> None:
    """Before, the body was cut to 2,000 characters before its JSON was read: the message was the body's
    raw first 2,000 characters (`{"error": {"message": "xxx...`), cut without a word."""
    said = "model overloaded: " + "x" * 51_216  # 51,234 characters
    server = serve(lambda request: Reply(status=400, body={"error": {"message": said}}))
    message = str(_failure(_model(kind, server.url), stream))
    assert '{"error"' not in message, message[:200]
    assert "answered 400: model overloaded: xxx" in message, message[:300]
    assert "x... (cut here, of 51,234 characters); this is not retried" in message, message[-300:]
    assert len(message) < 2400


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_long_error_in_a_200_says_it_was_cut(serve: Serve, kind: str) -> None:
    server = serve(lambda request: Reply(body={"error": {"message": "quota " + "q" * 9994}}))
    message = str(_failure(_model(kind, server.url), False))
    assert "error instead of a turn: quota qqq" in message
    assert "q... (cut here, of 10,000 characters); nothing was journaled" in message, message[-300:]


@pytest.mark.parametrize("status", [400, 503])
def test_an_error_body_past_what_is_read_says_the_rest_was_not_read(serve: Serve, status: int) -> None:
    """A body past the 64 KiB bide reads of an error is not said to be as long as what was read."""
    server = serve(lambda request: Reply(status=status, body={"error": {"message": "y" * 200_000}}))
    message = str(_failure(_model("openai", server.url), False))
    assert "y... (cut here, of more than " in message, message[-300:]
    assert " characters: the rest was not read); " in message, message[-300:]
    assert len(message) < 2400


@pytest.mark.parametrize("shift", [-40, -27, -14, -8, -1, 0, 1, 7, 20])
def test_the_key_across_the_cut_of_an_error_message_is_never_shown_in_part(serve: Serve, shift: int) -> None:
    """The message is read first, then masked and cut: a key anywhere around the cut is masked whole."""
    said = "z" * (2000 + shift) + KEY + "z" * 5000
    server = serve(lambda request: Reply(status=400, body={"error": {"message": said}}))
    error = _failure(_model("anthropic", server.url), False)
    assert "(cut here, of " in str(error)
    assert not _shows(str(error), KEY) and not _shows(error.body or "", KEY), str(error)[1900:2200]


@pytest.mark.parametrize("escaped", [False, True], ids=["plain", "json-escaped"])
def test_a_transient_error_that_runs_out_of_retries_keeps_the_cut_said_and_the_key_masked(
    serve: Serve, escaped: bool
) -> None:
    """The giving-up message cut the retried status's message again, at 2,000 characters of "HTTP 503:
    ...": the words saying where it had been cut were lost."""
    key = "".join(f"\\u{ord(c):04x}" for c in KEY) if escaped else KEY
    raw = json.dumps({"error": {"message": "w" * 1990 + "KEY" + "w" * 9000}}).replace("KEY", key)

    def answer(request: Received) -> Reply:
        return Reply(status=503, body=json.loads(raw))

    server = serve(answer)
    model = bide.OpenAIModel(
        "m", api_key=KEY, base_url=f"{server.url}/v1", timeout=10,
        retry=bide.RetryPolicy(attempts=2, initial=0.01, maximum=0.01),
    )
    message = str(_failure(model, False))
    assert "failed after 2 attempts: HTTP 503: www" in message
    assert "w... (cut here, of 10,9" in message, message[-200:]
    assert "characters); nothing was journaled" in message, message[-200:]
    assert not _shows(message, KEY)


# -- a streamed finish_reason that is not text -------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "kind"),
    [(5, "a number"), (["stop"], "an array"), ({"type": "stop"}, "an object"), (True, "a boolean")],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_finish_reason_that_is_not_text_is_said_whole_or_streamed(
    serve: Serve, reason: Any, kind: str, stream: bool
) -> None:
    """Before, a stream skipped it and said "the stream ended before the turn did"."""
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]},
    ]
    said = {"role": "assistant", "content": "hi"}
    whole = {"choices": [{"index": 0, "message": said, "finish_reason": reason}]}

    def answer(request: Received) -> Reply:
        if request.body.get("stream"):
            return Reply(events=[("", json.dumps(c)) for c in chunks] + [("", "[DONE]")])
        return Reply(body=whole)

    server = serve(answer)
    message = str(_failure(_model("openai", server.url), stream))
    assert f"sent a finish_reason that is not a string or null ({kind}): " in message, message
    assert "ended before the turn did" not in message


# -- a '?' in base_url ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [bide.OpenAIModel, bide.AnthropicModel])
@pytest.mark.parametrize(
    "url", ["https://u:p?x@example.com/v1", "https://u:p#x@example.com/v1", "http://us?r:pw@[::1]:8080"]
)
def test_a_question_mark_in_the_password_is_told_to_be_percent_encoded(model: Any, url: str) -> None:
    with pytest.raises(bide.ConfigError) as caught:
        model("m", api_key="", base_url=url)
    message = str(caught.value)
    assert "percent-encode them, '?' as %3F and '#' as %23" in message, message
    assert "query" not in message and "p?x" not in message and "p#x" not in message


@pytest.mark.parametrize("model", [bide.OpenAIModel, bide.AnthropicModel])
@pytest.mark.parametrize("url", ["https://gw.example.com/v1?api-version=1", "https://gw.example.com/v1#top"])
def test_a_query_in_base_url_points_to_the_query_option(model: Any, url: str) -> None:
    with pytest.raises(bide.ConfigError, match=r"without a query .* query=\{\.\.\.\}") as caught:
        model("m", api_key="", base_url=url)
    assert "api-version=1" not in str(caught.value)


def test_a_percent_encoded_question_mark_in_the_password_is_taken() -> None:
    model = bide.AnthropicModel("m", api_key="", base_url="https://u:p%3Fx@example.com")
    assert model.base_url == "https://u:p%3Fx@example.com"


# -- query parameters --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_query_parameters_are_sent_with_every_request(serve: Serve, kind: str, stream: bool) -> None:
    def answer(request: Received) -> Reply:
        return openai_completion("hi") if kind == "openai" else anthropic_message("hi")

    server = serve(answer)
    query = {"api-version": "2024-10-21", "note": "a b&c=d/é"}
    model = _model(kind, server.url, query=query)
    assert asyncio.run(one_turn(model, stream)).content == "hi"
    assert asyncio.run(one_turn(model, stream)).content == "hi"
    path = "/v1/chat/completions" if kind == "openai" else "/v1/messages"
    for request in server.requests:
        where, _, sent = request.path.partition("?")
        assert where == path
        assert urllib.parse.parse_qs(sent) == {name: [value] for name, value in query.items()}
    assert len(server.requests) == 2
    query["api-version"] = "changed"  # the model kept its own copy
    assert model.query == {"api-version": "2024-10-21", "note": "a b&c=d/é"}


def test_without_query_the_url_has_none(serve: Serve) -> None:
    server = serve(lambda request: openai_completion("hi"))
    asyncio.run(one_turn(_model("openai", server.url), False))
    assert server.requests[0].path == "/v1/chat/completions"


@pytest.mark.parametrize("model", [bide.OpenAIModel, bide.AnthropicModel])
@pytest.mark.parametrize(
    ("query", "says"),
    [
        ([("api-version", "1")], "not a list"),
        ({"api-version": 2024}, "not a dict whose 'api-version' is a int"),
        ({"code": None}, "not a dict whose 'code' is a NoneType"),
        ({1: "x"}, "not a dict with the name 1"),
        ({"": "x"}, "not a dict with the name ''"),
        ({"v": "\ud800"}, "not a dict whose 'v' holds a lone surrogate"),
    ],
)
def test_query_parameters_that_are_not_text_are_refused_when_the_model_is_made(
    model: Any, query: Any, says: str
) -> None:
    with pytest.raises(bide.ConfigError) as caught:
        model("m", api_key="", base_url="http://127.0.0.1:9", query=query)
    message = str(caught.value)
    assert "needs query, a dict of parameter names to values, both strings" in message and says in message


def test_a_secret_in_the_query_is_masked_in_what_the_server_sends_back(serve: Serve) -> None:
    """A gateway may take its key in the query (`code=...`): a server quoting the URL back does not show it,
    and bide's own messages show the URL without the query."""
    secret = "Gw-Secret-0123456789abcdef"

    def answer(request: Received) -> Reply:
        return Reply(status=404, body={"error": {"message": f"no route for {request.path}"}})

    server = serve(answer)
    error = _failure(_model("openai", server.url, query={"code": secret}), False)
    assert "no route for /v1/chat/completions?code=***" in str(error), str(error)
    assert not _shows(str(error), secret) and not _shows(error.body or "", secret)
