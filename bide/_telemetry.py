"""Logging and OpenTelemetry tracing of runs, model calls and tool calls.

Logging: the "bide" logger (a `NullHandler` is attached, so nothing is printed unless the application
configures logging). Levels: a run's start, resume and end at INFO; halts and failures at WARNING (a run
sleeping on a timer or driven elsewhere at INFO; an unexpected exception at ERROR, with its traceback);
model retries at INFO (WARNING when they run out); every model turn and tool call at DEBUG. Records carry
structured fields as attributes (`extra=`): `run_id`, `agent`, `turn`, `model`, `call_id`, `tool`,
`input_tokens`, `output_tokens`, `finish_reason`, `status`, `error_type`.

Tracing: when the application has set an OpenTelemetry tracer provider (`pip install bide[otel]`, then the
SDK's `trace.set_tracer_provider`), each run is an `invoke_agent {agent}` span, each model call a child
`chat {model}` span and each tool execution a child `execute_tool {tool}` span, with the attributes of the
OpenTelemetry GenAI semantic conventions (`gen_ai.operation.name`, `gen_ai.agent.name`,
`gen_ai.conversation.id` (the run id), `gen_ai.request.model`, `gen_ai.provider.name`,
`gen_ai.usage.input_tokens`/`output_tokens`, `gen_ai.response.finish_reasons`, `gen_ai.tool.name`,
`gen_ai.tool.call.id` (bide's call id), `error.type`) and bide's own (`bide.run.id`, `bide.run.status`,
`bide.turn`, `bide.call.id`, `bide.tool.attempt`). Spans are made current while they run, so spans of the
application's own instrumentation (an HTTP client inside a tool, say) nest under them.

What it costs when nobody listens: opentelemetry is never imported by bide; if the application imported it
but set no provider, a run pays one provider lookup. With logging below INFO and no provider, a run pays a
level check and one small object, a model call or tool call one context-variable read.
"""

from __future__ import annotations

import logging
import sys
import time
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from ._errors import BideError, RunHalted, RunInFlight

__all__ = ["LOGGER", "model_call", "run_failed", "run_loaded", "run_watch", "tool_call"]

LOGGER = logging.getLogger("bide")
LOGGER.addHandler(logging.NullHandler())

_DEBUG = logging.DEBUG
_INFO = logging.INFO
_WARNING = logging.WARNING

# The watch of the run this task is driving, when someone listens (None otherwise).
_CURRENT: ContextVar[_RunWatch | None] = ContextVar("bide_run_watch", default=None)
# (provider, tracer) of the last tracer provider seen.
_TRACER: list[Any] = [None, None]


