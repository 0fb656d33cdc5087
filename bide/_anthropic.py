"""`AnthropicModel`: the Anthropic Messages API (``POST /v1/messages``), over one pooled httpx client."""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

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
    error_message,
    error_shown,
    excerpt,
    filtered,
    filtered_answer,
    journal_order,
    json_event,
    json_index,
    json_name,
    json_object,
    made_up_ids,
    malformed,
    no_calls_after_all,
    nothing_written,
    read_json,
    sse_events,
    too_many_calls,
    unfinished,
    unknown_end,
)
from ._messages import (
    MAX_TOOL_CALLS,
    AssistantMessage,
    Message,
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

__all__ = ["ANTHROPIC_VERSION", "AnthropicModel"]

ANTHROPIC_VERSION = "2023-06-01"

#: The most content blocks one turn may hold (text, tool_use, thinking, ...), far past what a model writes
#: (256 tool calls, text between them, citations); a turn with more is refused, whole or streamed.
MAX_CONTENT_BLOCKS = 10_000


class AnthropicModel(HTTPModel):
    """A model served by the Anthropic Messages API.

    `api_key` defaults to ``ANTHROPIC_API_KEY`` and `base_url` to ``ANTHROPIC_BASE_URL`` (else
    ``https://api.anthropic.com``); requests carry ``x-api-key`` and ``anthropic-version``. The system prompt
    goes in the request's ``system`` field, tool calls and results as ``tool_use``/``tool_result`` content
    blocks; `max_tokens` bounds each answer (the API requires it). `usage` counts input tokens with the
    cache's (``cache_creation_input_tokens`` and ``cache_read_input_tokens``); `finish_reason` is the
    ``stop_reason`` ("end_turn", "tool_use", "max_tokens", ...).

    Pooling, retries (the same statuses, 529 overloaded among them, and connection errors; ``Retry-After``
    honoured), `aclose`, streaming, `timeout`, `stream_timeout`, `query` and the limits on answers work as for
    `bide.OpenAIModel`; a turn cut off at `max_tokens` (stop_reason "max_tokens") with tool calls raises
    `ModelError`, and a streamed tool call counts only once its block has ended. A tool_use block without
    input (absent or null; streamed, no input_json pieces) is not read as {}: the model is told, and the
    tool does not run, unless it takes no parameters. A user message that is empty or only white space,
    which the API refuses, raises `ConfigError` before any request (nothing of the turn is journaled; one
    another model answered is in the journal already, and its run cannot go on with this model). A turn
    with more than `MAX_CONTENT_BLOCKS` (10,000) content blocks raises `ModelError`.

    Content blocks of a type the adapter does not model (a server tool's, say) are kept as they came
    (`AssistantMessage.blocks`) and sent back on later turns; streamed, they get what their deltas carry, as
    the API's deltas add to the blocks it documents, and a delta bide cannot add to one raises `ModelError`
    rather than be dropped. A block without a string type, and a kept block whose "input" is not an object,
    raise `ModelError`.

    A turn is journaled only if it ended as an answer or a request for tools: a turn the API paused
    ("pause_turn"), one its safety filter stopped ("refusal"), one cut off before it wrote anything, a
    ``stop_reason`` bide does not know, and thinking blocks beside tool calls (extended thinking with
    tools, which needs the blocks sent back, is not supported yet) raise `ModelError` (the run is not
    finished). `answer_stop_reasons` are the reasons read as a complete answer.
    """

    answer_stop_reasons: ClassVar[frozenset[str]] = frozenset({"end_turn", "stop_sequence"})

    provider = "anthropic"
    _env = "ANTHROPIC"
    _default_url = "https://api.anthropic.com"
    _example_model = "claude-sonnet-4-5"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        timeout: float = 60.0,
        stream_timeout: float = STREAM_TIMEOUT,
        max_retries: int = 4,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        retry: RetryPolicy | None = None,
        temperature: float | None = None,
        extra_body: dict[str, Any] | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
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
        if not (isinstance(max_tokens, int) and max_tokens > 0):
            raise ConfigError("AnthropicModel needs max_tokens, a positive number of tokens per answer")
        self.max_tokens = max_tokens
        self.anthropic_version = anthropic_version

    def _url(self) -> str:
        return f"{self._request_base()}/v1/messages"

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json", "anthropic-version": self.anthropic_version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so it can be inspected and tested)."""
        system: list[str] = []
        messages: list[dict[str, Any]] = []

        def add(role: str, blocks: list[dict[str, Any]]) -> None:
            # The API wants user and assistant turns to alternate: blocks of one role in a row are merged
            # (the results of one turn's tool calls travel in one user message).
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})

        for m in request.messages:
            if m.role == "system":
                system.append(m.content)
            elif m.role == "user":
                if not m.content.strip():
                    raise _blank_message(type(self).__name__, request, m)
                add("user", [{"type": "text", "text": m.content}])
            elif m.role == "assistant" and m.blocks:
                if sent := _as_sent(m):
                    add("assistant", sent)
            elif m.role == "assistant":
                blocks: list[dict[str, Any]] = []
                if m.content.strip():
                    # The API refuses a text block that is empty or only white space (it sends such
                    # answers itself): sent back, a journaled one failed every later request of its run.
                    blocks.append({"type": "text", "text": m.content})
                blocks.extend(_tool_use(c) for c in m.tool_calls)
                if blocks:
                    add("assistant", blocks)
                # else: an empty answer is left out; the user messages on either side of it are merged.
            elif isinstance(m, ToolMessage):
                block: dict[str, Any] = {
                    "type": "tool_result",
                    "tool_use_id": m.tool_call_id,
                    "content": m.content,
                }
                if m.is_error:
                    block["is_error"] = True
                add("user", [block])
        body: dict[str, Any] = {"model": self.name, "max_tokens": self.max_tokens, "messages": messages}
        if system:
            body["system"] = "\n\n".join(system)
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters}
                for t in request.tools
            ]
        return self._with_options(body)

    async def complete(self, request: ModelRequest) -> AssistantMessage:
        data = await self._post(self.body(request))
        return _parse(self.name, data, request.tools, self.answer_stop_reasons, self._redacted)

    async def stream(self, request: ModelRequest) -> AsyncIterator[TextDelta | AssistantMessage]:
        body = self.body(request)
        body["stream"] = True
        response = await self._open_stream(body)
        clock = self._stream_clock()
        blocks: dict[int, _Block] = {}
        tools = 0
        usage: dict[str, Any] = {}
        finish = ""
        started = done = False
        try:
            async for event, data in sse_events(response, self.name, clock, self._redacted, self._through()):
                if event == WHOLE:
                    # A server that ignores `stream` (or says in a 200 that it failed): the whole turn, read
                    # as `complete` reads it.
                    decoded = self._decoded(data)
                    turn = _parse(self.name, decoded, request.tools, self.answer_stop_reasons, self._redacted)
                    if turn.content:
                        yield TextDelta(text=turn.content)
                    yield turn
                    return
                payload = json_event(self.name, data, self._redacted)
                if not isinstance(payload, dict):
                    shown = excerpt(data, self._redacted)
                    raise malformed(self.name, f"a stream event that is not a JSON object: {shown}")
                kind = payload.get("type", event)
                if isinstance(kind, str) and kind in _ADDING:
                    clock.progress()
                if kind == "message_start":
                    if started:
                        raise malformed(self.name, "a second message_start in one answer")
                    started = True
                    usage.update(json_object(json_object(payload.get("message")).get("usage")))
                elif kind in ("content_block_start", "content_block_delta") and finish:
                    # A block judged by a stop reason that came before it: a tool call after "end_turn" or
                    # "max_tokens" would run a call nobody checked.
                    shown = excerpt(finish, self._redacted, 100)
                    raise malformed(self.name, f"a {kind} after the stop_reason {shown}")
                elif kind == "content_block_start":
                    index = json_index(self.name, payload.get("index"), len(blocks), self._redacted)
                    if index in blocks:
                        # A block started again would lose what the first start received.
                        raise malformed(self.name, f"a second content_block_start for block {index}")
                    if len(blocks) >= MAX_CONTENT_BLOCKS:
                        # Each block is kept to the turn's end (its index is checked against every later
                        # piece): a flood of empty ones took some 800 bytes each, 360 MB for 31 MB of them.
                        raise _too_many_blocks(self.name)
                    start = payload.get("content_block")
                    if not isinstance(start, dict):
                        # Skipped, its pieces would be refused or lost, and a tool call with them.
                        raise malformed(
                            self.name,
                            f"a content_block_start without a block object: {excerpt(start, self._redacted)}",
                        )
                    block = _Block(self.name, index, start, self._redacted)
                    if block.added:
                        # A tool call, or a block that opens with text: an empty block (the API opens each
                        # text block so, its text to come in deltas) adds nothing until a delta does, and a
                        # stream of new empty blocks is as silent as pings.
                        clock.progress()
                    if block.type == "tool_use":
                        tools += 1
                        if tools > MAX_TOOL_CALLS:
                            raise too_many_calls(self.name)
                    blocks[index] = block
                elif kind == "content_block_delta":
                    delta = payload.get("delta")
                    if not isinstance(delta, dict):
                        raise malformed(
                            self.name,
                            f"a content_block_delta without a delta object: {excerpt(delta, self._redacted)}",
                        )
                    piece = _add_delta(self.name, blocks, payload, delta, self._redacted)
                    if adds_to_answer(delta):
                        clock.progress()  # not an empty piece
                    if piece is not None:
                        with clock.handed():
                            yield TextDelta(text=piece)
                elif kind == "content_block_stop":
                    index = json_index(self.name, payload.get("index"), 0, self._redacted)
                    ending = blocks.get(index)
                    if ending is None or ending.stopped:
                        where = "without its content_block_start" if ending is None else "twice"
                        raise malformed(self.name, f"a content_block_stop for block {index} {where}")
                    ending.stopped = True
                    if ending.added:  # the end of an empty block adds nothing either
                        clock.progress()
                elif kind == "message_delta":
                    delta = json_object(payload.get("delta"))
                    ends = delta.get("stop_reason")
                    counted = dict(usage)
                    if isinstance(ends, str) and ends:
                        if finish and ends != finish:
                            # A second stop reason would overwrite the first: "max_tokens", then "tool_use",
                            # ran the calls of a turn cut off at its token limit.
                            mask = self._redacted
                            shown = f"{excerpt(ends, mask, 100)} after {excerpt(finish, mask, 100)}"
                            raise malformed(self.name, f"a second stop_reason {shown}")
                        if ends != finish:
                            clock.progress()
                        finish = ends
                    usage.update(json_object(payload.get("usage")))
                    if usage != counted:  # the same counts again, or an empty delta, are a keep-alive
                        clock.progress()
                elif kind == "message_stop":
                    done = True
                    break
                elif kind == "error" or isinstance(payload.get("error"), (dict, str)):
                    said = error_shown(error_message(data), self._redacted)
                    raise ModelError(
                        f"model {self.name!r} failed mid-stream: {said}; nothing was "
                        "journaled, run again to retry"
                    )
        finally:
            await response.aclose()
        if not (done and started and finish):
            # Without its message_start and stop_reason the answer may be cut short: an empty or partial
            # answer would end the run for good.
            raise unfinished(self.name, self._through())
        ordered = [block for _, block in sorted(blocks.items())]
        text = "".join(block.text.text() for block in ordered if block.type == "text")
        # Before any block's input is read: a cut-off call's block may have no end.
        _judge(
            self.name,
            finish,
            text,
            any(block.type == "tool_use" for block in ordered),
            any(_thinks(block.type) for block in ordered),
            self.answer_stop_reasons,
            self._redacted,
        )
        ids: list[str] = []
        named: list[tuple[str, dict[str, Any] | str]] = []
        for block in ordered:
            if block.type == "tool_use":
                arguments = block.arguments()
                if arguments is None:
                    arguments = absent_arguments(request.tools, block.name)
                ids.append(block.id)
                named.append((block.name, arguments))
        yield AssistantMessage(
            content=text,
            tool_calls=_calls(ids, named),
            usage=_usage(usage),
            finish_reason=finish,
            blocks=_kept([block.whole(self._redacted) for block in ordered if not _thinks(block.type)]),
        )


