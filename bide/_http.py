"""What the HTTP model adapters share: one pooled client per model, retries through `RetryPolicy` honouring
`Retry-After`, error messages, and a server-sent-events reader.

The pooled `httpx.AsyncClient` belongs to the event loop it was made on: `Agent.run_sync` runs each call on a
fresh loop, so a client whose loop is gone (closed, or another one) is dropped and a new one made.

httpx is imported where it is used, not with the module: `import bide` (and every CLI start) does not pay
for it unless an HTTP model makes a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import ConfigError, ModelError
from ._retry import RetryPolicy
from ._telemetry import LOGGER

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_RESPONSE_BYTES", "TRANSIENT", "HTTPModel", "parse_retry_after"]

TRANSIENT = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


def parse_retry_after(headers: httpx.Headers, now: Callable[[], float] = time.time) -> float | None:
    """Seconds a server asked to wait: `retry-after-ms`, else `Retry-After` as seconds or an HTTP date."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - now())


def read_json(text: str | bytes) -> Any:
    """`json.loads(text)`; a text nested too deeply for Python's parser raises the ValueError any other
    unreadable text raises (not a RecursionError), so one `except ValueError` covers every bad answer."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def error_message(text: str) -> str:
    """The human part of an error body (`{"error": {"message": ...}}` in both APIs), else the text."""
    try:
        data = read_json(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return str(err["message"])
        if isinstance(err, str):
            return err
    except ValueError:
        pass
    return text or "(empty body)"


class TransientStatus(ModelError):
    """A retryable HTTP answer (429, 5xx, ...); `retry_after` is the server's hint in seconds."""

    def __init__(self, message: str, *, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(message, status=status, body=body)
        self.retry_after = retry_after


class RequestTimeout(ModelError):
    """No whole answer within the model's `timeout` (retryable, like httpx's own timeouts)."""


@dataclass(slots=True)
class _Pool:
    client: httpx.AsyncClient
    loop: asyncio.AbstractEventLoop


class HTTPModel:
    """The HTTP machinery of a model adapter (subclasses build bodies and parse answers)."""

    name: str
    api_key: str
    base_url: str
    temperature: float | None
    extra_body: dict[str, Any]
    provider: str = ""
    timeout: float
    retry: RetryPolicy
    # What each adapter names: the prefix of its environment variables (<_env>_API_KEY, <_env>_BASE_URL), its
    # default base URL, and a model name for the error message of a missing one.
    _env: str = ""
    _default_url: str = ""
    _example_model: str = ""

    def _init_http(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        retry: RetryPolicy | None,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        temperature: float | None,
        extra_body: dict[str, Any] | None,
        transport: httpx.AsyncBaseTransport | None,
        limits: httpx.Limits | None,
    ) -> None:
        """The set-up every adapter shares: its parameters of the same names (see `bide.OpenAIModel`)."""
        if not model:
            kind = type(self).__name__
            raise ConfigError(f"{kind} needs a model name, e.g. {kind}({self._example_model!r})")
        self.name = model
        self.api_key = api_key if api_key is not None else os.environ.get(f"{self._env}_API_KEY", "")
        self.base_url = (base_url or os.environ.get(f"{self._env}_BASE_URL") or self._default_url).rstrip("/")
        self.temperature = temperature
        self.extra_body = dict(extra_body or {})
        self.timeout = timeout
        self.retry = retry or RetryPolicy(attempts=max_retries + 1, initial=backoff, maximum=max_backoff)
        self._transport = transport
        self._limits = limits
        self._pool: _Pool | None = None
        self.clients_made = 0

    def _with_options(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with the optional `temperature` and the `extra_body` fields (which win) added."""
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    # -- the pooled client ---------------------------------------------------------------------------------

    def client(self) -> httpx.AsyncClient:
        """This model's pooled client for the running event loop (made on first use, reused after)."""
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is not None and pool.loop is loop and not pool.client.is_closed:
            return pool.client
        # None yet, closed, or made on another (finished) loop, whose connections cannot be used here.
        import httpx

        limits = self._limits or httpx.Limits(max_connections=100, max_keepalive_connections=20)
        client = httpx.AsyncClient(timeout=self.timeout, transport=self._transport, limits=limits)
        self._pool = _Pool(client, loop)
        self.clients_made += 1
        return client

    async def aclose(self) -> None:
        """Close the pooled client (a later call makes a new one)."""
        pool, self._pool = self._pool, None
        if pool is not None and pool.loop is asyncio.get_running_loop():
            await pool.client.aclose()

    async def __aenter__(self) -> HTTPModel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- requests ------------------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _url(self) -> str:
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> bool | float:
        """The retry verdict for a failed attempt (logged: a retry at INFO)."""
        import httpx

        if isinstance(exc, TransientStatus):
            verdict: bool | float = True if exc.retry_after is None else exc.retry_after
            why = f"HTTP {exc.status}"
        elif isinstance(exc, (httpx.TransportError, RequestTimeout)):
            verdict, why = True, f"{type(exc).__name__}: {exc}"
        else:
            return False
        if LOGGER.isEnabledFor(20):
            hint = "" if verdict is True else f" (the server asks to wait {float(verdict):g}s)"
            LOGGER.info(
                "model %s: %s; retrying%s",
                self.name,
                why,
                hint,
                extra={
                    "model": self.name,
                    "http_status": getattr(exc, "status", None),
                    "retry_after": verdict,
                },
            )
        return verdict

    def _refuse(self, response: httpx.Response, text: str) -> ModelError:
        status = response.status_code
        if status in TRANSIENT:
            return TransientStatus(
                f"HTTP {status}: {error_message(text)}",
                status=status,
                body=text,
                retry_after=parse_retry_after(response.headers),
            )
        return ModelError(
            f"model {self.name!r} at {self._url()} answered {status}: {error_message(text)}; this is not "
            "retried (check the model name, API key and request)",
            status=status,
            body=text,
        )

    def _exhausted(self, exc: Exception) -> ModelError:
        last = str(exc) if isinstance(exc, TransientStatus) else f"{type(exc).__name__}: {exc}"
        LOGGER.warning(
            "model %s: giving up after %d attempts: %s",
            self.name,
            self.retry.attempts,
            last,
            extra={"model": self.name, "http_status": getattr(exc, "status", None)},
        )
        return ModelError(
            f"model {self.name!r} at {self._url()} failed after {self.retry.attempts} attempts: {last}; "
            "nothing was journaled, run again to retry",
            status=getattr(exc, "status", None),
            body=getattr(exc, "body", None),
        )

    async def _post(self, body: dict[str, Any]) -> Any:
        """POST `body` and return the decoded JSON answer, retrying what may be retried. The whole request
        is bounded by `timeout`, and the answer is read as it arrives, refused past `MAX_RESPONSE_BYTES`."""
        import httpx

        url, headers = self._url(), self._headers()

        async def attempt() -> bytes:
            client = self.client()
            async with self._deadline():
                response = await client.send(
                    client.build_request("POST", url, json=body, headers=headers), stream=True
                )
                try:
                    if response.status_code != 200:
                        raise self._refuse(response, await _error_text(response))
                    return await _read_capped(response, self.name)
                finally:
                    await response.aclose()

        try:
            content = await self.retry.run(attempt, self._classify)
        except (TransientStatus, RequestTimeout, httpx.TransportError) as exc:
            raise self._exhausted(exc) from exc
        try:
            return read_json(content)
        except ValueError as exc:
            raise ModelError(f"model {self.name!r} answered 200 with a body that is not JSON: {exc}") from exc

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[None]:
        """Bound what runs inside by `timeout` in total: httpx's own timeout bounds each network read, so a
        server sending a byte now and then would hold a request forever under it alone."""
        try:
            async with asyncio.timeout(self.timeout):
                yield
        except TimeoutError:
            raise RequestTimeout(f"no answer within the model's timeout of {self.timeout:g}s") from None

    async def _open_stream(self, body: dict[str, Any]) -> httpx.Response:
        """Send a streaming request and return the response once it answered 200 (retrying like `_post`);
        the caller reads and closes it."""
        import httpx

        url, headers = self._url(), self._headers()

        async def attempt() -> httpx.Response:
            client = self.client()
            async with self._deadline():
                response = await client.send(
                    client.build_request("POST", url, json=body, headers=headers), stream=True
                )
                if response.status_code == 200:
                    return response
                try:
                    text = await _error_text(response)
                finally:
                    await response.aclose()
            raise self._refuse(response, text)

        try:
            return await self.retry.run(attempt, self._classify)
        except (TransientStatus, RequestTimeout, httpx.TransportError) as exc:
            raise self._exhausted(exc) from exc


async def _read_capped(response: httpx.Response, name: str) -> bytes:
    """The whole body, read as it arrives and refused once it passes `MAX_RESPONSE_BYTES` (counted after
    any content decoding, so a compressed bomb is refused too): never held whole first."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _too_large(name)
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _too_large(name)
        parts.append(chunk)
    return b"".join(parts)


_ERROR_BODY_BYTES = 64 * 1024


async def _error_text(response: httpx.Response) -> str:
    """The start of a refusal's body (enough for its message; the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        parts.append(chunk)
        size += len(chunk)
        if size >= _ERROR_BODY_BYTES:
            break
    return b"".join(parts)[:2000].decode("utf-8", "replace")


def _too_large(name: str) -> ModelError:
    return ModelError(
        f"model {name!r}: the answer is larger than {MAX_RESPONSE_BYTES // 2**20} MiB, bide's limit; it was "
        "not read further and nothing was journaled"
    )


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _lines(response: httpx.Response, name: str) -> AsyncIterator[str]:
    """The lines of an event stream (ended by CRLF, LF or CR), decoded as UTF-8. Bytes are counted as they
    arrive, so a stream past `MAX_RESPONSE_BYTES` is refused even if it never ends a line (httpx's own
    line reader would hold such a line whole)."""
    size = 0
    line: list[bytes] = []  # the pieces of the line not ended yet
    after_cr = False  # the last chunk ended with CR: a LF opening the next one belongs to it
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _too_large(name)
        if after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        start = 0
        for end in _LINE_END.finditer(chunk):
            line.append(chunk[start : end.start()])
            yield b"".join(line).decode("utf-8", "replace")
            line = []
            start = end.end()
        if start < len(chunk):
            line.append(chunk[start:])
        after_cr = chunk.endswith(b"\r")
    # A last line without its end is incomplete: dropped, like an event without its blank line.


async def sse_events(response: httpx.Response, name: str) -> AsyncIterator[tuple[str, str]]:
    """The (event, data) pairs of a server-sent-events body (`event` is "" when the server names none). A
    connection that breaks mid-stream raises ModelError: nothing of the turn is journaled, run again."""
    import httpx

    event = ""
    data: list[str] = []
    try:
        async for line in _lines(response, name):
            if not line:
                if data:
                    yield event, "\n".join(data)
                event, data = "", []
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
        # An event not ended by a blank line is incomplete: dropped (the caller sees its stream had no end).
    except httpx.TransportError as exc:
        raise ModelError(
            f"model {name!r}: the stream broke off ({type(exc).__name__}: {exc}); nothing was journaled, run "
            "again to retry"
        ) from exc


def json_object(value: Any) -> dict[str, Any]:
    """`value` if the server sent a JSON object there, else an empty one: an optional part of an answer in
    another shape reads as absent (what the turn needs is checked by the caller)."""
    return value if isinstance(value, dict) else {}


def json_list(value: Any) -> list[Any]:
    """`value` if the server sent a JSON array there, else an empty one (see `json_object`)."""
    return value if isinstance(value, list) else []


def json_index(name: str, value: Any, default: int) -> int:
    """A stream's block or call index: a JSON integer (`default` when absent); anything else raises
    ModelError, since pieces of a tool call could not be put together without it."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return value
    raise malformed(name, f"a stream piece with the index {value!r}")


def malformed(name: str, what: str) -> ModelError:
    """The error for an answer whose shape is not the API's (a part a turn needs is missing or wrong)."""
    return ModelError(f"model {name!r} sent {what}; nothing was journaled, run again to retry")


def json_event(name: str, data: str) -> Any:
    try:
        return read_json(data)
    except ValueError as exc:
        raise ModelError(
            f"model {name!r} streamed an event that is not JSON: {data[:200]!r}; nothing was journaled, run "
            "again to retry"
        ) from exc


def unfinished(name: str) -> ModelError:
    return ModelError(
        f"model {name!r}: the stream ended before the turn did; nothing was journaled, run again to retry"
    )
