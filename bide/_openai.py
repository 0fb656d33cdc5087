"""`OpenAIModel`: any OpenAI-compatible chat-completions endpoint, over one pooled httpx client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ._canonical import utf8_text
from ._errors import ConfigError, ModelError
from ._http import (
    STREAM_TIMEOUT,
    WHOLE,
    HTTPModel,
    Mask,
    StreamText,
    absent_arguments,
    adds_to_answer,
    call_arguments,
    cut_off,
    error_shown,
    excerpt,
    filtered,
    filtered_answer,
    json_event,
    json_index,
    json_name,
    made_up_ids,
    malformed,
    masked_url,
    no_calls_after_all,
    nothing_written,
    read_json,
    refused,
    sse_events,
    too_many_calls,
    unfinished,
    unknown_end,
)
from ._messages import (
    MAX_TOOL_CALLS,
    AssistantMessage,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
)
from ._retry import RetryPolicy

if TYPE_CHECKING:
    import httpx  # imported when a client is made (bide._http): `import bide` stays light

__all__ = ["OpenAIModel"]


class OpenAIModel(HTTPModel):
    """A model served by an OpenAI-compatible ``/chat/completions`` endpoint.

    `api_key` defaults to ``OPENAI_API_KEY`` and `base_url` to ``OPENAI_BASE_URL`` (else
    ``https://api.openai.com/v1``). One pooled HTTP client serves every call of this model (per event loop);
    close it with `await model.aclose()` or ``async with model:``.

    Transient failures (connection errors, timeouts, HTTP 408, 409, 425, 429, 500, 502, 503, 504 and 529)
    are retried by `retry` (a `bide.RetryPolicy`; by default `max_retries` retries with full-jitter
    exponential backoff from `backoff` seconds, capped at `max_backoff`), waiting at least what a
    ``Retry-After`` (seconds or an HTTP date) or ``retry-after-ms`` header asks, capped at the policy's
    maximum; any other status raises `ModelError` at once with the server's message. `timeout` (seconds)
    bounds each try in total: a whole answer must have come by then, and a stream must have started. After
    that, each wait for a piece that adds to the answer is bounded by `timeout` (keep-alive comments, pings
    and empty pieces do not count), and all the waits of the stream together by `stream_timeout` (600 s by
    default); either raises `ModelError`, and nothing is journaled. An answer past 32 MiB (as sent or as
    decoded) is refused as it arrives; it may come gzip- or deflate-encoded, one layer. An answer of
    another shape than the API's, with more than one choice or more than 256 tool calls, or cut off at
    the token limit (``finish_reason`` "length") with tool calls raises `ModelError`. A tool call without
    arguments (absent, null or empty) is not read as {}: the model is told, and the tool does not run,
    unless it takes no parameters. `temperature` and extra body fields are optional. Token `usage` and
    `finish_reason` are read from the answer. `query` holds parameters sent in the URL of every request
    (Azure OpenAI's ``{"api-version": "2024-10-21"}``), names and values strings; `base_url` itself takes
    no query. Their values are masked in what a server sends back, as the key is (a gateway may take its
    key there), and, like every setting of a model, they are never journaled.

    `stream(request)` streams a turn (``stream: true``, usage included): text deltas as they come, then the
    whole turn, tool calls assembled from their pieces. A server that answers it with one whole JSON
    completion (it ignores ``stream``) gives that turn, its text as one delta.

    A turn is journaled only if it ended as an answer or a request for tools: a refusal (``refusal``), the
    deprecated ``function_call`` form, an answer the content filter stopped, one cut off before it wrote
    anything, or a ``finish_reason`` bide does not know raise `ModelError` (the run is not finished).
    `answer_finish_reasons` are the reasons read as a complete answer; a subclass may add its server's own.
    """

    # "stop", and what compatible servers (Hugging Face TGI, Together) send for the same end.
    answer_finish_reasons: ClassVar[frozenset[str]] = frozenset({"stop", "eos", "eos_token", "stop_sequence"})

    provider = "openai"
    _env = "OPENAI"
    _default_url = "https://api.openai.com/v1"
    _example_model = "gpt-4o-mini"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 60.0,
        stream_timeout: float = STREAM_TIMEOUT,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        retry: RetryPolicy | None = None,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
        query: Mapping[str, str] | None = None,
    ) -> None:
        self._init_http(
            model,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            stream_timeout=stream_timeout,
            retry=retry,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            temperature=temperature,
            extra_body=extra_body,
            transport=transport,
            limits=limits,
            query=query,
        )
        if self.api_key and masked_url(self.base_url) != self.base_url:
            # httpx sends the URL's user and password as the Authorization header, in place of the key's.
            raise ConfigError(
                f"base_url {masked_url(self.base_url)!r} carries credentials (the user information before "
                "its '@'), which would be sent as the request's Authorization header in place of the API "
                "key: the server would never see the key. Give a proxy's credentials to the proxy "
                "(HTTPS_PROXY), not in base_url"
            )

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so it can be inspected and tested)."""
        messages: list[dict[str, Any]] = []
        for m in request.messages:
            if m.role in ("system", "user"):
                messages.append({"role": m.role, "content": m.content})
            elif m.role == "assistant":
                # Null content is valid only beside tool calls: a journaled empty answer (finish "stop"
                # with no text) sent as null was refused with a 400 on every later request of its run.
                empty = None if m.tool_calls else ""
                item: dict[str, Any] = {"role": "assistant", "content": m.content or empty}
                if m.tool_calls:
                    item["tool_calls"] = [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {
                                "name": c.name,
                                # Keys sorted, as the journal gives them back: the same text live and
                                # replayed, so a resumed or continued conversation is sent as it was.
                                "arguments": c.arguments
                                if isinstance(c.arguments, str)
                                else json.dumps(c.arguments, sort_keys=True),
                            },
                        }
                        for c in m.tool_calls
                    ]
                messages.append(item)
            elif isinstance(m, ToolMessage):
                content = f"Error: {m.content}" if m.is_error else m.content
                messages.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": content})
        body: dict[str, Any] = {"model": self.name, "messages": messages}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        return self._with_options(body)

    def _url(self) -> str:
        return f"{self._request_base()}/chat/completions"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        return headers

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        data = await self._post(self.body(request))
        return _parse(self.name, data, request.tools, self.answer_finish_reasons, self._redacted)

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | AssistantMessage]:
        body = self.body(request)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        response = await self._open_stream(body)
        clock = self._stream_clock()
        mask = self._redacted
        text = StreamText(self.name, "text")
        refusal = StreamText(self.name, "refusal")
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finish = ""
        done = False
        try:
            async for event, data in sse_events(response, self.name, clock, mask, self._through()):
                if event == WHOLE:
                    # A server that ignores `stream` (or says in a 200 that it failed): the whole turn, read
                    # as `complete` reads it.
                    decoded = self._decoded(data)
                    turn = _parse(self.name, decoded, request.tools, self.answer_finish_reasons, mask)
                    if turn.content:
                        yield TextDelta(text=turn.content)
                    yield turn
                    return
                if data.strip() == "[DONE]":
                    done = True
                    break
                chunk = json_event(self.name, data, mask)
                if not isinstance(chunk, dict):
                    shown = excerpt(data, mask)
                    raise malformed(self.name, f"a stream event that is not a JSON object: {shown}")
                if isinstance(chunk.get("error"), (dict, str)):
                    said = error_shown(_error_text(chunk["error"]), self._redacted)
                    raise ModelError(
                        f"model {self.name!r} failed mid-stream: {said}; nothing was "
                        "journaled, run again to retry"
                    )
                if isinstance(chunk.get("usage"), dict):
                    counted = _usage(chunk["usage"])
                    if counted != usage:  # the same counts again are a keep-alive, not progress
                        clock.progress()
                    usage = counted
                # What is not of the API's shape is refused, not skipped: skipping a piece would journal a
                # turn without it (an empty final answer ends the run for good).
                for choice in _listed(self.name, chunk, "choices", mask):
                    if not isinstance(choice, dict):
                        raise malformed(
                            self.name, f"a stream choice that is not an object: {excerpt(choice, mask)}"
                        )
                    if json_index(self.name, choice.get("index"), 0, mask) != 0:
                        # bide asks for one choice: pieces of another would be spliced into this one's calls.
                        raise malformed(self.name, f"a piece of a second choice (index {choice['index']})")
                    delta = choice.get("delta")
                    if delta is None:
                        delta = {}  # a finish without a delta
                    elif not isinstance(delta, dict):
                        shown = excerpt(delta, mask)
                        raise malformed(self.name, f"a stream delta that is not an object: {shown}")
                    ends = choice.get("finish_reason")
                    if ends is not None and not isinstance(ends, str):
                        # Skipped, the stream read as one that ended before its turn did.
                        raise _finish_not_text(self.name, ends, mask)
                    if adds_to_answer({key: value for key, value in delta.items() if key != "role"}):
                        if finish and (delta.get("content") or delta.get("tool_calls")):
                            # A finish judged without these pieces: a tool call added after a "stop" or a
                            # "length" would run a call nobody checked.
                            shown = excerpt(finish, mask, 100)
                            raise malformed(self.name, f"a piece after the finish reason {shown}")
                        clock.progress()  # text, call pieces, reasoning: not an empty keep-alive delta
                    if isinstance(ends, str) and ends:
                        if finish and ends != finish:
                            # A second finish would overwrite the first: "length", then "tool_calls", ran the
                            # calls of a turn cut off at its token limit.
                            shown = f"{excerpt(ends, mask, 100)} after {excerpt(finish, mask, 100)}"
                            raise malformed(self.name, f"a second finish reason {shown}")
                        if ends != finish:  # a repeated finish is no progress either
                            clock.progress()
                        finish = ends
                    piece = delta.get("content")
                    if piece is not None and not isinstance(piece, str):
                        raise malformed(
                            self.name, f"a delta whose content is not a string: {excerpt(piece, mask)}"
                        )
                    if piece:
                        shown = text.add(piece)
                        if shown:
                            with clock.handed():
                                yield TextDelta(text=shown)
                    no = delta.get("refusal")
                    if no is not None and not isinstance(no, str):
                        shown = excerpt(no, mask)
                        raise malformed(self.name, f"a delta whose refusal is not a string: {shown}")
                    if no:
                        refusal.add(no)
                    if delta.get("function_call") is not None:
                        raise _legacy_call(self.name)
                    for piece_of_call in _listed(self.name, delta, "tool_calls", mask):
                        raw, fn = _call_parts(self.name, piece_of_call, mask)
                        index = _piece_index(self.name, raw, fn, calls, mask)
                        slot = calls.get(index)
                        if slot is None:
                            if len(calls) >= MAX_TOOL_CALLS:
                                raise too_many_calls(self.name)
                            args = StreamText(self.name, f"tool call {index}'s arguments")
                            slot = calls[index] = {"args": args}
                        _add_piece(self.name, index, slot, raw, fn, mask)
        finally:
            await response.aclose()
        if not done or not finish:
            # Without its finish reason (even with [DONE]) the turn may be cut short: an empty answer
            # would end the run for good.
            raise unfinished(self.name, self._through())
        _judge(self.name, finish, text.text(), bool(calls), refusal.text(), self.answer_finish_reasons, mask)
        slots = [slot for _, slot in sorted(calls.items())]
        ids = made_up_ids([slot.get("id", "") for slot in slots], "call_")
        tool_calls = [
            ToolCall(
                id=call_id,
                name=slot.get("name", ""),
                arguments=_arguments(slot["args"].text(), request.tools, slot.get("name", "")),
            )
            for call_id, slot in zip(ids, slots, strict=True)
        ]
        yield AssistantMessage(
            content=text.text(), tool_calls=tool_calls, usage=usage, finish_reason=finish
        )