# The events that add to an answer whenever they come (each may come once: a second one is refused); a
# `ping`, or an event of a kind bide does not know, does not. A content block's start and stop add to it
# only when the block is not empty (`_Block.added`), a message_delta only a new stop reason or new usage
# counts.
_ADDING = frozenset({"message_start", "message_stop"})


class _Block:
    """A content block of a streamed answer, from its content_block_start to its content_block_stop."""

    __slots__ = (
        "_model", "added", "citations", "id", "index", "input", "json", "name", "start", "stopped", "strings",
        "text", "type",
    )

    def __init__(self, model: str, index: int, start: dict[str, Any], mask: Mask) -> None:
        self.index = index
        self.start = start
        self.citations: list[Any] = []  # a text block's (or a kept block's) citations_delta pieces
        self.type = _block_type(model, index, start, mask)
        # A kept block's text fields ("text", "thinking", "signature") with what its deltas added to them.
        self.strings: dict[str, StreamText] = {}
        self.id = json_name(model, start.get("id"), "id", mask) if self.type == "tool_use" else ""
        self.name = json_name(model, start.get("name"), "name", mask) if self.type == "tool_use" else ""
        # Whether the block added anything to the answer (see `adds_to_answer`): a text block starts empty.
        self.added = adds_to_answer(start)
        first_text = start.get("text")
        self.text = StreamText(model, f"block {index}'s text")
        if isinstance(first_text, str):
            self.text.add(first_text)
        self.json = StreamText(model, f"block {index}'s input_json")
        given = start.get("input", {})
        if self.type == "tool_use" and not isinstance(given, dict):
            raise malformed(model, f"a tool_use block whose input is not an object: {excerpt(given, mask)}")
        self.input: dict[str, Any] = given if isinstance(given, dict) else {}
        self.stopped = False
        self._model = model

    def whole(self, mask: Mask) -> dict[str, Any]:
        """The block as a whole answer would have held it: its start with the text, citations and input
        its deltas added (a tool_use block is sent back from its call, see `_as_sent`)."""
        block = dict(self.start)
        if self.citations:
            given = block.get("citations")
            block["citations"] = [*(given if isinstance(given, list) else []), *self.citations]
        if self.type == "text":
            block["text"] = self.text.text()
            return block
        if self.type in _MODELED:
            return block  # not kept as it came (see `_kept`)
        shown = excerpt(self.type, mask, 50)
        if not self.stopped:
            # Kept to be sent back: a part may be missing, which the API would refuse on every later turn.
            what = f"a {shown} block (block {self.index}) without its content_block_stop"
            raise malformed(self._model, what)
        for field, text in self.strings.items():
            block[field] = text.text()
        raw = self.json.text()
        if raw.strip():
            if self.start.get("input") not in (None, {}):
                # One of the two would be dropped (as for a tool_use block, see `arguments`).
                where = f"a {shown} block (block {self.index})"
                raise malformed(self._model, f"{where} with an input in its start and input_json pieces")
            try:
                block["input"] = read_json(raw)
            except ValueError:
                raise malformed(
                    self._model, f"a {shown} block (block {self.index}) whose input_json is not JSON"
                ) from None
        _check_kept(self._model, self.index, block, mask)
        return block

    def keep(self, kind: Any, delta: dict[str, Any], mask: Mask) -> None:
        """Add a delta to a block of a type the adapter does not model (kept as it came, to be sent back),
        as the API's deltas add to the blocks it documents: a text_delta's text to "text" (a thinking_delta's
        to "thinking", a signature_delta's to "signature"), input_json pieces to the "input" read at the
        block's end, a citation to "citations". A delta of another kind is refused: dropped, what it carried
        would be missing from the block on every later turn, and the model would not be told."""
        if kind == "input_json_delta":
            self.json.add(_partial_json(self._model, delta, mask))
        elif kind == "citations_delta":
            self.citations.append(_citation(self._model, delta, mask))
        elif isinstance(kind, str) and kind in _APPENDED:
            field = _APPENDED[kind]
            piece = delta.get(field)
            if not isinstance(piece, str):
                shown = excerpt(piece, mask)
                raise malformed(self._model, f"a {kind} whose {field} is not a string: {shown}")
            if field not in self.strings:
                given = self.start.get(field, "")
                if not isinstance(given, str):
                    shown = excerpt(self.type, mask, 50)
                    what = f"a {kind} for block {self.index}, a {shown} block whose {field} is not a string"
                    raise malformed(self._model, what)
                self.strings[field] = StreamText(self._model, f"block {self.index}'s {field}")
                self.strings[field].add(given)
            self.strings[field].add(piece)
        else:
            raise _delta_not_kept(self._model, self.index, self.type, kind, mask)

    def arguments(self) -> dict[str, Any] | str | None:
        """The call's input: its input_json pieces, else the input its start held (not both); text that
        is not a JSON object stays text (the tool answers the model that its arguments are not valid).
        None: no input came (not one piece, and an empty input in the start)."""
        if not self.stopped:
            # Pieces may be missing: the call would run with what came (defaults for the rest).
            raise malformed(
                self._model, f"a tool_use block (block {self.index}) without its content_block_stop"
            )
        raw = self.json.text()
        if not raw.strip():
            if self.json.came:
                # Empty input_json pieces are how the API streams an input of {}: the model sent {}.
                return call_arguments(self.input, json.dumps(self.input))
            # No piece at all: the start's empty input is only the API's placeholder for the pieces, which
            # did not come (a proxy dropping them would run every call on its defaults).
            return call_arguments(self.input, json.dumps(self.input)) if self.input else None
        if self.input:
            raise malformed(
                self._model,
                f"a tool_use block (block {self.index}) with an input in its start and input_json pieces",
            )
        try:
            decoded = read_json(raw)
        except ValueError:
            return raw
        return call_arguments(decoded, raw)


