"""Tools: typed Python functions the model may call, with a declared safety.

Safety decides what a crash can do to a call:

- `SideEffect` (the default): at most once. An attempt marker is journaled before the call; a marker without
  a result on resume halts the run with `OutcomeUnknown`.
- `Idempotent`: retried freely after a crash; the tool receives a stable idempotency key per call to pass to
  its provider, so the provider deduplicates.
- `ReadOnly`: changes nothing; re-runs freely.

A tool may carry a `retry` policy (`bide.RetryPolicy`): a `ReadOnly` or `Idempotent` tool is tried again on
any exception but `ToolError` (a known failure, which the model sees). A side effect is tried again only
when the attempt provably did not start: the tool raised `NotCalled`, an exception it declares in
`not_started`, or its window closed before it could start. Each try of a side effect is its own claimed
attempt (marker, call, not-started record); see the agent module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import hashlib
import inspect
import json
import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, overload

import pydantic
from pydantic import AliasChoices, BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._canonical import checked_json_text, json_text
from ._deadline import DEADLINE_PASSED, ended_by_deadline, run_with_deadline
from ._errors import ConfigError, NotCalled
from ._inflight import CallWindow
from ._messages import ToolSpec
from ._retry import RetryPolicy
from ._telemetry import tool_call
from ._when import seconds

__all__ = [
    "AttemptInfo",
    "CallContext",
    "Idempotent",
    "ReadOnly",
    "Safety",
    "SideEffect",
    "Tool",
    "current_call",
    "idempotency_key_for",
    "tool",
]

DEFAULT_TIMEOUT = 60.0
_RESERVED_NAMES = {"final_answer"}
_INJECTED = "idempotency_key"


class Safety(enum.Enum):
    """How a tool may be retried after a crash. Declare it honestly: the guarantee depends on it."""

    SIDE_EFFECT = "side_effect"
    IDEMPOTENT = "idempotent"
    READ_ONLY = "read_only"

    @property
    def retry_safe(self) -> bool:
        """True for ReadOnly and Idempotent: no attempt marker, re-run after a crash."""
        return self is not Safety.SIDE_EFFECT


SideEffect = Safety.SIDE_EFFECT
Idempotent = Safety.IDEMPOTENT
ReadOnly = Safety.READ_ONLY


@dataclass(slots=True)
class CallContext:
    """The call a tool is running for. `idempotency_key` is stable across every retry of this call
    (same run id and call id), and is journaled with the result. `attempt` counts side-effect attempts."""

    run_id: str
    call_id: str
    tool: str
    idempotency_key: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """What a reconciler is told about a call whose outcome is unknown. Times are Unix seconds."""

    run_id: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    attempted_at: float
    deadline: float
    attempt: int


_CURRENT: ContextVar[CallContext | None] = ContextVar("bide_current_call", default=None)

#: The tools of the current drive that swallowed its caller's cancellation (see `Agent._drive`).
CANCEL_SWALLOWED: ContextVar[list[str] | None] = ContextVar("bide_cancel_swallowed", default=None)


def current_call() -> CallContext:
    """The `CallContext` of the tool call running in this task; ConfigError outside a tool call."""
    ctx = _CURRENT.get()
    if ctx is None:
        raise ConfigError("bide.current_call() is only available inside a tool called by a bide agent")
    return ctx


def idempotency_key_for(run_id: str, call_id: str) -> str:
    """The stable idempotency key of a call: ``bide-`` + SHA-256 hex of the run id and call id."""
    h = hashlib.sha256(f"bide.idem.v1\0{run_id}\0{call_id}".encode()).hexdigest()
    return f"bide-{h[:40]}"


Reconciler = Callable[[AttemptInfo], Any]


class Tool:
    """A tool the model can call. Build one with `@bide.tool`, or directly from an argument model::

        Tool(name="charge", description="Charge a card", args=ChargeArgs, fn=charge, safety=bide.SideEffect)

    With `args=`, `fn` receives the validated model instance (`fn(args)`); with `Tool.from_function` (what
    `@bide.tool` uses) it receives the fields as keyword arguments. `fn` may be sync (run in a worker thread)
    or async (cancelled at `timeout`). `timeout` (seconds) also bounds how long a call may run, which is how
    long `resolve_halt` waits before it may decide a lost call (see docs/guarantee.md).

    `gate` (a `bide.Gate`) is consulted before every call; `reconcile(AttemptInfo)` may return a
    `bide.Outcome` for a side-effect call whose outcome was lost, or None when it cannot tell.

    `not_started` names exception types that prove a side effect was not performed (for example
    `ConnectionRefusedError`, raised before anything was sent): like `NotCalled`, they void the attempt
    instead of halting the run. `retry` (a `bide.RetryPolicy`) tries a call again within the drive: a
    `ReadOnly`/`Idempotent` tool on any exception but `ToolError`, a side effect only when the attempt
    provably did not start (`NotCalled` or a `not_started` type).
    """

    def __init__(
        self,
        *,
        name: str,
        description: str,
        args: type[BaseModel],
        fn: Callable[..., Any],
        safety: Safety = SideEffect,
        gate: Any = None,
        reconcile: Reconciler | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        not_started: tuple[type[BaseException], ...] = (),
        _unpack: bool = False,
        _inject_key: bool = False,
    ) -> None:
        if (
            not isinstance(name, str)
            or not name
            or len(name) > 64
            or not all(c.isalnum() or c in "_-" for c in name)
        ):
            raise ConfigError(f"tool name must be 1-64 letters, digits, '_' or '-', got {name!r}")
        if name in _RESERVED_NAMES:
            raise ConfigError(f"tool name {name!r} is reserved")
        if not (isinstance(args, type) and issubclass(args, BaseModel)):
            raise ConfigError(f"tool {name!r}: args must be a pydantic model class")
        if not isinstance(safety, Safety):
            raise ConfigError(
                f"tool {name!r}: safety must be bide.SideEffect, bide.Idempotent or bide.ReadOnly"
            )
        if not callable(fn):
            raise ConfigError(f"tool {name!r}: fn must be callable")
        timeout = seconds(f"tool {name!r}: timeout", timeout, zero=False)
        if gate is not None and not callable(getattr(gate, "check", None)):
            raise ConfigError(f"tool {name!r}: gate must have a check(request) method (see bide.Gate)")
        if reconcile is not None and not callable(reconcile):
            raise ConfigError(f"tool {name!r}: reconcile must be callable")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"tool {name!r}: retry must be a bide.RetryPolicy")
        if isinstance(not_started, type):
            not_started = (not_started,)
        if not (
            isinstance(not_started, tuple)
            and all(isinstance(t, type) and issubclass(t, Exception) for t in not_started)
        ):
            raise ConfigError(f"tool {name!r}: not_started must be a tuple of exception types")
        for t in not_started:
            if issubclass(TimeoutError, t):
                raise ConfigError(
                    f"tool {name!r}: not_started cannot hold {t.__name__}: it covers TimeoutError, and a "
                    "call that timed out may have acted; name narrower types (ConnectionRefusedError, ...)"
                )
        self.name = name
        self.description = description
        self.args = args
        self.fn = fn
        self.safety = safety
        self.gate = gate
        self.reconcile = reconcile
        self.timeout = float(timeout)
        self.retry = retry
        self.not_started = not_started
        self._unpack = _unpack
        # The argument model's field names, read once (pydantic answers `model_fields` of a class through
        # a descriptor, on every call).
        self._fields = tuple(args.model_fields)
        self._inject_key = _inject_key
        # An object whose __call__ is async (a client, say) is as async as a coroutine function: it runs in
        # the event loop, where cancelling the drive cancels it before its effect (not in a thread).
        self._is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        # An argument model that keeps pydantic's own `model_validate` is validated by calling what that
        # method calls, its schema validator, without the method's Python wrapper (half of a small model's
        # validation time); one that overrides it is validated through its override.
        validate = getattr(args.model_validate, "__func__", None)
        self._own_validate = validate is not getattr(BaseModel.model_validate, "__func__", None)
        self._known = _argument_names(args)
        try:
            schema = args.model_json_schema()
        except Exception as exc:
            raise ConfigError(f"tool {name!r}: cannot derive a JSON schema for its arguments: {exc}") from exc
        if self._known is not None:
            schema.setdefault("additionalProperties", False)  # the model is told what validation refuses
        self.spec = ToolSpec(name=name, description=description, parameters=schema)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        safety: Safety = SideEffect,
        gate: Any = None,
        reconcile: Reconciler | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        not_started: tuple[type[BaseException], ...] = (),
    ) -> Tool:
        """Build a tool from a typed function: its parameters become the argument schema, its docstring the
        description. A parameter named ``idempotency_key`` is not shown to the model; bide passes the call's
        stable key in it."""
        tool_name = name or fn.__name__
        sig = inspect.signature(fn)
        try:
            hints = inspect.get_annotations(fn, eval_str=True)
        except Exception as exc:
            raise ConfigError(f"tool {tool_name!r}: cannot resolve its type annotations: {exc}") from exc
        fields: dict[str, Any] = {}
        inject = False
        for pname, param in sig.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ConfigError(f"tool {tool_name!r}: *args/**kwargs cannot be described to a model")
            if pname == _INJECTED:
                inject = True
                continue
            if pname not in hints:
                raise ConfigError(f"tool {tool_name!r}: parameter {pname!r} needs a type annotation")
            default = ... if param.default is param.empty else param.default
            fields[pname] = (hints[pname], default)
        model = pydantic.create_model(
            f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = inspect.getdoc(fn) or ""
        desc = description if description is not None else doc.split("\n\n")[0].strip() or tool_name
        return cls(
            name=tool_name,
            description=desc,
            args=model,
            fn=fn,
            safety=safety,
            gate=gate,
            reconcile=reconcile,
            timeout=timeout,
            retry=retry,
            not_started=not_started,
            _unpack=True,
            _inject_key=inject,
        )

    def validate(self, arguments: dict[str, Any] | str) -> BaseModel:
        """Validate the model's arguments; raises ToolArgumentsInvalid with a message for the model.

        Strictly, as the JSON they are: a value is never converted to the declared type on the way in
        (`true`, `"500"` or `500.0` for an `int`, `"nan"` for a `float` are refused), so a tool runs only
        on what the model sent. Text stands for what JSON can only write as text (a datetime, a UUID, a
        Decimal, an enum's value). An `args` model that overrides `model_validate` decides for itself."""
        if isinstance(arguments, str):
            raise ToolArgumentsInvalid(f"arguments must be a JSON object, got {arguments[:200]!r}")
        if self._own_validate:
            try:
                return self.args.model_validate(arguments)
            except ValidationError as exc:
                raise self._invalid(exc) from None
        known = self._known
        if known is not None:
            unknown = [key for key in arguments if key not in known]
            if unknown:
                raise ToolArgumentsInvalid(
                    f"invalid arguments for tool {self.name!r}: "
                    + "; ".join(f"{key}: Extra inputs are not permitted" for key in unknown)
                )
        try:
            text = json_text(arguments).encode()
        except UnicodeEncodeError:
            raise ToolArgumentsInvalid(
                f"invalid arguments for tool {self.name!r}: they hold a lone UTF-16 surrogate, which is not "
                "Unicode text"
            ) from None
        except (TypeError, ValueError, RecursionError):
            raise ToolArgumentsInvalid(
                f"invalid arguments for tool {self.name!r}: they are not plain JSON values"
            ) from None
        try:
            validated: BaseModel = self.args.__pydantic_validator__.validate_json(text, strict=True)
            return validated
        except ValidationError as exc:
            raise self._invalid(exc) from None

    def _invalid(self, exc: ValidationError) -> ToolArgumentsInvalid:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}" for e in exc.errors()
        )
        return ToolArgumentsInvalid(f"invalid arguments for tool {self.name!r}: {problems}")

    def json_arguments(self, validated: BaseModel, sent: Any = None) -> dict[str, Any]:
        """Validated arguments as JSON values, the same in every process: what a gate's digest and an
        attempt marker record. A set is dumped in its hash order, which differs between processes (string
        hashes are salted per process), so a set's elements are sorted (by their JSON text): a call
        approved in one process is the same call in the next.

        They must be the very arguments the tool is called with: a dump that leaves one out (a field with
        `exclude=True`), masks it (`SecretStr`) or changes it (a serializer) would have approvers sign, and
        the marker record, another call than the one that runs. Such a tool raises `ConfigError` here,
        before any of it is recorded or called. (`sent`, the arguments `validated` was validated from: when
        the dump is exactly them and names every field, it holds every value already, and is not validated
        again to be sure.)"""
        # By field name, whatever the model's own serialization default: the keys `_in_stable_order` walks.
        dumped = validated.model_dump(mode="json", by_alias=False)
        stable: dict[str, Any] = _in_stable_order(validated, dumped)
        if sent is not None and stable == sent and len(stable) == len(type(validated).model_fields):
            return stable
        again = _validated_again(validated, stable)
        if again != validated:
            # A model whose fields are named by aliases (`from`, a Python keyword) takes its arguments by
            # those names: dumped by its field names, they would not be its arguments. Tried in this order,
            # the same in every process: its serialization names, then the names it validates by.
            by_alias = _in_stable_order(
                validated, validated.model_dump(mode="json", by_alias=True), by_alias=True
            )
            for candidate in (by_alias, _by_validation_names(type(validated), stable)):
                if _validated_again(validated, candidate) == validated:
                    stable, again = candidate, validated
                    break
        if again != validated:
            raise ConfigError(
                f"tool {self.name!r}: its arguments, as recorded ({_shown(stable)}), are not the ones it is "
                "called with: its arguments model leaves a value out of its dump (exclude=True), masks it "
                "(a Secret type) or changes it (a serializer). A side effect's and a gated call's "
                "arguments are journaled, shown to approvers and signed as they are: declare them as plain "
                "values (the model's own call, with every value, is journaled anyway)"
            )
        return stable

    async def invoke(self, validated: BaseModel, ctx: CallContext) -> Any:
        """Call the tool for one call (under its timeout) and return its JSON-ready result."""
        return await self._invoke(self._call_args(validated), ctx)

    def _call_args(self, validated: BaseModel) -> BaseModel | dict[str, Any]:
        """What the function is called with: its keyword arguments for a function tool (a plain dict, which
        the garbage collector does not track while it holds plain values), else the model itself."""
        if self._unpack:
            fields = self._fields if type(validated) is self.args else tuple(type(validated).model_fields)
            return {name: getattr(validated, name) for name in fields}
        return validated

    async def _invoke(
        self, args: BaseModel | dict[str, Any], ctx: CallContext, window: CallWindow | None = None
    ) -> Any:
        """`invoke` with the arguments `_call_args` made. With a `window` (a claimed side effect), the call
        starts only inside it and runs for the time left in it (else for `timeout`); NotCalled proves it
        never started."""
        if self._inject_key and isinstance(args, dict):
            args = {**args, _INJECTED: ctx.idempotency_key}
        token = _CURRENT.set(ctx)
        observed = tool_call(self, ctx)
        # The drive's task, and how many cancellations it holds: one more when the call ends, and the
        # caller cancelled the drive while the tool ran, which the tool swallowed (the deadline's own is
        # taken back by run_with_deadline before this looks).
        task = asyncio.current_task()
        entered = task.cancelling() if task is not None else 0
        try:
            if self._is_async:
                # Nothing of the tool runs until its coroutine is awaited, under the deadline.
                coroutine = self.fn(**args) if isinstance(args, dict) else self.fn(args)
                if window is None:  # an unclaimed call (a retry-safe tool's) starts now, with its timeout
                    # Inside a window of its own all the same: one that swallows its cancellation is closed.
                    own = CallWindow(self.name, "", time.monotonic() + self.timeout, time.monotonic)
                    inside = functools.partial(_inside, own, coroutine)
                    value = await run_with_deadline(_in_task_of_its_own(inside, coroutine), self.timeout)
                else:
                    # A claimed call: the deadline is set from the window's clock as it is armed, then the
                    # window is checked just before the tool's first step. A pause anywhere before that
                    # step ends in NotCalled, or in the cancellation at the tool's first await: never in
                    # a call given a fresh timeout after its marker's deadline.
                    started = functools.partial(_started_inside, window, coroutine)
                    claimed = _in_task_of_its_own(started, coroutine, window)
                    value = await run_with_deadline(claimed, window.remaining)
                _note_swallowed(task, entered, f"tool {self.name!r}")
                return journal_safe(self.name, value)
            if window is None:
                window = CallWindow(self.name, "", time.monotonic() + self.timeout, time.monotonic)
            if isinstance(args, dict):
                call: Callable[[], Any] = functools.partial(self.fn, **args)
            else:
                call = functools.partial(self.fn, args)
            value = await self._in_thread(call, window)
            if inspect.isawaitable(value):
                # The function handed back its real work: that starts only while the window is still open
                # (checked just before its first step, the deadline armed from the window's clock), as
                # for an async tool; the function itself ran, so a closed window leaves the outcome
                # unknown (TimeoutError), never "not started".
                awaited = functools.partial(_awaited_inside, window, value)
                value = await run_with_deadline(_in_task_of_its_own(awaited, value), window.remaining)
        except BaseException as exc:
            if isinstance(exc, Exception):
                _note_swallowed(task, entered, f"tool {self.name!r}")
            if observed is not None:
                observed.failed(exc)
            raise
        finally:
            if observed is not None:
                observed.done()
            _CURRENT.reset(token)
        _note_swallowed(task, entered, f"tool {self.name!r}")
        return journal_safe(self.name, value)

    async def _in_thread(self, call: Callable[[], Any], window: CallWindow) -> Any:
        """Run a sync tool in a worker thread, starting it only inside `window` (checked in the thread, when
        it really starts). If the window closes while the call is still queued for a thread, it is
        abandoned before it starts and that is proven with NotCalled (so a busy thread pool never turns into
        an unknown outcome). A started call that outlives the window keeps running (threads cannot be
        stopped): TimeoutError, and the window says when it finishes."""

        handoff = ThreadHandoff()

        def runner() -> Any:
            window.start()
            try:
                value = call()
            except BaseException as exc:
                window.finish(False, exc)
                if isinstance(exc, _CARRIED):
                    return _Escaped(exc)
                raise
            if inspect.isawaitable(value):
                # The function only made the awaitable, which the event loop awaits next: what the thread
                # returned is no outcome of the call (a drive that ends now leaves it unknown).
                window.finish(False, value)
            else:
                window.finish(True, value)
            return handoff.hand(value)

        window.threaded()
        left = window.remaining()
        if left <= 0:
            window.abandon()
            window.start()  # raises NotCalled: the window closed
        try:
            value = await asyncio.wait_for(asyncio.to_thread(runner), left)
        except TimeoutError:
            if window.abandon():
                raise NotCalled(
                    f"tool {self.name!r} waited {left:.3f}s for a worker thread and never started"
                ) from None
            handoff.abandon()
            raise
        except BaseException:
            window.abandon()  # cancelled: if it has not started, it never will
            handoff.abandon()
            raise
        if isinstance(value, _Escaped):
            if isinstance(value.exc, asyncio.CancelledError):
                raise _stray(self.name) from value.exc
            raise value.exc
        return value

    def __repr__(self) -> str:
        return f"<bide.Tool {self.name} safety={self.safety.value}>"