_TOKEN_LIMIT = "the request's output token limit (max_tokens or max_completion_tokens, in extra_body)"
# Cut off at a token limit: the answer's ("length"), or the model's context (Mistral's "model_length").
_CUT_OFF = frozenset({"length", "model_length"})


def _judge(
    name: str, reason: str, text: str, has_calls: bool, refusal: str, ends: frozenset[str], mask: Mask
) -> None:
    """Raise ModelError for a turn that must not be journaled as it came (a final answer ends the run for
    good): a refusal, the legacy function_call form, tool calls cut off or filtered, an answer the filter
    stopped or the token limit left empty, a finish for tools without one, or a finish reason not known
    (neither tools, a cut-off nor one of `ends`). "" (a whole answer that gave none) is an answer."""
    if refusal:
        raise refused(name, refusal, mask)
    if reason == "function_call":
        raise _legacy_call(name)
    if reason in _CUT_OFF:
        if has_calls:
            raise cut_off(name, reason, _TOKEN_LIMIT)
        if not text:
            raise nothing_written(name, reason, _TOKEN_LIMIT)
    elif reason == "content_filter":
        raise filtered(name, reason) if has_calls else filtered_answer(name, reason, text, mask)
    elif reason == "tool_calls":
        if not has_calls:
            raise no_calls_after_all(name, reason)
    elif reason and reason not in ends:
        raise unknown_end(
            name,
            "finish reason",
            reason,
            mask,
            " (if your server ends complete answers with it, add it to answer_finish_reasons in a subclass "
            "of OpenAIModel)",
        )