def _add_delta(
    model: str, blocks: dict[int, _Block], payload: dict[str, Any], delta: dict[str, Any], mask: Mask
) -> str | None:
    """Add a content_block_delta to its block; the text it adds (None: it adds none)."""
    index = json_index(model, payload.get("index"), 0, mask)
    kind = delta.get("type")
    piece = delta.get("text")
    if kind == "text_delta" and not isinstance(piece, str):
        raise malformed(model, f"a text delta that is not a string: {excerpt(piece, mask)}")
    block = blocks.get(index)
    if block is None or block.stopped:
        # Pieces of a block not started (or ended) would be lost, and the call run without them.
        where = "before its content_block_start" if block is None else "after its content_block_stop"
        raise malformed(model, f"a content_block_delta for block {index} {where}")
    block.added = block.added or adds_to_answer(delta)
    if block.type not in _MODELED:
        block.keep(kind, delta, mask)
        return None  # not the turn's text (`AssistantMessage.content`), which is its text blocks'
    if kind == "text_delta":
        if block.type != "text":
            raise malformed(model, f"a text delta for block {index}, a {excerpt(block.type, mask, 50)} block")
        assert isinstance(piece, str)
        shown = block.text.add(piece)
        return shown if shown or not piece else None  # None: half a surrogate pair, held for the next
    if kind == "input_json_delta":
        partial = _partial_json(model, delta, mask)
        if block.type == "text":
            raise malformed(model, f"an input_json delta for block {index}, a text block")
        block.json.add(partial)
    elif kind == "citations_delta" and block.type == "text":
        block.citations.append(_citation(model, delta, mask))
    return None


