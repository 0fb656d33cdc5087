"""What a re-test of the adapters' last changes found (each failed on the code before):

- an Anthropic content block whose `type` is a JSON array or object raised a bare `TypeError` (unhashable)
  where a malformed answer is a `ModelError` or, as before the blocks were kept, left out;
- a streamed citation that is not an object was kept, to be sent back on every later turn;
- a `query` too long for a URL was taken when the model was made, then every request failed to build;
- an error body of exactly the 64 KiB bide reads was said to have "the rest not read";
- a dict subclass whose `items()` differs from what it holds passed the `query` check with other values.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from raw_http import one_turn

import bide
from bide.testing import LoopbackServer, Received, Reply

Serve = Callable[[Callable[[Received], Reply]], LoopbackServer]
KEY = "sk-AbCd/EfGhIj+KlMnOp/QrStUv"


def _event(kind: str, **fields: Any) -> tuple[str, str]:
    return kind, json.dumps({"type": kind, **fields})


def _stream_of(first: dict[str, Any], deltas: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A streamed answer: block 0 is `first` with `deltas`, block 1 the text "hi"."""
    return [
        _event("message_start", message={"usage": {"input_tokens": 1}}),
        _event("content_block_start", index=0, content_block=first),
        *(_event("content_block_delta", index=0, delta=d) for d in deltas),
        _event("content_block_stop", index=0),
        _event("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        _event("content_block_delta", index=1, delta={"type": "text_delta", "text": "hi"}),
        _event("content_block_stop", index=1),
        _event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        _event("message_stop"),
    ]


def _anthropic(url: str) -> bide.AnthropicModel:
    return bide.AnthropicModel("m", api_key=KEY, base_url=url, retry=bide.RetryPolicy(attempts=1), timeout=10)


def _turn(model: bide.Model, stream: bool) -> bide.AssistantMessage:
    return asyncio.run(one_turn(model, stream))


@pytest.mark.parametrize("kind", [["a"], {"k": 1}], ids=["array", "object"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_block_whose_type_is_an_array_or_an_object_is_no_python_error(
    serve: Serve, stream: bool, kind: Any
) -> None:
    whole = {
        "type": "message", "role": "assistant", "content": [{"type": kind}, {"type": "text", "text": "hi"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1},
    }  # fmt: skip
    events = _stream_of({"type": kind, "x": 1}, [])
    server = serve(lambda request: Reply(events=events) if request.body.get("stream") else Reply(body=whole))
    # (first a bare TypeError, unhashable type; then the block was left out silently; a malformed answer now)
    with pytest.raises(bide.ModelError, match=r"a content block \(block 0\) whose type is not a string"):
        _turn(_anthropic(server.url), stream)


def test_a_streamed_citation_that_is_not_an_object_is_refused(serve: Serve) -> None:
    events = _stream_of(
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": "Sunny."}, {"type": "citations_delta", "citation": None}],
    )
    server = serve(lambda request: Reply(events=events))
    with pytest.raises(bide.ModelError, match="a citations_delta whose citation is not an object"):
        _turn(_anthropic(server.url), True)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_query_too_long_for_a_url_is_refused_when_the_model_is_made(kind: str) -> None:
    model = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    with pytest.raises(bide.ConfigError, match="query parameters a URL can hold") as refused:
        model("m", api_key=KEY, base_url="http://127.0.0.1:9/v1", query={"code": "z" * 70_000})
    assert "zzzz" not in str(refused.value)


def test_an_error_body_of_exactly_what_is_read_is_not_said_to_go_on(serve: Serve) -> None:
    pad = 64 * 1024 - len(json.dumps({"error": {"message": ""}}))  # the body as Reply sends it: 64 KiB
    server = serve(lambda request: Reply(status=400, body={"error": {"message": "y" * pad}}))
    with pytest.raises(bide.ModelError) as failed:
        _turn(bide.OpenAIModel("m", api_key=KEY, base_url=f"{server.url}/v1", timeout=10), False)
    assert "the rest was not read" not in str(failed.value), str(failed.value)[-300:]
    assert f"(cut here, of {pad:,} characters)" in str(failed.value), str(failed.value)[-300:]


class _Misleading(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        return [("api-version", "2024-10-21")]


def test_query_is_checked_as_it_is_copied() -> None:
    with pytest.raises(bide.ConfigError, match="is a int"):
        misleading = _Misleading({"api-version": 5})
        bide.OpenAIModel("m", api_key=KEY, base_url="http://127.0.0.1:9/v1", query=misleading)