# The JSON type of each Python type `read_json` decodes to (a string and null are a finish reason's own).
_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


def _finish_not_text(name: str, reason: Any, mask: Mask) -> ModelError:
    """The error for a finish_reason, whole or streamed, that is neither a string nor null: its JSON type,
    and it shown by `excerpt`."""
    kind = _JSON_TYPES.get(type(reason), type(reason).__name__)
    return malformed(
        name, f"a finish_reason that is not a string or null ({kind}): {excerpt(reason, mask, 100)}"
    )


def _legacy_call(name: str) -> ModelError:
    return ModelError(
        f"model {name!r} called a function in the deprecated `function_call` form, which bide does not read "
        "(it sends `tools` and reads `tool_calls`); nothing was journaled: use a model or server that "
        "supports tool calls, then run again"
    )


def _add_piece(
    name: str, index: int, slot: dict[str, Any], raw: dict[str, Any], fn: dict[str, Any], mask: Mask
) -> None:
    """Add a streamed piece of tool call `index` to its `slot`. A piece may repeat its call's id and name
    or leave them out; another id or name at the same index is another call spliced in: ModelError."""
    for key, value in (("id", raw.get("id")), ("name", fn.get("name"))):
        given = json_name(name, value, key, mask)
        if given and slot.setdefault(key, given) != given:
            raise malformed(
                name,
                f"pieces of tool call {index} with the {key}s {excerpt(slot[key], mask, 100)} and "
                f"{excerpt(given, mask, 100)} "
                "(two calls spliced into one)",
            )
    piece = fn.get("arguments")
    if piece is not None and not isinstance(piece, str):
        # Skipped, it could leave the other pieces valid JSON without an argument the model sent: the tool
        # would run on its default for it.
        raise malformed(
            name, f"a piece of tool call {index}'s arguments that is not a string: {excerpt(piece, mask)}"
        )
    if piece:
        slot["args"].add(piece)