def _partial_json(model: str, delta: dict[str, Any], mask: Mask) -> str:
    """An input_json_delta's piece of input."""
    partial = delta.get("partial_json")
    if not isinstance(partial, str):
        # Skipped, it could leave the other pieces valid JSON without an argument the model sent: the tool
        # would run on its default for it.
        raise malformed(
            model, f"an input_json delta whose partial_json is not a string: {excerpt(partial, mask)}"
        )
    return partial


def _citation(model: str, delta: dict[str, Any], mask: Mask) -> dict[str, Any]:
    """A citations_delta's citation."""
    citation = delta.get("citation")
    if not isinstance(citation, dict):
        # Kept, it would be sent back on every later turn, which the API would refuse.
        shown = excerpt(citation, mask)
        raise malformed(model, f"a citations_delta whose citation is not an object: {shown}")
    return citation


# The deltas that add text to a field of a block (`_Block.keep`), the field named as in the delta.
_APPENDED = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}


def _delta_not_kept(model: str, index: int, block_type: str, kind: Any, mask: Mask) -> ModelError:
    """The error for a delta `_Block.keep` cannot add to its block: refused rather than dropped, since the
    block would go back to the model on every later turn without it (and the journal keeps it so)."""
    what = f"a delta of the type {excerpt(kind, mask, 50)}" if kind is not None else "a delta without a type"
    return ModelError(
        f"model {model!r} sent {what} for block {index}, a {excerpt(block_type, mask, 50)} block: bide keeps "
        "a block of a type it does not model as it came, to send it back on later turns, and does not know "
        "how this delta adds to it (the block would go back without what it carried); nothing was "
        "journaled: run again to retry, and if the model keeps sending such deltas, leave the feature that "
        "makes such blocks (a server tool, a beta) out of extra_body, or use a version of bide that knows "
        "them"
    )