def _tracer() -> Any:
    """The tracer of the application's tracer provider, or None when no provider is set (cheaply: bide never
    imports opentelemetry itself)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    if _TRACER[0] is not provider:
        _TRACER[1] = provider.get_tracer("bide")
        _TRACER[0] = provider
    return _TRACER[1]


def _attach(span: Any) -> Any:
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(span))


def _detach(token: Any) -> None:
    from opentelemetry import context

    context.detach(token)


def _error(span: Any, exc: BaseException, *, status: bool = True) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", type(exc).__qualname__)
    span.record_exception(exc)
    if status:
        span.set_status(Status(StatusCode.ERROR, str(exc)[:500]))


class _RunWatch:
    """One run as logging and tracing see it."""

    __slots__ = ("agent", "logs", "run_id", "span", "started", "token", "tracer", "var")

    def __init__(self, agent: str, run_id: str, model: str, tracer: Any, logs: bool) -> None:
        self.agent = agent
        self.run_id = run_id
        self.tracer = tracer
        self.logs = logs
        self.started = time.monotonic()
        self.span: Any = None
        self.token: Any = None
        if tracer is not None:
            from opentelemetry.trace import SpanKind

            self.span = tracer.start_span(
                f"invoke_agent {agent}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": agent,
                    "gen_ai.conversation.id": run_id,
                    "gen_ai.request.model": model,
                    "bide.run.id": run_id,
                },
            )
            self.token = _attach(self.span)
        self.var = _CURRENT.set(self)

    def _fields(self, **more: Any) -> dict[str, Any]:
        return {"run_id": self.run_id, "agent": self.agent, **more}

    def _close(self) -> None:
        _CURRENT.reset(self.var)
        if self.token is not None:
            _detach(self.token)
            self.token = None

    def loaded(self, turns: int, resumed: bool) -> None:
        if self.span is not None:
            self.span.set_attribute("bide.run.resumed", resumed)
        if self.logs and LOGGER.isEnabledFor(_INFO):
            if resumed:
                LOGGER.info(
                    "run %s resumed (%d turns journaled)",
                    self.run_id,
                    turns,
                    extra=self._fields(turn=turns, status="resumed"),
                )
            else:
                LOGGER.info("run %s started", self.run_id, extra=self._fields(turn=0, status="started"))

    def finished(self, result: Any) -> None:
        self._close()
        usage = result.usage
        if self.span is not None:
            span = self.span
            span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            span.set_attribute("bide.run.status", result.status)
            span.set_attribute("bide.run.replayed", result.replayed)
            span.set_attribute("bide.run.turns", result.turns)
            span.end()
        if self.logs and LOGGER.isEnabledFor(_INFO):
            how = (
                "replayed from the journal"
                if result.replayed
                else f"in {time.monotonic() - self.started:.3f}s"
            )
            LOGGER.info(
                "run %s %s after %d turns (%s; %d input + %d output tokens)",
                self.run_id,
                result.status,
                result.turns,
                how,
                usage.input_tokens,
                usage.output_tokens,
                extra=self._fields(
                    status=result.status,
                    turn=result.turns,
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    replayed=result.replayed,
                ),
            )

    def failed(self, exc: BaseException) -> None:
        self._close()
        if isinstance(exc, RunHalted):
            status = exc.status
            level = _INFO if status == "sleeping" else _WARNING
            what = "halted"
        elif isinstance(exc, RunInFlight):
            status, level, what = "in_flight", _INFO, "not driven"
        elif isinstance(exc, BideError):
            status, level, what = "failed", _WARNING, "failed"
        elif isinstance(exc, Exception):
            status, level, what = "failed", logging.ERROR, "failed unexpectedly"
        else:  # cancelled, interrupted
            status, level, what = "interrupted", _INFO, "interrupted"
        if self.span is not None:
            self.span.set_attribute("bide.run.status", status)
            _error(self.span, exc, status=level != _INFO)
            self.span.end()
        if LOGGER.isEnabledFor(level):
            LOGGER.log(
                level,
                "run %s %s: %s",
                self.run_id,
                what,
                # A cancellation says nothing of itself ("run r interrupted: " was all the log had).
                str(exc) or f"{type(exc).__name__} (the drive was cancelled or interrupted)",
                exc_info=exc if level == logging.ERROR else None,
                extra=self._fields(status=status, error_type=type(exc).__qualname__),
            )


class _QuietRun(_RunWatch):
    """How the failure of a run nobody listens to below WARNING is logged: no span, no INFO logs."""

    __slots__ = ()

    def __init__(self, agent: str, run_id: str) -> None:
        self.agent = agent
        self.run_id = run_id
        self.span = None
        self.token = None
        self.logs = False

    def _close(self) -> None:
        pass


def run_watch(agent: Any, run_id: str) -> _RunWatch | None:
    """Called when a drive starts: the run's span (made current) and its logging; None when nobody listens
    below WARNING (then `run_failed` still logs a failure)."""
    tracer = _tracer()
    logs = LOGGER.isEnabledFor(_INFO)
    if tracer is None and not logs:
        return None
    return _RunWatch(agent.name, run_id, str(getattr(agent.model, "name", "")), tracer, logs)


def run_failed(watch: _RunWatch | None, agent: str, run_id: str, exc: BaseException) -> None:
    """Called when a drive raises: ends the run's span and logs the halt or failure."""
    (watch or _QuietRun(agent, run_id)).failed(exc)


def run_loaded(journal: Any) -> None:
    """Called once the drive holds the lease and has loaded the journal: logs the start or the resume."""
    watch = _CURRENT.get()
    if watch is None or watch.run_id != journal.run_id:
        return
    turns = 0
    while journal.has(f"model:{turns}"):
        turns += 1
    watch.loaded(turns, journal.has("run:start"))