def journal_safe(tool: str, value: Any) -> Any:
    """A tool's return value as the JSON value its result record will hold.

    Pydantic models, dataclasses, dates and the like become JSON; anything without a JSON form becomes its
    `str`. A value that cannot be journaled at all (a lone surrogate in a string, bytes that are not UTF-8,
    a circular structure, NaN or an infinity) is never an exception here, because the call has happened:
    the result becomes a text that says so and carries the value's `ascii()` form, which is exact for
    strings, bytes and numbers.
    """
    try:
        # Text holds a lone surrogate only if it is not ASCII (which str knows without reading it): only such
        # text is encoded, to find out.
        if type(value) is str:
            if not value.isascii():
                value.encode("utf-8")
            return value
        value = to_jsonable_python(value, fallback=str)
        text = checked_json_text(value)  # the result record and the tool message reuse the text
        if not text.isascii():
            text.encode("utf-8")
        return value
    except (ValueError, TypeError, RecursionError, UnicodeError, PydanticSerializationError) as exc:
        reason = _why_unencodable(exc)
    except Exception as exc:  # the value's own __str__ (the fallback) raised: an object that cannot be shown
        reason = f"turning it into text raised {type(exc).__name__}"
    try:
        shown = ascii(value)
    except RecursionError:
        shown = "(too deeply nested to show)"
    except Exception:  # its __repr__ raises too
        shown = f"(a {type(value).__name__} that cannot be shown)"
    return f"tool {tool!r} returned a value that cannot be journaled as JSON ({reason}); its value: {shown}"