def _block_type(name: str, index: int, block: dict[str, Any], mask: Mask) -> str:
    """A content block's type (`index`: its place in the turn). A block without one (absent, null, empty or
    not a string) is not the API's shape: left out, the turn would be journaled, and sent back on later
    turns, without a part the model gave."""
    kind = block.get("type")
    if isinstance(kind, str) and kind:
        return kind
    if kind is None:
        what = "without a type"
    elif kind == "":
        what = "whose type is empty"
    else:
        what = f"whose type is not a string: {excerpt(kind, mask, 100)}"
    raise malformed(name, f"a content block (block {index}) {what}")


def _check_kept(name: str, index: int, block: dict[str, Any], mask: Mask) -> None:
    """Refuse a block kept as it came whose "input" (a server tool's, say) is not an object: the API takes
    a tool's input as an object only, and would refuse the block, sent back, on every later turn. Streamed
    or whole, the same block is refused alike."""
    given = block.get("input", {})
    if not isinstance(given, dict):
        what = f"a {excerpt(block['type'], mask, 50)} block (block {index})"
        raise malformed(name, f"{what} whose input is not an object: {excerpt(given, mask)}")


def _too_many_blocks(name: str) -> ModelError:
    """The error for a turn with more than `MAX_CONTENT_BLOCKS` content blocks (the rest is not read)."""
    return ModelError(
        f"model {name!r} sent more than {MAX_CONTENT_BLOCKS:,} content blocks in one turn, bide's limit; "
        "nothing was journaled, run again to retry"
    )