def _piece_index(
    name: str, raw: dict[str, Any], fn: dict[str, Any], calls: dict[int, dict[str, Any]], mask: Mask
) -> int:
    """The index of the call a streamed tool-call piece belongs to: its `index`. Some servers leave it out:
    then a piece with the id of a call goes on with that call, a piece with a new id or a tool name starts
    a call (several whole calls in one delta, say), and a piece of arguments alone goes on with the last
    call, instead of each piece becoming a call of its own."""
    if raw.get("index") is not None:
        return json_index(name, raw.get("index"), 0, mask)
    given = json_name(name, raw.get("id"), "id", mask)
    for index, slot in calls.items():
        if given and slot.get("id") == given:
            return index
    if given or json_name(name, fn.get("name"), "name", mask):
        return max(calls, default=-1) + 1
    return max(calls, default=0)


def _error_text(err: Any) -> str:
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return utf8_text(err["message"])
    return utf8_text(str(err))


def _listed(name: str, parent: dict[str, Any], key: str, mask: Mask) -> list[Any]:
    """`parent[key]`, a list the API may leave out or send as null (then empty); anything else is not of
    the API's shape: ModelError."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise malformed(name, f"a stream {key} that is not a list: {excerpt(value, mask)}")
    return value


def _usage(raw: Any) -> Usage | None:
    """OpenAI's `usage` ({prompt_tokens, completion_tokens}) as a Usage (None when absent or malformed)."""
    if not isinstance(raw, dict):
        return None
    inp, out = (
        raw.get("prompt_tokens", raw.get("input_tokens")),
        raw.get("completion_tokens", raw.get("output_tokens")),
    )
    if not (isinstance(inp, int) and isinstance(out, int)) or isinstance(inp, bool) or isinstance(out, bool):
        return None
    return Usage(input_tokens=max(inp, 0), output_tokens=max(out, 0))