class _ModelWatch:
    __slots__ = ("model", "run", "span", "started", "token", "turn")

    def __init__(self, run: _RunWatch, model: Any, turn: int) -> None:
        self.run = run
        self.turn = turn
        self.model = str(getattr(model, "name", ""))
        self.started = time.monotonic()
        self.span: Any = None
        self.token: Any = None
        if run.tracer is not None:
            from opentelemetry.trace import SpanKind

            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": self.model,
                "gen_ai.conversation.id": run.run_id,
                "bide.run.id": run.run_id,
                "bide.turn": turn,
            }
            provider = getattr(model, "provider", None)
            if isinstance(provider, str):
                attributes["gen_ai.provider.name"] = provider
            base_url = getattr(model, "base_url", None)
            if isinstance(base_url, str):
                parts = urlsplit(base_url)
                if parts.hostname:
                    attributes["server.address"] = parts.hostname
                    attributes["server.port"] = parts.port or (443 if parts.scheme == "https" else 80)
            self.span = run.tracer.start_span(
                f"chat {self.model}", kind=SpanKind.CLIENT, attributes=attributes
            )
            self.token = _attach(self.span)

    def finished(self, reply: Any) -> None:
        if self.token is not None:
            _detach(self.token)
        usage = getattr(reply, "usage", None)
        reason = getattr(reply, "finish_reason", "")
        calls = getattr(reply, "tool_calls", ())
        if self.span is not None:
            span = self.span
            if usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if isinstance(reason, str) and reason:
                span.set_attribute("gen_ai.response.finish_reasons", [reason])
            span.end()
        if LOGGER.isEnabledFor(_DEBUG):
            LOGGER.debug(
                "run %s: model %s answered turn %d with %d tool calls (finish_reason %r, %s tokens) in %.3fs",
                self.run.run_id,
                self.model,
                self.turn,
                len(calls) if isinstance(calls, list) else 0,
                reason,
                "?" if usage is None else f"{usage.input_tokens}+{usage.output_tokens}",
                time.monotonic() - self.started,
                extra=self.run._fields(
                    turn=self.turn,
                    model=self.model,
                    finish_reason=reason,
                    input_tokens=None if usage is None else usage.input_tokens,
                    output_tokens=None if usage is None else usage.output_tokens,
                ),
            )

    def failed(self, exc: BaseException) -> None:
        if self.token is not None:
            _detach(self.token)
        if self.span is not None:
            _error(self.span, exc)
            self.span.end()
        if LOGGER.isEnabledFor(_DEBUG):
            LOGGER.debug(
                "run %s: model %s failed on turn %d: %s",
                self.run.run_id,
                self.model,
                self.turn,
                exc,
                extra=self.run._fields(turn=self.turn, model=self.model, error_type=type(exc).__qualname__),
            )


def model_call(model: Any, request: Any) -> _ModelWatch | None:
    """Called before a model call of a run: its span (made current while it runs) and its DEBUG log; None
    when nobody listens."""
    run = _CURRENT.get()
    if run is None or (run.tracer is None and not LOGGER.isEnabledFor(_DEBUG)):
        return None
    return _ModelWatch(run, model, request.turn)


class _ToolWatch:
    __slots__ = ("ctx", "ended", "run", "span", "started", "token")

    def __init__(self, run: _RunWatch, tool: Any, ctx: Any) -> None:
        self.run = run
        self.ctx = ctx
        self.ended = False
        self.started = time.monotonic()
        self.span: Any = None
        self.token: Any = None
        if run.tracer is not None:
            from opentelemetry.trace import SpanKind

            self.span = run.tracer.start_span(
                f"execute_tool {ctx.tool}",
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": ctx.tool,
                    "gen_ai.tool.call.id": ctx.call_id,
                    "gen_ai.tool.type": "function",
                    "bide.run.id": ctx.run_id,
                    "bide.call.id": ctx.call_id,
                    "bide.tool.attempt": ctx.attempt,
                    "bide.tool.safety": str(getattr(getattr(tool, "safety", None), "value", "")),
                },
            )
            self.token = _attach(self.span)
        if LOGGER.isEnabledFor(_DEBUG):
            LOGGER.debug(
                "run %s: call %s (%s) started",
                ctx.run_id,
                ctx.call_id,
                ctx.tool,
                extra=self.run._fields(call_id=ctx.call_id, tool=ctx.tool, attempt=ctx.attempt),
            )

    def _end(self, exc: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        if self.token is not None:
            _detach(self.token)
        if self.span is not None:
            if exc is not None:
                _error(self.span, exc)
            self.span.end()
        if LOGGER.isEnabledFor(_DEBUG):
            ctx = self.ctx
            took = time.monotonic() - self.started
            args: tuple[Any, ...]
            if exc is None:
                msg = "run %s: call %s (%s) returned in %.3fs"
                args = (ctx.run_id, ctx.call_id, ctx.tool, took)
            else:
                msg = "run %s: call %s (%s) raised %s in %.3fs: %s"
                args = (ctx.run_id, ctx.call_id, ctx.tool, type(exc).__qualname__, took, exc)
            LOGGER.debug(
                msg,
                *args,
                extra=self.run._fields(
                    call_id=ctx.call_id,
                    tool=ctx.tool,
                    attempt=ctx.attempt,
                    error_type=None if exc is None else type(exc).__qualname__,
                ),
            )

    def failed(self, exc: BaseException) -> None:
        self._end(exc)

    def done(self) -> None:
        self._end(None)


def tool_call(tool: Any, ctx: Any) -> _ToolWatch | None:
    """Called when a tool's function is about to run for a call of a run: its span and DEBUG logs; None when
    nobody listens."""
    run = _CURRENT.get()
    if run is None or (run.tracer is None and not LOGGER.isEnabledFor(_DEBUG)):
        return None
    return _ToolWatch(run, tool, ctx)