def _blank_message(kind: str, request: ModelRequest, blank: Message) -> ConfigError:
    """The error for a user message that is empty or only white space, which the API refuses (a 400, "text
    content blocks must be non-empty"), raised before any request. A run's input (or a thread's message) is
    journaled with the first turn that answers it: one that is the request's last message is new, and
    nothing is journaled; one that any message follows is in the journal already (another model answered
    it), and no new message can replace it."""
    users = [m for m in request.messages if m.role == "user"]
    position = next(i for i, m in enumerate(users) if m is blank)
    what = "empty" if not blank.content else "only white space"
    refusal = f"which the Anthropic API refuses (a text block must hold text), so {kind} sent nothing"
    if request.messages[-1] is blank:
        return ConfigError(
            f"run {request.run_id!r}: the message it was sent is {what}, {refusal} and nothing was "
            "journaled: send a message with some text (the run's input, or the thread's message)"
        )
    return ConfigError(
        f"run {request.run_id!r}: user message {position + 1} of {len(users)} in its conversation is {what} "
        f"(the run's input, or a thread's message, journaled when another model answered it), {refusal}; "
        f"the journal keeps it as it is, so the run cannot go on with {kind}: continue this conversation "
        "with that model, or start a new one and cancel this run "
        f"(`bide cancel {shlex.quote(request.run_id)}`, or bide.cancel_run)"
    )