def _why_unencodable(exc: BaseException) -> str:
    if isinstance(exc, UnicodeError):
        return "a lone surrogate or bytes that are not UTF-8, which are not text"
    text = str(exc).lower()
    if "depth exceeded" in text or isinstance(exc, RecursionError):
        return "it is nested too deeply, or refers to itself"
    if "circular" in text:
        return "it refers to itself"
    if "utf-8" in text or "utf8" in text:
        return "it holds bytes that are not UTF-8 text"
    if "nan" in text or "infinity" in text or "out of range float" in text:
        return "it holds NaN or an infinity, which JSON cannot express"
    return str(exc) or type(exc).__name__


def _note_swallowed(task: asyncio.Task[Any] | None, entered: int, what: str) -> None:
    """Note, for the drive, that its caller's cancellation came while `what` ("tool 'charge'") ran and did
    not end it."""
    if task is not None and task.cancelling() > entered:
        swallowed = CANCEL_SWALLOWED.get()
        if swallowed is not None:
            swallowed.append(what)


async def run_apart(awaitable: Awaitable[Any], what: str) -> Any:
    """Await `awaitable`, the application's code that a drive awaits outside a tool call (a gate's decision,
    a reconciler's lookup), in an asyncio task of its own named as the drive's, and note a cancellation of
    the drive that it swallowed (returned, or raised an error of its own), for the drive to stop before
    acting on what it gave (`CANCEL_SWALLOWED`). A `CancelledError` it raised when nothing cancelled the
    drive is its own error (`StrayCancellation`), never taken for the caller's.

    Its own task, as for an async tool: a cancellation its code makes of that task (an `asyncio.TaskGroup`
    whose child failed, which Python 3.11 and 3.12 may leave counted) is not taken for the caller's. One
    that goes on waiting after the caller's cancellation is closed when its grace is over, as a tool is
    (`_ClosedAfterGrace`)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError(f"{what} must be awaited inside a task")
    entered = task.cancelling()
    waiting = _awaiting(awaitable)
    inner = _carrying(_ClosedAfterGrace(waiting, _Caller(task, entered), what))
    try:
        value = await asyncio.get_running_loop().create_task(inner, name=task.get_name())
    except asyncio.CancelledError:
        if task.cancelling() > entered:
            raise  # the caller's
        raise stray_cancellation(what) from None
    except Exception:
        _note_swallowed(task, entered, what)
        raise
    finally:
        # Cancelled before its task's first step, nothing of it ran: closed, with no "never awaited" warning.
        for never in (inner, waiting, awaitable):
            if inspect.iscoroutine(never) and inspect.getcoroutinestate(never) == inspect.CORO_CREATED:
                never.close()
    if isinstance(value, _Escaped):
        raise value.exc
    _note_swallowed(task, entered, what)
    return value


class _ClosedAfterGrace:
    """Await `coroutine`, application code a drive awaits outside a tool call (a gate, a reconciler), and
    close it at the await it is on if it goes on waiting `_CLEANUP_GRACE` seconds after its caller's
    cancellation reached it: one that takes back every cancellation would hold the drive, and the run's
    lease, for as long as it waits. The caller's cancellation then ends it (`_Closing.close`)."""

    __slots__ = ("caller", "coroutine", "what")

    def __init__(self, coroutine: Coroutine[Any, Any, Any], caller: _Caller, what: str) -> None:
        self.coroutine = coroutine
        self.caller = caller
        self.what = what

    def __await__(self) -> Generator[Any, Any, Any]:
        steps = self.coroutine.__await__()
        send, throw, caller = steps.send, steps.throw, self.caller
        closing = _Closing(caller)
        value: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    if error is None:
                        yielded = send(value)
                    else:
                        yielded = throw(error)
                        # It goes on waiting although its caller's cancellation reached it: its grace starts.
                        if isinstance(error, asyncio.CancelledError) and caller.cancelled():
                            closing.arm()
                except StopIteration as stop:
                    return stop.value
                try:
                    value, error = (yield yielded), None
                except BaseException as exc:
                    value, error = None, exc
                if closing.due():
                    closing.close(steps, self.what)
        finally:
            closing.disarm()