def _arguments(text: Any, tools: Sequence[ToolSpec], tool: str) -> dict[str, Any] | str:
    """A call's `arguments` as sent: an object, else the text (the model is told it is not valid);
    absent, null or empty is not {} but `absent_arguments` (a tool never runs on its defaults for it)."""
    if text is None or text == "":
        return absent_arguments(tools, tool)
    if not isinstance(text, str):
        # Some servers send the arguments as a JSON object, not as text: checked as decoded text is.
        return call_arguments(text, json.dumps(text)) if isinstance(text, dict) else str(text)
    try:
        decoded = read_json(text)
    except ValueError:
        return text
    return call_arguments(decoded, text)


def _call_parts(name: str, raw: Any, mask: Mask) -> tuple[dict[str, Any], dict[str, Any]]:
    """A tool call (or a streamed piece of one) and its function object ({} when absent); ModelError for
    any other shape."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(fn, dict | None):
        raise malformed(
            name, f"a tool call that is not an object with a function object: {excerpt(raw, mask)}"
        )
    return raw, fn or {}


def _parse(
    name: str, data: Any, tools: Sequence[ToolSpec], ends: frozenset[str], mask: Mask
) -> AssistantMessage:
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError) as exc:
        missing = repr(exc)
    else:
        missing = ""
    if missing:  # (raised here, not chained: no exception behind an error holds what a server sent)
        raise ModelError(f"model {name!r} returned a response without choices[0].message: {missing}")
    if len(data["choices"]) > 1:
        # bide asks for one choice: which of several the run should act on is not bide's to pick.
        raise ModelError(
            f"model {name!r} answered with {len(data['choices'])} choices where bide asks for one; nothing "
            "was journaled: remove `n` (or any option asking for several choices) from extra_body, or use "
            "a server that honours one choice, then run again"
        )
    if not isinstance(message, dict):
        raise ModelError(f"model {name!r} returned a choices[0].message that is not an object")
    raw_calls = message.get("tool_calls")
    if raw_calls is None:
        raw_calls = []
    elif not isinstance(raw_calls, list):
        raise malformed(name, f"choices[0].message.tool_calls that is not a list: {excerpt(raw_calls, mask)}")
    if len(raw_calls) > MAX_TOOL_CALLS:
        raise too_many_calls(name)
    reason = choice.get("finish_reason") if isinstance(choice, dict) else None
    if reason is not None and not isinstance(reason, str):
        # Read as absent, a list or an object took the turn for a final answer that ended the run; the
        # streamed path never takes one as a finish either.
        raise _finish_not_text(name, reason, mask)
    finish = reason or ""
    # Before the calls are read: a cut-off call's arguments may be anything.
    if finish in _CUT_OFF and raw_calls:
        raise cut_off(name, finish, _TOKEN_LIMIT)
    if finish == "content_filter" and raw_calls:
        raise filtered(name, finish)
    if message.get("function_call") is not None:
        raise _legacy_call(name)
    ids: list[str] = []
    named: list[tuple[str, dict[str, Any] | str]] = []
    for one in raw_calls:
        raw, fn = _call_parts(name, one, mask)
        ids.append(json_name(name, raw.get("id"), "id", mask))
        tool = json_name(name, fn.get("name"), "name", mask)
        named.append((tool, _arguments(fn.get("arguments"), tools, tool)))
    calls = [
        ToolCall(id=call_id, name=tool, arguments=arguments)
        for call_id, (tool, arguments) in zip(made_up_ids(ids, "call_"), named, strict=True)
    ]
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        # Not the API's shape: journaling it as an empty answer would end the run on it for good.
        shown = excerpt(content, mask)
        raise malformed(name, f"choices[0].message.content that is not a string or null: {shown}")
    said = message.get("refusal")
    if said is not None and not isinstance(said, str):
        shown = excerpt(said, mask)
        raise malformed(name, f"choices[0].message.refusal that is not a string or null: {shown}")
    _judge(name, finish, content or "", bool(calls), said or "", ends, mask)
    return AssistantMessage(
        content=content or "",
        tool_calls=calls,
        usage=_usage(data.get("usage") if isinstance(data, dict) else None),
        finish_reason=finish,
    )