# The content block types the adapter reads into a turn's text and calls (thinking is refused beside calls
# and dropped before an answer, see `_judge`). A turn holding any other keeps its blocks as they came.
_MODELED = frozenset({"text", "tool_use", "thinking", "redacted_thinking"})


def _kept(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A turn's `AssistantMessage.blocks`: its content blocks as they came (thinking left out), each one's
    keys in the journal's order (the same bytes live and replayed), when one of them is of a type the
    adapter does not model (a server tool's ``server_tool_use`` and ``web_search_tool_result``, say);
    else none, the turn being its text and calls."""
    if all(block["type"] in _MODELED for block in blocks):  # (each type a string: see `_block_type`)
        return []
    return [journal_order(block) for block in blocks]


def _as_sent(message: AssistantMessage) -> list[dict[str, Any]]:
    """The content of a turn with `blocks`, sent back as it came, in its order: its tool_use blocks made
    from its calls (their ids, made up where the model gave none, are those its results answer), a text
    block that is empty or only white space left out (the API refuses it), any other block as it came."""
    calls = iter(message.tool_calls)
    sent: list[dict[str, Any]] = []
    for block in message.blocks:
        kind = block.get("type")
        if kind == "tool_use":
            call = next(calls, None)
            if call is not None:
                sent.append(_tool_use(call))
        elif kind != "text" or (isinstance(block.get("text"), str) and block["text"].strip()):
            sent.append(block)
    sent.extend(_tool_use(call) for call in calls)
    return sent


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _input(call.arguments)}


def _input(arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A tool call's arguments as the API's `input` object (raw text that is not one goes under "raw";
    none at all is the empty object), its keys sorted at every depth as the journal gives them back: the
    same bytes live and replayed, so a resumed or continued conversation is sent as it was."""
    if isinstance(arguments, dict):
        return dict(journal_order(arguments))
    if not arguments:
        return {}
    try:
        decoded = call_arguments(read_json(arguments), arguments)
    except ValueError:
        decoded = arguments
    return dict(journal_order(decoded)) if isinstance(decoded, dict) else {"raw": arguments}


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    counts = [raw.get(k) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")]
    out = raw.get("output_tokens")
    if not isinstance(out, int) or isinstance(out, bool):
        return None
    inp = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
    return Usage(input_tokens=max(inp, 0), output_tokens=max(out, 0))


def _thinks(kind: Any) -> bool:
    """Whether a block of this type is extended thinking, which the API needs back (signed) with the results
    of the turn's calls."""
    return kind in ("thinking", "redacted_thinking")


_MAX_TOKENS = "max_tokens (AnthropicModel(max_tokens=...))"


def _judge(
    name: str, reason: str, text: str, has_calls: bool, thinking: bool, ends: frozenset[str], mask: Mask
) -> None:
    """Raise ModelError for a turn that must not be journaled as it came (a final answer ends the run for
    good): paused, stopped by the safety filter, tool calls cut off (at max_tokens, or at the model's
    context window: their input may be missing or cut short, and an argument left out runs the tool on its
    default), cut off before it wrote anything, stopped for tools without one, a stop reason not known
    (neither tools, a cut-off nor one of `ends`), or thinking blocks beside tool calls. "" (a whole answer
    that gave none) is an answer."""
    if reason == "pause_turn":
        raise ModelError(
            f"model {name!r} paused its turn (stop reason 'pause_turn': a server tool, such as web search, "
            "ran long), which bide cannot continue (it does not send a paused turn back); nothing was "
            "journaled: run again to ask again, or leave server tools out of extra_body"
        )
    if reason == "refusal":
        raise filtered(name, reason) if has_calls else filtered_answer(name, reason, text, mask)
    if reason == "max_tokens":
        if has_calls:
            raise cut_off(name, reason, _MAX_TOKENS)
        if not text:
            raise nothing_written(name, reason, _MAX_TOKENS)
    elif reason == "model_context_window_exceeded":
        if has_calls or not text:
            what = (
                "in a turn with tool calls, whose input may be missing or cut short; none was run and"
                if has_calls
                else "before it wrote any answer;"
            )
            raise ModelError(
                f"model {name!r} stopped at its context window (stop reason {reason!r}) {what} nothing was "
                "journaled: shorten the conversation (smaller tool results, a shorter system prompt) or use "
                "a model with a larger context window, then run again"
            )
    elif reason == "tool_use":
        if not has_calls:
            raise no_calls_after_all(name, reason)
    elif reason and reason not in ends:
        raise unknown_end(name, "stop reason", reason, mask)
    if thinking and has_calls:
        # bide journals a turn's text and calls only: the next request could not send the thinking blocks
        # back, and the API refuses a tool result without them (a 400 on the next turn).
        raise ModelError(
            f"model {name!r} answered with thinking blocks beside tool calls: extended thinking with tools "
            "is not supported yet (the API needs the thinking blocks sent back with the tools' results, and "
            "bide's journal does not keep them); nothing was journaled: turn thinking off in extra_body for "
            "an agent with tools, then run again"
        )


def _calls(ids: list[str], named: list[tuple[str, dict[str, Any] | str]]) -> list[ToolCall]:
    """The tool calls of a judged answer (see `_judge`), with an id each (`ids`: "" where the answer gave
    none)."""
    return [
        ToolCall(id=call_id, name=tool, arguments=arguments)
        for call_id, (tool, arguments) in zip(made_up_ids(ids, "toolu_"), named, strict=True)
    ]


def _parse(
    name: str, data: Any, tools: Sequence[ToolSpec], ends: frozenset[str], mask: Mask
) -> AssistantMessage:
    if not isinstance(data, dict) or not isinstance(data.get("content"), list):
        raise ModelError(f"model {name!r} returned a response without a content list")
    text: list[str] = []
    ids: list[str] = []
    named: list[tuple[str, dict[str, Any] | str]] = []
    thinking = False
    for position, block in enumerate(data["content"]):
        if position == MAX_CONTENT_BLOCKS:
            raise _too_many_blocks(name)
        if not isinstance(block, dict):
            # Not the API's shape: skipping it would journal an answer the model did not give.
            raise malformed(name, f"a content block that is not an object: {excerpt(block, mask)}")
        kind = _block_type(name, position, block, mask)
        if len(named) >= MAX_TOOL_CALLS and kind == "tool_use":
            raise too_many_calls(name)
        if kind == "text":
            if not isinstance(block.get("text"), str):
                # Not the API's shape: skipping it would journal an answer the model did not give.
                said = excerpt(block.get("text"), mask)
                raise malformed(name, f"a text block whose text is not a string: {said}")
            text.append(block["text"])
        elif kind == "tool_use":
            tool = json_name(name, block.get("name"), "name", mask)
            args = block.get("input")
            if args is None:  # absent or null: not {}, on which the tool would run with its defaults
                arguments: dict[str, Any] | str = absent_arguments(tools, tool)
            else:
                arguments = call_arguments(args, json.dumps(args))
            ids.append(json_name(name, block.get("id"), "id", mask))
            named.append((tool, arguments))
        elif _thinks(kind):
            thinking = True
        elif kind not in _MODELED:
            _check_kept(name, position, block, mask)
    reason = data.get("stop_reason")
    finish = reason if isinstance(reason, str) else ""
    _judge(name, finish, "".join(text), bool(named), thinking, ends, mask)
    return AssistantMessage(
        content="".join(text),
        tool_calls=_calls(ids, named),
        usage=_usage(data.get("usage")),
        finish_reason=finish,
        blocks=_kept([block for block in data["content"] if not _thinks(block.get("type"))]),
    )