@dataclass(frozen=True, slots=True)
class _Caller:
    """The task that awaits an async tool's own task (the drive's), and its cancellation count when the
    call began: a cancellation of it, its caller's or its deadline's (which asyncio passes on to the task
    it awaits), is one from outside the tool. The tool's task may be cancelled by the tool's own code too
    (an asyncio.TaskGroup whose child failed cancels its parent task), which is no one else's doing."""

    task: asyncio.Task[Any]
    entered: int

    def cancelled(self) -> bool:
        """Whether it holds a cancellation from outside the tool that was not taken back."""
        return self.task.cancelling() > self.entered


async def _in_task_of_its_own(
    run: Callable[[_Caller], Coroutine[Any, Any, Any]],
    awaitable: Awaitable[Any],
    claim: CallWindow | None = None,
) -> Any:
    """Await `run(caller)`, which awaits an async tool's `awaitable`, in a task of its own, so that the
    tool's own cancellations of its task are told from its caller's and its deadline's (`_Caller`).

    For a claimed call (`claim`, its window), a window closed already, or one whose deadline passes
    before the task's first step (it starts at the event loop's next turn), is NotCalled: the tool never
    ran, as when the call waited for its marker's write past its deadline."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("an async tool must be awaited inside a task")
    entered = task.cancelling()
    inner = None
    try:
        if claim is not None and claim.remaining() <= 0:
            claim.start()  # raises NotCalled: the window closed before the call could start
        inner = run(_Caller(task, entered))
        # Named as the drive's task, so that log lines (taskName) from inside the tool still say whose it is.
        value = await asyncio.get_running_loop().create_task(_carrying(inner), name=task.get_name())
    except asyncio.CancelledError as exc:
        # The deadline's cancellation, alone, reached the task before its first step: never started,
        # provably. (With the caller's, that goes on as it is: the drive sees the window never started.)
        alone = task.cancelling() <= entered + 1
        if claim is not None and ended_by_deadline(exc) and alone and claim.abandon():
            raise NotCalled(
                f"tool {claim.tool!r} could not start inside its window: its deadline passed before the call "
                "could start"
            ) from None
        raise
    finally:
        # Never started (its window closed, or its task was cancelled before its first step), it never
        # awaited the tool's coroutine: closed, with no "never awaited" warning.
        for never in (inner, awaitable):
            if inspect.iscoroutine(never) and inspect.getcoroutinestate(never) == inspect.CORO_CREATED:
                never.close()
    if isinstance(value, _Escaped):
        raise value.exc
    return value


async def _carrying(awaitable: Awaitable[Any]) -> Any:
    """Await `awaitable`, handing a SystemExit or KeyboardInterrupt it raises back as a value: a task
    would let these out of the event loop, past the drive (ending every other run's drive in a worker);
    the drive raises them itself, as a sync tool's (`_Escaped`)."""
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:
        return _Escaped(exc)


async def _inside(window: CallWindow, awaitable: Awaitable[Any], caller: _Caller) -> Any:
    """Await an unclaimed call's `awaitable` inside its own `window` (`_InsideWindow`)."""
    return await _InsideWindow(window, awaitable, caller)


async def _started_inside(window: CallWindow, awaitable: Awaitable[Any], caller: _Caller) -> Any:
    """Await an async tool's `awaitable` only if its claimed `window` is still open now, right before its
    first step (NotCalled otherwise, nothing of it run), and resume it only while the window is open
    (`_InsideWindow`)."""
    try:
        window.start()
    except BaseException:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: no "was never awaited" warning
        raise
    return await _InsideWindow(window, awaitable, caller)


async def _awaited_inside(window: CallWindow, awaitable: Awaitable[Any], caller: _Caller) -> Any:
    """Await what a synchronous tool function returned only if its `window` is still open now, right before
    its first step (else TimeoutError: the function ran, what it handed back never started), and resume it
    only while the window is open (`_InsideWindow`)."""
    left = window.remaining()
    if left <= 0:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        raise TimeoutError(
            f"tool {window.tool!r} returned an awaitable that could not start inside its window: the "
            f"deadline its attempt marker recorded passed {-left:.3f} s before"
        )
    return await _InsideWindow(window, awaitable, caller)


class _InsideWindow:
    """Await a claimed call's `awaitable`, resuming it only while its `window` is open.

    The deadline's timer cancels the call, but after a pause (SIGSTOP, a frozen VM) or an event loop
    blocked by other work, asyncio first runs the steps that were ready before, and only then the timers
    that came due meanwhile: a tool waiting on a future that completed just before (an `await
    asyncio.sleep(0)`, a response that had arrived) would go on to its effect past its deadline, after
    another process had decided the call and called it again. So each step is checked against the window
    first; past it, the tool gets a `CancelledError` at the await it is on instead of what it waited for
    (once: its clean-up then runs as after any cancellation), and a `CancelledError` that ends it, with no
    one else cancelling the task, ends the call in TimeoutError, as at its deadline.

    A tool that swallows its cancellations and goes on waiting would hold its drive (and the run's lease)
    forever: `_CLEANUP_GRACE` seconds after its first cancellation (the deadline's, the caller's, or the
    cut above) it is closed at the await it is on (GeneratorExit there: its `finally` blocks run up to
    their first await). The call then ends as it was cancelled: in TimeoutError when only its deadline
    cancelled it, in CancelledError when the caller did."""

    __slots__ = ("awaitable", "caller", "window")

    def __init__(self, window: CallWindow, awaitable: Awaitable[Any], caller: _Caller) -> None:
        self.window = window
        self.awaitable = awaitable
        self.caller = caller

    def __await__(self) -> Generator[Any, Any, Any]:
        awaitable = self.awaitable
        # A coroutine is stepped directly; any other awaitable (a generator-based coroutine, an object whose
        # __await__ gives a plain iterator) through a coroutine that awaits it.
        coroutine = awaitable if inspect.iscoroutine(awaitable) else _awaiting(awaitable)
        steps = coroutine.__await__()
        send, throw, window = steps.send, steps.throw, self.window
        value: Any = None
        error: BaseException | None = None
        caller = self.caller
        cut_at = -1  # the caller's cancellation count when this wrapper cancelled the tool (-1: it has not)
        claimed = bool(window.claim)  # a side effect's attempt, not a retry-safe call's own window
        by_deadline = False  # its deadline's timer cancelled it (its own message says so)
        closing = _Closing(caller)
        try:
            while True:
                try:
                    if error is None:
                        yielded = send(value)
                    else:
                        # (Not the cut's own cancellation, which carries the same message.)
                        timer = cut_at < 0 and isinstance(error, asyncio.CancelledError)
                        # (The deadline's message on a future shared with another call whose own deadline
                        # passed is not this call's: its caller's task was not cancelled.)
                        ours = timer and ended_by_deadline(error) and caller.cancelled()
                        by_deadline = by_deadline or ours
                        yielded = throw(error)
                        # It goes on waiting: if its call is still cancelled (not only a task of its own that
                        # it awaited, nor by its own inner timeout, which took that back), its grace starts.
                        cancelled = by_deadline or cut_at >= 0 or caller.cancelled()
                        if cancelled and isinstance(error, asyncio.CancelledError):
                            closing.arm()
                except StopIteration as stop:
                    return stop.value
                except asyncio.CancelledError as exc:
                    if cut_at >= 0 and caller.task.cancelling() <= cut_at:
                        raise TimeoutError(
                            f"tool {window.tool!r} was past its deadline when it could go on (the process "
                            "was paused, or its event loop busy): it was cancelled there"
                        ) from None
                    if cut_at < 0 and not by_deadline and not caller.cancelled():
                        raise _stray(window.tool) from exc
                    raise
                except Exception as exc:
                    # Cancelled from outside the tool: cut here, by its deadline's timer (known by its
                    # message, even if the tool took the cancellation back with uncancel()), or by its
                    # caller (still counted); not by the tool's own inner timeout, which takes its
                    # cancellation back before the tool goes on.
                    outside = cut_at >= 0 or by_deadline or caller.cancelled()
                    if not (claimed and outside):
                        raise
                    # A side effect that, once cancelled, raised an error of its own (a client library
                    # wrapping the cancellation, say) ends as that cancellation: its claim (NotCalled, a
                    # declared not-started error) would void an attempt whose request had gone out, and
                    # the next try would fire it again.
                    if by_deadline or caller.task.cancelling() > max(caller.entered, cut_at):
                        # Its deadline's timer (run_with_deadline: TimeoutError) or the caller's.
                        raise asyncio.CancelledError(
                            f"tool {window.tool!r} raised {type(exc).__name__} once cancelled"
                        ) from exc
                    raise TimeoutError(
                        f"tool {window.tool!r} was cut off past its deadline and raised {type(exc).__name__}"
                    ) from exc
                try:
                    value, error = (yield yielded), None
                except BaseException as exc:
                    value, error = None, exc
                if closing.due():
                    closing.close(steps, f"tool {window.tool!r}")
                past = window.remaining() <= 0
                if past:
                    closing.arm()
                # A result, or an error of the tool's own, past the window: cancelled instead. A cancellation
                # (the deadline's timer, the caller's) or the coroutine being closed goes through as it is.
                if past and cut_at < 0 and (error is None or isinstance(error, Exception)):
                    cut_at = caller.task.cancelling()
                    value, error = None, asyncio.CancelledError(DEADLINE_PASSED)
        finally:
            closing.disarm()


_CLEANUP_GRACE = 1.0  # seconds a cancelled tool has to end before it is closed
_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution


class ThreadHandoff:
    """What a worker thread returns to an event loop that may stop waiting for it (cancelled, or out of
    time). A coroutine the thread returned that the loop never took is closed where it lands: the work it
    holds must not start after its caller gave up, and left to itself it would warn "never awaited" at
    some later garbage collection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._landed: Any = None

    def hand(self, value: Any) -> Any:
        """In the thread: `value`, which it returns next (closed first if the loop stopped waiting)."""
        with self._lock:
            if not self._abandoned:
                self._landed = value
                return value
        _close_unstarted(value)
        return value

    def abandon(self) -> None:
        """On the loop, when it stops waiting: close what the thread returned, or will return."""
        with self._lock:
            self._abandoned = True
            landed, self._landed = self._landed, None
        _close_unstarted(landed)


def _close_unstarted(value: Any) -> None:
    if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == inspect.CORO_CREATED:
        value.close()


@dataclass(frozen=True, slots=True)
class _Escaped:
    """An exception a sync tool raised in its thread that would not reach the drive as it is, carried to
    it as a value (`_CARRIED`)."""

    exc: BaseException


# wait_for runs a sync tool's thread in a task of its own, and a task lets SystemExit and KeyboardInterrupt
# out of the event loop, past the drive (ending every other run's drive in a worker): the drive raises them.
# A thread's CancelledError, asyncio's or concurrent.futures' (a future.result() on a cancelled future),
# would come out of the thread's future as asyncio's, and end the drive as if its caller had cancelled it.
_CARRIED = (SystemExit, KeyboardInterrupt, asyncio.CancelledError, concurrent.futures.CancelledError)


class StrayCancellation(Exception):
    """Internal: a `CancelledError` a tool raised of its own (it awaited a task of its own that it had
    cancelled, say) while nothing cancelled its call. It is the tool's error like any other (a side effect's
    outcome is unknown), never a cancellation of the drive: the drive's caller, which did not cancel it,
    would take a `CancelledError` for its own (`asyncio.gather`, a TaskGroup and `asyncio.run` do). A
    reconciler's is named in its halt; a gate's becomes a `ConfigError` (`stray_cancellation`)."""


def stray_cancellation(what: str) -> StrayCancellation:
    """The error of `what` ("the reconciler of tool 'charge'"), application code a drive awaits outside a
    tool call, that raised a `CancelledError` though nothing cancelled the drive."""
    return StrayCancellation(
        f"{what} raised CancelledError though nothing cancelled the drive (a task of its own that it "
        "cancelled and awaited, say)"
    )


def _stray(tool: str) -> StrayCancellation:
    return StrayCancellation(
        f"tool {tool!r} raised CancelledError though nothing cancelled the call (a task of its own that it "
        "cancelled and awaited, say)"
    )


class _Closing:
    """The clean-up grace of one cancelled call: `arm()` at its first cancellation sets a timer that wakes
    the task (by cancelling it) when the grace is over, so a tool waiting on a future that never completes
    is closed too; `due()` says the grace is over (and takes back the timer's cancellation)."""

    __slots__ = ("at", "caller", "fired", "task", "timer")

    def __init__(self, caller: _Caller) -> None:
        self.at = math.inf
        self.fired = False
        self.caller = caller
        self.task = asyncio.current_task()  # the tool's own task
        self.timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self.at < math.inf:
            return
        loop = asyncio.get_running_loop()
        self.at = loop.time() + _CLEANUP_GRACE
        self.timer = loop.call_at(self.at, self._wake)

    def _wake(self) -> None:
        self.timer = None
        if self.task is not None and not self.task.done():
            self.fired = True
            self.task.cancel()

    def due(self) -> bool:
        # asyncio runs a timer up to the clock's resolution early (15.6 ms on Windows): the wake that came
        # then is the grace's end, or no timer would be left to end it.
        loop = asyncio.get_running_loop()
        early = getattr(loop, "_clock_resolution", _CLOCK_RESOLUTION)
        if self.at == math.inf or loop.time() < self.at - early:
            return False
        self.disarm()
        if self.fired and self.task is not None:
            self.fired = False
            self.task.uncancel()
        return True

    def close(self, steps: Any, what: str) -> NoReturn:
        """Close the coroutine of `what` ("tool 'charge'") and end it as it was cancelled."""
        # GeneratorExit at its await: its finally blocks run (RuntimeError when it ignores that)
        with contextlib.suppress(Exception):
            steps.close()
        why = (
            f"{what} did not end within {_CLEANUP_GRACE:g}s of its cancellation (it swallowed it): it "
            "was closed at the await it was on"
        )
        if self.caller.cancelled():
            # Its deadline's timer (which run_with_deadline turns into TimeoutError) or the caller cancelled.
            raise asyncio.CancelledError(why)
        raise TimeoutError(why)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def _awaiting(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class ToolArgumentsInvalid(Exception):
    """Internal: the model's arguments failed validation; the message goes back to the model."""


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    safety: Safety = SideEffect,
    gate: Any = None,
    reconcile: Reconciler | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retry: RetryPolicy | None = None,
    not_started: tuple[type[BaseException], ...] = (),
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    safety: Safety = SideEffect,
    gate: Any = None,
    reconcile: Reconciler | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retry: RetryPolicy | None = None,
    not_started: tuple[type[BaseException], ...] = (),
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a typed function into a `Tool`: ``@bide.tool`` (a side effect) or
    ``@bide.tool(safety=bide.ReadOnly)``; see `Tool` for the other options."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(
            f,
            name=name,
            description=description,
            safety=safety,
            gate=gate,
            reconcile=reconcile,
            timeout=timeout,
            retry=retry,
            not_started=not_started,
        )

    if fn is not None:
        return wrap(fn)
    return wrap


def _argument_names(args: type[BaseModel]) -> frozenset[str] | None:
    """The argument names a model's call may hold: each field's name and aliases. None when the model takes
    other names itself (`extra="allow"`: they are kept, and dumped) or names a field by a path or choices
    of aliases (pydantic tells those apart itself). A model ignoring other names (pydantic's default) would
    drop one the model sent (`dry_run` for `dryrun`), and the call would run without it."""
    if args.model_config.get("extra") == "allow":
        return None
    by_name = bool(args.model_config.get("populate_by_name") or args.model_config.get("validate_by_name"))
    names: set[str] = set()
    for name, field in args.model_fields.items():
        if by_name or (field.alias is None and field.validation_alias is None):
            # A field with an alias is not filled by its name (pydantic drops a value sent so): refused.
            names.add(name)
        for alias in (field.alias, field.validation_alias):
            if isinstance(alias, str):
                names.add(alias)
            elif alias is not None:
                return None
    return frozenset(names)


def _shown(arguments: dict[str, Any]) -> str:
    text = json_text(arguments)
    return text if len(text) <= 200 else text[:200] + "..."


def _by_validation_names(model: type[BaseModel], dumped: dict[str, Any]) -> dict[str, Any]:
    """`dumped` (by field name) with each field's key the name the model validates it by: its validation
    alias (the first of its choices), else its alias, else its name."""
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if name not in dumped:
            continue
        key = field.validation_alias
        if isinstance(key, AliasChoices) and key.choices and isinstance(key.choices[0], str):
            key = key.choices[0]
        out[key if isinstance(key, str) else field.alias or name] = dumped[name]
    return out


def _validated_again(validated: BaseModel, dumped: dict[str, Any]) -> BaseModel | None:
    """`dumped` validated as the arguments of `validated`'s model (None when it is not valid)."""
    try:
        text = json_text(dumped)
        again: BaseModel = type(validated).__pydantic_validator__.validate_json(text, strict=True)
    except ValidationError:
        return None
    return again


def _in_stable_order(value: Any, dumped: Any, *, by_alias: bool = False) -> Any:
    """`dumped` (the JSON dump of `value`, `by_alias` or not) with every list dumped from a set or frozenset
    sorted by its elements' JSON text (keys sorted), at any depth (models, dicts, lists and tuples are
    walked in step with their dumps, which keep their order)."""
    if isinstance(value, (set, frozenset)) and isinstance(dumped, list):
        items = [_in_stable_order(v, d, by_alias=by_alias) for v, d in zip(value, dumped, strict=False)]
        return sorted(items, key=_sort_key)
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        for name, field in type(value).model_fields.items():
            key = (field.serialization_alias or field.alias or name) if by_alias else name
            if key in dumped:
                dumped[key] = _in_stable_order(getattr(value, name), dumped[key], by_alias=by_alias)
        return dumped
    if isinstance(value, dict) and isinstance(dumped, dict) and len(value) == len(dumped):
        for v, key in zip(value.values(), list(dumped), strict=True):
            dumped[key] = _in_stable_order(v, dumped[key], by_alias=by_alias)
        return dumped
    if isinstance(value, (list, tuple)) and isinstance(dumped, list):
        return [_in_stable_order(v, d, by_alias=by_alias) for v, d in zip(value, dumped, strict=False)]
    return dumped


def _sort_key(element: Any) -> str:
    return json.dumps(element, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
