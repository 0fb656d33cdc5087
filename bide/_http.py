"""What the HTTP model adapters share: one pooled client per model, retries through `RetryPolicy` honouring
`Retry-After`, error messages, bodies read and decoded within bounds, and a server-sent-events reader.

The pooled `httpx.AsyncClient` belongs to the event loop it was made on: `Agent.run_sync` runs each call on a
fresh loop, so a client whose loop is gone (closed, or another one) is dropped and a new one made.

httpx is imported where it is used, not with the module: `import bide` (and every CLI start) does not pay
for it unless an HTTP model makes a request.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import datetime
import email.utils
import functools
import io
import ipaddress
import itertools
import json
import math
import os
import re
import time
import urllib.parse
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ._canonical import utf8_text
from ._errors import ConfigError, ModelError
from ._messages import MAX_TOOL_CALLS, ToolSpec
from ._retry import RetryPolicy
from ._telemetry import LOGGER
from ._when import MAX_SECONDS, seconds

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ACCEPT_ENCODING",
    "MAX_RESPONSE_BYTES",
    "STREAM_TIMEOUT",
    "TRANSIENT",
    "HTTPModel",
    "StreamClock",
    "StreamText",
    "parse_retry_after",
]

TRANSIENT = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
MAX_RESPONSE_BYTES = 32 * 1024 * 1024
# What bide decodes itself (a bounded piece at a time, see `_Inflater`), and so all it asks for.
ACCEPT_ENCODING = "gzip, deflate"
# The default bound of a whole streamed answer: long answers take minutes, none should take ten.
STREAM_TIMEOUT = 600.0


def parse_retry_after(headers: httpx.Headers, now: Callable[[], float] = time.time) -> float | None:
    """Seconds a server asked to wait: `retry-after-ms`, else `Retry-After` as seconds or an HTTP date.
    None (the policy's own wait) for a value that is missing, unreadable or no finite number of seconds."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        with contextlib.suppress(ValueError):
            hint = _wait(float(ms) / 1000)
            if hint is not None:
                return hint
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return _wait(float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            # "-0000" (no zone said) reads as naive; an HTTP date is in GMT, never the local zone.
            when = when.replace(tzinfo=datetime.UTC)
        return _wait(when.timestamp() - now())
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        # A date no datetime holds (year 99999999999999999999): not a wait anyone can keep.
        return None


def _wait(seconds: float) -> float | None:
    """A server's wait as seconds from 0 (None for NaN or infinity, which say nothing)."""
    return max(0.0, seconds) if math.isfinite(seconds) else None


# The most JSON objects and arrays one text may open. The byte cap does not bound what decoding costs: under
# it, `[{},{},...]` (32 KiB of gzip) is 11 million dicts, about 830 MB. No model's answer comes near this;
# a brace or bracket inside a string counts too, which only matters to texts made of them.
MAX_JSON_CONTAINERS = 250_000
#: The most commas an answer may hold: a bound on the values it decodes to, far past what any model writes
#: (a million floats decode to some 32 MB; 32 MiB of ``[0.5,0.5,...`` would take over 500 MB).
MAX_JSON_SEPARATORS = 1_000_000


def read_json(text: str | bytes) -> Any:
    """`json.loads(text)`; a text nested too deeply for Python's parser, an object with a key twice, a text
    opening more than `MAX_JSON_CONTAINERS` objects and arrays, or one holding more than
    `MAX_JSON_SEPARATORS` commas raises the ValueError any other unreadable text raises (not a
    RecursionError, nor gigabytes of memory), so one `except ValueError` covers every bad answer."""
    opened = (
        text.count(b"{") + text.count(b"[") if isinstance(text, bytes) else text.count("{") + text.count("[")
    )
    if opened > MAX_JSON_CONTAINERS:
        raise ValueError(
            f"JSON opening {opened:,} objects and arrays, more than the {MAX_JSON_CONTAINERS:,} an answer "
            "may hold (decoded, they would take far more memory than its bytes)"
        )
    separators = text.count(b",") if isinstance(text, bytes) else text.count(",")
    if separators > MAX_JSON_SEPARATORS:
        raise ValueError(
            f"JSON holding {separators:,} commas, more than the {MAX_JSON_SEPARATORS:,} an answer may hold "
            "(its values, decoded, would take far more memory than its bytes)"
        )
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


class DuplicateKey(ValueError):
    """`read_json`'s error for an object with a key twice. The key is server text (it may quote the API
    key): it is in `key`, not in the message, and `json_problem` shows it masked."""

    def __init__(self, key: str) -> None:
        super().__init__("a JSON object with a key twice")
        self.key = key


def json_problem(exc: ValueError, mask: Mask) -> str:
    """What `read_json` (or decoding the text's UTF-8) found wrong, as an error message shows it: the
    API key masked (`mask`) in it, a key that came twice shown by `excerpt`."""
    if isinstance(exc, DuplicateKey):
        return f"a JSON object with the key {excerpt(exc.key, mask, 100)} twice"
    return shown_masked(str(exc), mask, _ROOT_SHOWN)


def call_arguments(decoded: Any, text: str) -> dict[str, Any] | str:
    """A tool call's arguments: `decoded` when it is an object whose numbers are all finite, else `text`,
    which the model is told is not valid arguments. JSON's reader takes NaN and Infinity, and 1e400 as an
    infinity, none of which the journal can hold: kept, they failed the whole turn, every time it was
    asked again, where arguments the model got wrong should go back to it."""
    if not isinstance(decoded, dict):
        return text
    todo: list[Any] = [decoded]
    while todo:
        value = todo.pop()
        if type(value) is float:
            if not math.isfinite(value):
                return text
        elif isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, list):
            todo.extend(value)
    return decoded


def journal_order(value: Any) -> Any:
    """`value` with the keys of every object in it sorted, at every depth, as the journal (canonical JSON)
    gives a value back. A request renders a journaled value (a tool call's arguments) from this, so it is
    the same byte for byte whether the turn is live or replayed after a crash, and a conversation's next
    request starts with the bytes of the last (which a provider's prompt cache needs)."""
    if isinstance(value, dict):
        return {key: journal_order(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [journal_order(item) for item in value]
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of two equal keys: arguments {"n": 1, "n": 2} would run a tool with n=2,
    # which the model may not have meant. Such JSON is refused, as unreadable JSON is.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def error_message(text: str) -> str:
    """The human part of an error body (`{"error": {"message": ...}}` in both APIs), else the text; a lone
    surrogate in it (JSON may escape one) is written as its escape, so the error can be printed and logged."""
    try:
        data = read_json(text)
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return utf8_text(err["message"])
        if isinstance(err, str):
            return utf8_text(err)
    except ValueError:
        pass
    return utf8_text(text) or "(empty body)"


def error_in(data: Any) -> str | None:
    """The server's message when a decoded answer is an error (`{"error": {"message": ...}}` in both APIs,
    or `{"error": "..."}`; an error object without a message is shown as its JSON), else None."""
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict) and err:
        said = err.get("message")
        # Whole: the caller masks the API key in it before it cuts it short.
        return utf8_text(said) if isinstance(said, str) and said else utf8_text(json.dumps(err))
    if isinstance(err, str) and err:
        return utf8_text(err)
    return None


# The most of the innermost exception behind a network failure that a message shows, and of the failure's own.
_ROOT_SHOWN = 500
_FAILURE_SHOWN = 2000


def failure(exc: BaseException, mask: Mask) -> str:
    """`exc` (a network failure, most often) as a message shows it: its type and text, then the innermost
    exception chained to it, which says what happened where its own text may not ("ConnectError: All
    connection attempts failed (ConnectionRefusedError: [Errno 111] Connect call failed ...)"). The API key
    is masked (`mask`) in what is shown of each part (see `shown_masked`): its own text to `_FAILURE_SHOWN`
    characters (httpx quotes what a server sent: a header line of 100 KB was a 100 KB message, and a log
    line at every retry), the innermost to `_ROOT_SHOWN`."""
    whole = _described(exc)
    said = cut_masked(whole, mask, _FAILURE_SHOWN)
    if isinstance(exc, RequestTimeout):
        # Its own words say what happened; behind it lies only what the timeout cut short (over HTTPS an
        # SSLWantReadError, anyio's ordinary read, which named TLS as the reason for every timeout).
        return said
    root = _innermost(exc)
    if root is exc:
        return said
    if isinstance(root, BaseExceptionGroup):  # every address of a host refused, say: each one's reason
        why = "; ".join(dict.fromkeys(_described(_innermost(e)) for e in root.exceptions))
    elif str(root) in whole:  # what it says is said already ("[Errno -2] Name or service not known")
        return said
    else:
        why = _described(root)
    return f"{said} ({shown_masked(why, mask, _ROOT_SHOWN)}{'...' if len(why) > _ROOT_SHOWN else ''})"


def _described(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _innermost(exc: BaseException) -> BaseException:
    """The last exception of `exc`'s chain (causes, else contexts), however it was raised: httpx and httpcore
    raise theirs `from None` over the OSError that says what happened."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ if exc.__cause__ is not None else exc.__context__
        if inner is None or id(inner) in seen or len(seen) > 50:
            return exc
        seen.add(id(inner))
        exc = inner


class TransientStatus(ModelError):
    """A retryable HTTP answer (429, 5xx, ...); `retry_after` is the server's hint in seconds."""

    def __init__(self, message: str, *, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(message, status=status, body=body)
        self.retry_after = retry_after


class RequestTimeout(ModelError):
    """No whole answer within the model's `timeout`, or a stream past its bounds (see `StreamClock`):
    retryable, like httpx's own timeouts, since nothing of the turn was journaled."""


@dataclass(slots=True)
class _Pool:
    client: httpx.AsyncClient
    loop: asyncio.AbstractEventLoop


def masked_url(url: str) -> str:
    """`url` with the credentials of its authority shown as ``***``: ``user:***@host`` for a user and
    password, ``***@host`` for a lone user name (often a token). The authority's user info runs to its
    last ``@``, as httpx reads it: a password may hold an ``@`` of its own."""
    scheme, sep, rest = url.partition("://")
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    end = min(ends, default=len(rest))
    userinfo, at, host = rest[:end].rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user + ':***' if colon else '***'}@{host}{rest[end:]}"


def env_proxy(url: str) -> str:
    """The proxy httpx sends a request for `url` through, as a message names it ("the proxy
    http://proxy:3128 (from HTTPS_PROXY)", its credentials left out), or "" for none. httpx (with
    `trust_env`, its default, and no transport given) reads HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY
    when a client is made: a proxy's failure read as the model server's without this."""
    chosen = _env_proxy_url(url)
    if chosen is None:
        return ""
    return f"the proxy {_without_credentials(chosen[1])} ({_proxy_setting(chosen[0])})"


def _env_proxy_url(url: str) -> tuple[str, str] | None:
    """The pattern httpx mounted the proxy of the environment for `url` at ("https://"), and its URL as
    given (credentials and all); None for none."""
    import httpx

    try:
        # httpx's own reading of the environment, and its choice among what it found (as its clients'
        # `_transport_for_url` chooses), so the proxy named is the one the request went through.
        from httpx._utils import URLPattern, get_environment_proxies
    except ImportError:  # a later httpx that moved them: the messages cannot name the proxy
        return None
    target = httpx.URL(url)
    mounts = sorted((URLPattern(key), proxy) for key, proxy in get_environment_proxies().items())
    chosen = next(((pattern, proxy) for pattern, proxy in mounts if pattern.matches(target)), None)
    if chosen is None or chosen[1] is None:  # no proxy, or NO_PROXY names the host
        return None
    return chosen[0].pattern, chosen[1]


def proxy_secrets(proxy: str) -> tuple[str, ...]:
    """What a proxy (`proxy`, its URL) may quote back of its own credentials, longest first: "user:password"
    as written in the URL and percent-decoded, the password both ways, and the base64 of "user:password"
    that httpx sends it in Proxy-Authorization. Empty for a proxy without a password."""
    import base64

    userinfo = re.split(r"[/?#]", proxy.partition("://")[2], maxsplit=1)[0].rpartition("@")[0]
    user, colon, password = userinfo.partition(":")
    if not colon or not password:
        return ()
    plain_user, plain_password = urllib.parse.unquote(user), urllib.parse.unquote(password)
    sent = base64.b64encode(f"{plain_user}:{plain_password}".encode()).decode("ascii")
    found = {userinfo, f"{plain_user}:{plain_password}", password, plain_password, sent}
    return tuple(sorted(found, key=len, reverse=True))


# The variables httpx reads a proxy from, as urllib reads them (lower case first).
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def unusable_proxy(kind: str, exc: Exception) -> ConfigError:
    """The error for a proxy setting of the environment that httpx failed to make a client with (`exc`):
    which variable, and what to change, without its value (httpx's own message quotes the part of a
    password before a '/': "Invalid port: 's3cr3t'")."""
    import httpx

    for name in _PROXY_VARIABLES:
        value = os.environ.get(name, "")
        if not value:
            continue
        try:
            httpx.AsyncClient(trust_env=False, proxy=value if "://" in value else f"http://{value}")
        except ImportError:
            return ConfigError(
                f"{kind}: the proxy in {name} is a SOCKS proxy, which httpx reaches only with the socksio "
                "package: install it (pip install 'httpx[socks]'), or set another proxy; the URL is not "
                "shown here"
            )
        except (httpx.InvalidURL, ValueError):
            return ConfigError(
                f"{kind}: httpx cannot read the proxy URL in {name}: percent-encode any '/', '#', '?', '@' "
                "or ':' in its user name or password (as %2F, %23, %3F, %40 and %3A), and give it an "
                "http:// or https:// scheme (socks5:// with httpx[socks]); the URL is not shown here"
            )
    if os.environ.get("no_proxy") or os.environ.get("NO_PROXY"):
        name = "no_proxy" if os.environ.get("no_proxy") else "NO_PROXY"
        return ConfigError(
            f"{kind}: httpx cannot read {name} ({type(exc).__name__}): write each host in it as a name, "
            "an IPv4 address or an IPv6 address without brackets and port (::1, not [::1]:8080), "
            "separated by commas"
        )
    return ConfigError(
        f"{kind}: httpx cannot make a client with the proxy settings of the environment "
        f"({type(exc).__name__}): check HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY"
    )


def _without_credentials(url: str) -> str:
    """`url`'s scheme, host and port: a proxy's user and password (and anything after its authority) left
    out."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{re.split(r'[/?#]', rest, maxsplit=1)[0].rpartition('@')[2]}"


def _proxy_setting(pattern: str) -> str:
    """Where the proxy httpx mounted at `pattern` ("https://", "all://") was set: the variable, as urllib
    reads it (lower case first)."""
    scheme = pattern.partition("://")[0]
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
        if os.environ.get(name):
            return f"from {name}"
    return "from the system's proxy settings"  # urllib reads them on Windows and macOS


def _same_host(url: str, default: str) -> bool:
    """Whether `url` is served by the host of `default` (a provider's API), however it is spelled: in
    another case, with its port, with the DNS root's trailing dot."""
    try:
        given, ours = urllib.parse.urlsplit(url), urllib.parse.urlsplit(default)
        port = given.port
    except ValueError:
        return False
    host = (given.hostname or "").rstrip(".")
    return host == ours.hostname and port in (None, 443 if ours.scheme == "https" else 80)


# What `_init_http` checks: a setting every request would fail on is refused when the model is made, not
# at each run with "run again to retry".


def _host(url: str) -> str:
    """The host of `url`, as written (an IPv6 address with its brackets): what stands between the user
    information (up to the last '@', as httpx reads it) and the port."""
    rest = url.partition("://")[2]
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[2]
    if authority.startswith("["):
        end = authority.find("]") + 1
        # Anything but a port after the brackets is part of a host that is not one (see `_is_host`).
        return authority[:end] if end and authority[end:end + 1] in ("", ":") else authority
    return authority.partition(":")[0]


# A label of a host name: what DNS, /etc/hosts and container networks answer for ("_" too: Docker Compose
# names services with it).
_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")
# What httpx reads as an IPv4 address (and refuses unless it is one): four numbers between dots.
_IPV4_STYLE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+")
# An IPv6 zone (RFC 6874: ``[fe80::1%25eth0]``): an interface's name or number.
_ZONE = re.compile(r"[A-Za-z0-9_.~-]+")


def _is_host(host: str) -> bool:
    """Whether `host` (from `_host`) is one a request can reach: an IPv6 address in brackets (with a zone,
    see `_zone_off_link`, or not), an IPv4 address, or a host name of at most 253 characters whose labels,
    between dots (one may end it), are letters, digits, "-" and "_"; a name in another script counts as its
    IDNA encoding, as httpx sends it, and a label opening with "xn--" must be such an encoding."""
    if host.startswith("["):
        address, percent, zone = host[1:].removesuffix("]").partition("%25")
        if not host.endswith("]") or (percent and not _ZONE.fullmatch(zone)):
            return False
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return False
        return True
    if _IPV4_STYLE.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    if not host.isascii():
        import idna  # httpx's own dependency, and its encoder of such names

        try:
            host = idna.encode(host.lower()).decode("ascii")
        except idna.IDNAError:
            return False
    name = host.removesuffix(".")
    if not (len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split("."))):
        return False
    # A label that opens with "xn--" is a name in another script, encoded: httpx decodes a host that opens
    # with one (and failed every request on one that is no such encoding: "xn--a", "xn--n3h" for a symbol
    # IDNA does not allow), and no registry hands out such a label anywhere in a name.
    return all(_is_encoded_label(label) for label in name.split(".") if label[:4].lower() == "xn--")


def _zone_off_link(host: str) -> bool:
    """Whether `host` (from `_host`, an address `_is_host` took) is an IPv6 address with a zone that is not
    link-local (fe80::/10): the resolver httpx hands the address to takes a zone on a link-local address
    only, so no request reaches ``[::1%25lo]`` or ``[fd00::2%25eth0]``."""
    if not (host.startswith("[") and "%" in host):
        return False
    address = host[1:].partition("%")[0]
    return not ipaddress.IPv6Address(address).is_link_local


def zone_for_httpx(url: str) -> str:
    """`url` with the zone of its IPv6 address written as RFC 6874 says (``[fe80::1%25eth0]``, "%25" the
    percent sign encoded) written as httpx hands it to the resolver, which connects to it
    (``[fe80::1%eth0]``): as written, the resolver found no such host, and every request failed."""
    host = _host(url)
    if not (host.startswith("[") and "%25" in host):
        return url
    scheme, sep, rest = url.partition("://")
    end = len(re.split(r"[/?#]", rest, maxsplit=1)[0])
    userinfo, at, host_and_port = rest[:end].rpartition("@")
    return f"{scheme}{sep}{userinfo}{at}{host_and_port.replace('%25', '%', 1)}{rest[end:]}"


def _is_encoded_label(label: str) -> bool:
    """Whether `label`, opening with "xn--", is the IDNA encoding of a name (as httpx decodes it)."""
    import idna

    try:
        idna.decode(label.lower())
    except (idna.IDNAError, UnicodeError):
        return False
    return True


def _temperature(kind: str, value: Any) -> float | None:
    """`value` if it is None or a finite number (NaN or infinity made every request body invalid JSON)."""
    try:
        if value is None or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ):
            return value
    except OverflowError:  # an integer past what a float holds (10**400)
        pass
    raise ConfigError(
        f"{kind} needs temperature, a finite number (such as 0.7), or None for the server's default; "
        f"not {value!r}"
    )


def _extra_body(kind: str, value: Any) -> dict[str, Any]:
    """A copy of `value`, a dict whose keys are strings and whose values JSON can carry as httpx sends
    them (finite numbers, text that is valid Unicode); {} for None."""
    if value is None:
        return {}
    wrong = (
        f"a {type(value).__name__}"
        if not isinstance(value, Mapping)
        else next((f"a dict with the key {key!r:.100}" for key in value if not isinstance(key, str)), "")
    )
    if wrong:
        # The values are not shown: extra fields may carry credentials of their own.
        raise ConfigError(
            f"{kind} needs extra_body, a dict of field names (strings) to JSON values added to every "
            f"request body, or None; not {wrong}"
        )
    fields = dict(value)
    try:
        # As httpx encodes a request body: without this, every request failed to encode.
        json.dumps(fields, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError is a ValueError
        raise ConfigError(
            f"{kind} needs extra_body to hold only JSON values (strings, finite numbers, booleans, None, "
            f"and lists and dicts of them), which every request body carries; it holds one that is not "
            f"({type(exc).__name__}: {exc!s:.200})"
        ) from None
    return fields


def _query(kind: str, value: Any) -> dict[str, str]:
    """A copy of `value`, the query parameters sent with every request: a dict of names (text, not empty)
    to values (text), all valid Unicode; {} for None."""
    if value is None:
        return {}
    wrong = f"a {type(value).__name__}" if not isinstance(value, Mapping) else ""
    copy = dict(value) if not wrong else {}  # (checked as copied: a subclass's items() may say otherwise)
    for name, given in copy.items():
        if not isinstance(name, str) or not name:
            wrong = f"a dict with the name {name!r:.100}"
        elif not isinstance(given, str):
            # The value is not shown: a gateway may take its key in the query.
            wrong = f"a dict whose {name!r:.100} is a {type(given).__name__}"
        else:
            try:
                (name + given).encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate: every request failed to encode
                wrong = f"a dict whose {name!r:.100} holds a lone surrogate"
        if wrong:
            break
    if wrong:
        raise ConfigError(
            f"{kind} needs query, a dict of parameter names to values, both strings (such as "
            f"{{'api-version': '2024-10-21'}}), sent with every request, or None; not {wrong}"
        )
    return copy


def _query_in_url(kind: str, url: str) -> ConfigError:
    """The error for a base_url holding '?' or '#' (`url` is not repeated: it may hold credentials). One in
    its user information (before the '@' of its authority) is a password to percent-encode; any other is a
    query or fragment, which the API's path would follow: "https://gw/v1?x=1" sent every request to the
    path "/v1" with the query "x=1/chat/completions", silently."""
    authority = url.partition("://")[2].partition("/")[0]
    userinfo = authority.rpartition("@")[0]
    if "?" in userinfo or "#" in userinfo:
        return ConfigError(
            f"{kind} needs a base_url whose user name and password (before the '@') hold no raw '?' or '#', "
            "which end the URL's address where they stand: percent-encode them, '?' as %3F and '#' as %23"
        )
    return ConfigError(
        f"{kind} needs a base_url without a query ('?...') or a fragment ('#...'): the API's path is added "
        f"after it, so remove them; give query parameters (an api-version) as {kind}(..., query={{...}}), "
        "sent with every request"
    )


def _retry(
    kind: str, retry: Any, max_retries: Any, backoff: float, max_backoff: float
) -> RetryPolicy:
    """`retry`, else the policy of the shorthands (`max_retries` retries after the first try)."""
    if retry is not None:
        if not isinstance(retry, RetryPolicy):
            raise ConfigError(
                f"{kind} needs retry, a bide.RetryPolicy (such as bide.RetryPolicy(attempts=3), which "
                f"counts the first try), or None to use max_retries, backoff and max_backoff; not {retry!r}"
            )
        return retry
    if not (isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0):
        raise ConfigError(
            f"{kind} needs max_retries, a whole number of retries after the first try (0 for none, 4 by "
            f"default); not {max_retries!r}"
        )
    return RetryPolicy(attempts=max_retries + 1, initial=backoff, maximum=max_backoff)


# The shortest key masked (a shorter one cannot be told from words), and the length from which a run of a
# key's consecutive characters is masked wherever it stands (see `_shortest_run`).
_SHORTEST_KEY = 8
_RUN = 16
# How far past what a message shows the text is masked before it is cut (see `shown_masked`): a key, or a
# run of one, across the cut is masked whole, and so not shown in part.
_MASK_MARGIN = 4096


@functools.cache
def _html_names() -> dict[str, tuple[str, ...]]:
    """The HTML character references by name of each printable ASCII character ("amp;", and "amp" as HTML
    still reads it without its ";"), the longest first."""
    import html.entities

    names: dict[str, list[str]] = {}
    for name, char in html.entities.html5.items():
        if len(char) == 1 and char.isascii() and char.isprintable():
            names.setdefault(char, []).append(name)
    return {char: tuple(sorted(found, key=len, reverse=True)) for char, found in names.items()}


def _shortest_run(key: str) -> int:
    """How many consecutive characters of `key` a server may quote before they are masked: 16, or half of
    a key shorter than 32, never fewer than 8 (the whole of an 8-character key)."""
    return min(len(key), max(_SHORTEST_KEY, min(_RUN, len(key) // 2)))


def mask_key(text: str, key: str) -> str:
    """`text` with every run of at least `_shortest_run` consecutive characters of the API key `key` (the
    whole key too) shown as ``***``, read several ways: as it stands, line breaks left out (a key across the
    `data:` lines of one event); with every escape read as the character it stands for (as JSON or `repr`
    write them, ``\\u002B``, ``\\/``, ``\\\\``; percent-encoded, ``%2B``; HTML references, ``&#43;``,
    ``&#x2B;``, ``&plus;``; line breaks raw or escaped read as nothing), and with each kind alone where the
    text holds more than one; and each escape of these readings in turn not taken (`_read_otherwise`), so
    that a run is masked however a backslash, "%" or "&" before it is read. A key shorter than 8 characters
    is not masked: it cannot be told from words. Linear in `text`, whatever it and the key hold (see `_runs`
    and `_read_otherwise`); callers mask only what they show (`shown_masked`)."""
    if len(key) < _SHORTEST_KEY:
        return text
    spans = _runs(_Reading.of(text, _LINE_BREAK, _read_site), key)
    opening = "".join(char for char in _ESCAPES_OPENED if char in text)
    # Each kind of escape alone too, where the text holds more than one: an HTML page quotes a key's
    # backslashes as they stand, and a JSON text its "&" and "%"; read as escapes, they read as others.
    for escapes in ([opening, *opening] if len(opening) > 1 else [opening]) if opening else []:
        sites = _decoding(escapes)
        decoded = _Reading.of(text, sites, _site_reader(key))
        spans += _runs(decoded, key)
        spans += _runs(_read_otherwise(text, decoded, sites, _site_reader(key), key), key)
    if not spans:
        return text
    pieces: list[str] = []
    done = 0
    for start, end in sorted(spans):
        if start < done:  # overlapping the span masked last: one mask for both
            done = max(done, end)
            continue
        pieces += [text[done:start], "***"]
        done = end
    pieces.append(text[done:])
    return "".join(pieces)


def shown_masked(text: str, mask: Mask, limit: int) -> str:
    """The first `limit` characters of `text` as a message shows them, the API key masked (`mask`) in
    them: only the text up to `_MASK_MARGIN` characters past the cut is masked, then it is cut (masking
    all of a 30 MB event before showing 200 characters of it held the event loop for seconds). A key or
    a run of one (`mask_key`) in what is shown is masked, one across the cut too."""
    return _masked_window(text, mask, limit)[1][:limit]


def cut_masked(text: str, mask: Mask, limit: int, *, more: bool = False) -> str:
    """`text` as `shown_masked` shows it, and when it is longer than `limit`, "... (cut here, of N
    characters)" after it: N counts the text with the key masked as far as it was masked, the rest as it
    came. `more`: `text` is the start of a longer text, not read further ("of more than N characters")."""
    window, masked = _masked_window(text, mask, limit)
    if len(text) <= limit and not more:
        return masked
    length = f"{len(masked) + len(text) - len(window):,}"
    if more:
        return f"{masked[:limit]}... (cut here, of more than {length} characters: the rest was not read)"
    return f"{masked[:limit]}... (cut here, of {length} characters)"


def _masked_window(text: str, mask: Mask, limit: int) -> tuple[str, str]:
    """The start of `text` that is masked before its first `limit` characters are shown, and it masked:
    `_MASK_MARGIN` characters past the cut, more while the masked window holds less than half that margin
    past it (the masks of many keys shrink a window, and the shown text then reached its raw end, where a
    key cut short showed in part), else all of it."""
    size = limit + _MASK_MARGIN
    while True:
        window = text[:size]
        masked = mask(window)
        if len(masked) >= limit + _MASK_MARGIN // 2 or size >= len(text):
            return window, masked
        size *= 2


# A line break, which the first reading of `mask_key` leaves out.
_LINE_BREAK = re.compile(r"(\r\n|[\r\n])")
# What opens an escape (see `_decoding`): a text without any reads the same with them decoded.
_ESCAPES_OPENED = "\\%&"


@functools.cache
def _decoding(opening: str = _ESCAPES_OPENED) -> re.Pattern[str]:
    """What `_read_site` reads: JSON and `repr` escapes, percent-encoding, HTML references (by number, or by
    a name, of which `_read_site` reads the known ones), and line breaks, raw or escaped; of the escapes,
    those that one of the characters of `opening` opens."""
    kinds = {
        "\\": r"\\u[0-9A-Fa-f]{4}|\\[rn/\\\"']|",
        "%": r"%[0-9A-Fa-f]{2}|",
        # An HTML name: at most as long as the longest one known (31 characters), so that "&" and a long
        # run of letters is not one site whose every opening `_read_site` would try (quadratic in the run).
        "&": r"&#[xX][0-9A-Fa-f]+;?|&#[0-9]+;?|&[A-Za-z][A-Za-z0-9]{0,31};?|",
    }
    return re.compile("(" + "".join(kinds[char] for char in opening) + r"\r\n|[\r\n])")


# The longest site whose reading is remembered: a reference padded with zeros to 60 KB (a hostile answer) is
# read each time, not kept in a cache of thousands of entries.
_REMEMBERED_SITE = 64


def _read_site(site: str) -> str:
    """`_site_text`, remembered for short sites."""
    return _read_short_site(site) if len(site) <= _REMEMBERED_SITE else _site_text(site)


@functools.lru_cache(maxsize=4096)
def _read_short_site(site: str) -> str:
    return _site_text(site)


def _site_text(site: str) -> str:
    """What a site `_decoding` found reads as: "" for a line break, U+FFFD for a reference to no character,
    an HTML name as HTML reads it (the longest known name opening it, the rest as it stands; itself when
    none opens it)."""
    if site in ("\r\n", "\r", "\n", "\\r", "\\n"):
        return ""
    if site[0] == "%" or site.startswith("\\u"):
        return chr(int(site[2:] if site[1] == "u" else site[1:], 16))
    if site[0] == "\\":
        return site[1]
    if site.startswith("&#"):
        hexadecimal = site[2] in "xX"
        digits = site[3 if hexadecimal else 2 :].rstrip(";").lstrip("0") or "0"
        number = int(digits, 16 if hexadecimal else 10) if len(digits) <= 8 else -1
        return chr(number) if 0 <= number <= 0x10FFFF else "\ufffd"
    names = _html_names_read()
    for end in range(len(site), 1, -1):
        char = names.get(site[1:end])
        if char is not None:
            return char + site[end:]
    return site


@functools.lru_cache(maxsize=8)
def _site_reader(key: str) -> Callable[[str], str]:
    """`_read_site` for `key`: a site that reads as anything but characters of the key reads as it stands.
    It cannot be part of a run of the key either way, and its characters may be: in ``%0000000%3A`` the
    key ``0000000:`` stands after a ``%``, which ``%00`` would have taken."""
    chars = frozenset(key)

    @functools.lru_cache(maxsize=4096)
    def read_short(site: str) -> str:
        said = _read_site(site)
        return said if chars.issuperset(said) else site

    def read(site: str) -> str:
        if len(site) <= _REMEMBERED_SITE:
            return read_short(site)
        said = _read_site(site)
        return said if chars.issuperset(said) else site

    return read


@functools.cache
def _html_names_read() -> dict[str, str]:
    """What each name of `_html_names` stands for."""
    return {name: char for char, names in _html_names().items() for name in names}


class _Reading:
    """A text read as a row of parts, each read from a span of the text (`raw_starts`, `raw_ends`) as some
    text (`read`, joined, each ending at its `read_ends`), and the way back from a span of the reading to
    the span of the text it was read from."""

    __slots__ = ("_raw_ends", "_raw_starts", "_read_ends", "parts", "read")

    def __init__(self, parts: list[str], raw_starts: list[int], raw_ends: list[int]) -> None:
        self.parts = parts
        self.read = "".join(parts)
        self._raw_starts = raw_starts
        self._raw_ends = raw_ends
        self._read_ends = list(itertools.accumulate(map(len, parts)))

    @classmethod
    def of(cls, text: str, sites: re.Pattern[str], read_site: Callable[[str], str]) -> _Reading:
        """`text` with each of its `sites` (a pattern of one group, found from the left) read as `read_site`
        reads it: plain text, then a site, then plain text, ..."""
        parts = sites.split(text)
        if len(parts) == 1:
            return cls(parts, [0], [len(text)])
        raw_ends = list(itertools.accumulate(map(len, parts)))
        parts[1::2] = map(read_site, parts[1::2])
        return cls(parts, [0, *raw_ends[:-1]], raw_ends)

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of `text` that `read[start:end]` was read from (from its first character's part to its
        last one's)."""
        return self._place(start)[0], self._place(end - 1)[1]

    def _place(self, at: int) -> tuple[int, int]:
        index = bisect.bisect_right(self._read_ends, at)
        read_start = self._read_ends[index - 1] if index else 0
        raw_start, raw_end = self._raw_starts[index], self._raw_ends[index]
        if raw_end - raw_start != self._read_ends[index] - read_start:
            return raw_start, raw_end  # a site read as another (shorter) text: all of it
        # Plain text, or a site read as it stands (every escape reads shorter than itself).
        plain = raw_start + at - read_start
        return plain, plain + 1


def _read_otherwise(
    text: str, reading: _Reading, sites: re.Pattern[str], read_site: Callable[[str], str], key: str
) -> _Reading:
    """The text around each site of `reading` (made by `_Reading.of` with `sites` and `read_site`) read
    with that site not taken: its first character as it stands, the sites from the next one on found anew
    (until they fall where `reading`'s do), `reading` on either side; these readings one after the other, a
    character not in the key between them. A site where no character of the key is read either way is left
    out: `reading` shows all the runs there.

    Sites are found from the left, and one may start before a quoted run of the key and end inside it:
    after a stray backslash, ``\\\\u003a`` is ``\\\\`` then "u003a", where a server wrote a backslash, then
    ``\\u003a`` (":"); ``%4`` then ``1...`` reads as ``%41``. Only a backslash opens a site inside another
    (``\\\\``): the sites found anew fall where `reading`'s do past the site, or past the run of backslashes
    it stands in, and with any one site of that run not taken the run reads the same. So each part of the
    text is found anew once, however long the run: linear in `text`."""
    parts, starts, ends = reading.parts, reading._raw_starts, reading._raw_ends
    width = _shortest_run(key)  # enough of `reading` on either side to finish a run it shows in part
    apart = next(char for char in map(chr, itertools.count(0xE000)) if char not in key)
    site_starts = starts[1::2]
    chars = frozenset(key)
    said: list[str] = []
    raw_starts: list[int] = []
    raw_ends: list[int] = []

    def add(start: int, end: int, read: str) -> None:
        if read:
            said.append(read)
            raw_starts.append(start)
            raw_ends.append(end)

    filled = [index for index, read in enumerate(parts) if read]  # line breaks read as nothing
    done = 0
    for index in range(1, len(parts), 2):
        start, end = starts[index], ends[index]
        if start < done or text[start] in "\r\n":  # found anew already; a raw line break reads as nothing
            continue
        # The sites from `start + 1` found anew, until one falls where `reading`'s do.
        found = [(start, start + 1, text[start])]
        at, again = start + 1, None
        # Not cut short after some characters: a long run of backslashes read in other pairs, its sites then
        # skipped as found anew, took the first character of a quoted run after it.
        for site in itertools.chain(sites.finditer(text, at), [None]):
            stop = site.start() if site else len(text)
            here = max(at, end)
            if here <= stop:
                inside = bisect.bisect_left(site_starts, here) - 1
                if inside >= 0 and ends[2 * inside + 1] > here:  # within a site of `reading`: after it
                    here = ends[2 * inside + 1]
                if here <= stop:
                    again = here
            plain = text[at : stop if again is None else again]
            found.append((at, at + len(plain), plain))
            if again is not None or site is None:
                break
            found.append((site.start(), site.end(), read_site(site.group())))
            at = site.end()
        done = again if again is not None else at + len(plain)
        if chars.isdisjoint("".join(part[2] for part in found)):
            continue  # no run of the key passes where the readings differ: `reading` shows all there is
        # `reading` before the site, `width` characters of it.
        before: list[tuple[int, int, str]] = []
        left = width
        last_before = bisect.bisect_left(filled, index)
        for back in reversed(filled[max(0, last_before - width) : last_before]):
            if left <= 0:
                break
            read = parts[back]
            if back % 2 == 0 and len(read) > left:  # plain text: its end
                before.append((ends[back] - left, ends[back], read[-left:]))
                break
            before.append((starts[back], ends[back], read))
            left -= len(read)
        for part in reversed(before):
            add(*part)
        for part in found:
            add(*part)
        # `reading` from where the sites fell together again, `width` characters of it.
        if again is not None:
            first_after = bisect.bisect_left(filled, bisect.bisect_right(starts, again) - 1)
            left = width
            for after in filled[first_after : first_after + width]:
                if left <= 0:
                    break
                first, last, read = starts[after], ends[after], parts[after]
                if after % 2 == 0:  # plain text: from `again` on, its first `left` characters
                    first = max(first, again)
                    read = text[first : min(last, first + left)]
                    last = first + len(read)
                add(first, last, read)
                left -= len(read)
        add(done, done, apart)
    return _Reading(said, raw_starts, raw_ends)


@functools.lru_cache(maxsize=8)
def _pieces(key: str, length: int) -> frozenset[str]:
    """Every `length` consecutive characters of `key`."""
    return frozenset(key[at : at + length] for at in range(len(key) - length + 1))


def _runs(reading: _Reading, key: str) -> list[tuple[int, int]]:
    """Spans of the text read that hold every run of at least `_shortest_run` consecutive characters of
    `key` its reading shows. Such a run holds whole a piece of the reading `step`, half that length, long
    that starts at a multiple of `step`: those pieces alone are looked up (in a set, C speed), and each
    one found in the key is grown, by halving, to the most characters of the key on either side of it
    (the two sides may follow different places of a key that repeats itself: a little more is masked
    then, never less). A piece inside a span found already, with a piece after it in the span, is not
    grown again, so the work is linear in the text whatever it and the key hold."""
    read = reading.read
    shortest = _shortest_run(key)
    step = shortest // 2
    pieces = _pieces(key, step)
    found: list[tuple[int, int]] = []
    end = -1
    for at in [at for at in range(0, len(read) - step + 1, step) if read[at : at + step] in pieces]:
        if at + 2 * step <= end:
            continue
        left = functools.partial(_key_holds, read, key, at, step, -1)
        start = at - _longest(left, min(at, len(key) - step))
        most = min(len(key), len(read) - at) - step
        stop = at + step + _longest(functools.partial(_key_holds, read, key, at, step, 1), most)
        if stop - start >= shortest:
            found.append(reading.span(start, stop))
            end = max(end, stop)
    return found


def _key_holds(read: str, key: str, at: int, step: int, side: int, more: int) -> bool:
    """Whether `key` holds `read[at : at + step]` with `more` characters of `read` on its left (`side`
    -1) or its right (1)."""
    if side < 0:
        return read[at - more : at + step] in key
    return read[at : at + step + more] in key


def _longest(holds: Callable[[int], bool], most: int) -> int:
    """The largest n from 0 to `most` for which `holds(n)`, which holds for 0 and for every n below one it
    holds for: found by doubling, then halving, so a short answer (most are) takes few tries."""
    low, high = 0, 1
    while high <= most and holds(high):
        low, high = high, 2 * high
    high = min(high - 1, most)
    while low < high:
        middle = (low + high + 1) // 2
        if holds(middle):
            low = middle
        else:
            high = middle - 1
    return low


class HTTPModel:
    """The HTTP machinery of a model adapter (subclasses build bodies and parse answers)."""

    name: str
    api_key: str
    base_url: str
    temperature: float | None
    extra_body: dict[str, Any]
    query: dict[str, str]
    provider: str = ""
    timeout: float
    stream_timeout: float
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
        stream_timeout: float,
        retry: RetryPolicy | None,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        temperature: float | None,
        extra_body: dict[str, Any] | None,
        transport: httpx.AsyncBaseTransport | None,
        limits: httpx.Limits | None,
        query: Mapping[str, str] | None = None,
    ) -> None:
        """The set-up every adapter shares: its parameters of the same names (see `bide.OpenAIModel`)."""
        if not model:
            kind = type(self).__name__
            raise ConfigError(f"{kind} needs a model name, e.g. {kind}({self._example_model!r})")
        self.name = model
        self.api_key = api_key if api_key is not None else os.environ.get(f"{self._env}_API_KEY", "")
        self._check_api_key("api_key" if api_key is not None else f"{self._env}_API_KEY")
        self.base_url = (base_url or os.environ.get(f"{self._env}_BASE_URL") or self._default_url).rstrip("/")
        if self.base_url.partition("://")[0].lower() not in ("http", "https"):
            # Without a scheme, httpx fails every request (retried for nothing), and nothing in the URL,
            # credentials included, could be masked in the messages: the URL itself is not repeated here.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url that starts with http:// or https://, e.g. "
                f"{self._default_url!r}"
            )
        if any(c.isspace() or not c.isprintable() for c in self.base_url):
            # A line break kept from the file or variable it was read from: every request failed on it.
            # Not repeated: it may hold credentials.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url without white space or control characters (a line "
                "break kept from the file or variable it came from?): remove them"
            )
        if "?" in self.base_url or "#" in self.base_url:
            # Not repeated: it may hold credentials.
            raise _query_in_url(type(self).__name__, self.base_url)
        host = _host(self.base_url)
        if not host:
            # "http:///v1": httpx failed every request (retried for nothing). Not repeated: it may hold
            # credentials.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url that names a host after its http:// or https://, "
                f"e.g. {self._default_url!r}"
            )
        if not _is_host(host):
            # "http://local%20host:8080", "http://api..example.com", "http://xn--a.com": no request could
            # reach it, and each failed (retried for nothing). Not repeated: what stands before its '@' may
            # be credentials.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url whose host is a host name (letters, digits, '-' and "
                "'_' between dots, a label opening with 'xn--' the IDNA encoding of one in another script, "
                "or a name in another script), an IPv4 address or an IPv6 address in brackets ([::1]), e.g. "
                f"{self._default_url!r}"
            )
        if _zone_off_link(host):
            # Not repeated: what stands before its '@' may be credentials.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url whose IPv6 zone ('%25' and an interface, as in "
                "[fe80::1%25eth0]) is that of a link-local address (fe80::/10), the only kind the resolver "
                "connects to with a zone: remove the zone from any other address"
            )
        try:
            urllib.parse.urlsplit(self.base_url).port  # noqa: B018 (a port that is no number raises)
        except ValueError:
            # Unchecked, every request failed (retried for nothing), and the key check below took the URL
            # for another host's.
            raise ConfigError(
                f"{type(self).__name__} needs a base_url whose port is a number from 0 to 65535, e.g. "
                f"{self._default_url!r}"
            ) from None
        if not self.api_key and _same_host(self.base_url, self._default_url):
            # The provider refuses every request without one (401, after the retries of a network error
            # when offline): say so when the model is made. A server of one's own may need none.
            raise ConfigError(
                f"{type(self).__name__} has no API key for {self._default_url}: set {self._env}_API_KEY or "
                f"pass api_key=... (a server of your own, at base_url=..., may take an empty key)"
            )
        self.temperature = _temperature(type(self).__name__, temperature)
        self.extra_body = _extra_body(type(self).__name__, extra_body)
        self.query = _query(type(self).__name__, query)
        if self.query:
            import httpx

            try:
                httpx.URL(self.base_url, params=self.query)
            except httpx.InvalidURL:  # (too long: every request failed to build, "run again to retry")
                raise ConfigError(
                    f"{type(self).__name__} needs query parameters a URL can hold: together with base_url "
                    "they make a URL httpx refuses (too long); shorten them"
                ) from None
        try:
            self.timeout = seconds("timeout", timeout, zero=False)
        except ConfigError:
            # Unchecked, NaN failed at the first request, and None or infinity let a request hang forever.
            raise ConfigError(
                f"{type(self).__name__} needs timeout, a positive number of seconds (at most "
                f"{MAX_SECONDS:,}) that bounds each try of a request and each wait in a stream (default 60), "
                f"not {timeout!r}"
            ) from None
        if not (
            isinstance(stream_timeout, (int, float))
            and not isinstance(stream_timeout, bool)
            and 0 < stream_timeout < float("inf")
        ):
            raise ConfigError(
                f"{type(self).__name__} needs stream_timeout, a positive number of seconds that bounds a "
                f"whole streamed answer (default {STREAM_TIMEOUT:g}), not {stream_timeout!r}"
            )
        self.stream_timeout = float(stream_timeout)
        self.retry = _retry(type(self).__name__, retry, max_retries, backoff, max_backoff)
        self._transport = transport
        self._limits = limits
        self._pool: _Pool | None = None
        self._proxy = ""  # the proxy the pooled client sends requests through (see `env_proxy`)
        self._proxy_secrets: tuple[str, ...] = ()  # what `_redacted` masks of its credentials
        self.clients_made = 0

    def _check_api_key(self, where: str) -> None:
        """Refuse a key no HTTP header can carry, saying why without showing it: a key read from a file
        ends in a line break, which httpx refused on every try with the key quoted in the error."""
        key = self.api_key
        if not isinstance(key, str):
            raise ConfigError(f"{type(self).__name__}: {where} must be a string, not a {type(key).__name__}")
        if key and (not key.isascii() or not key.isprintable() or key != key.strip()):
            raise ConfigError(
                f"{type(self).__name__}: {where} holds a line break, another control character, white space "
                "at an end or a character that is not ASCII (a key read from a file keeps its last line "
                "break: strip it); the key is not shown here"
            )

    def _redacted(self, text: str) -> str:
        """`text` (a server's error, which bide prints and logs) with this model's API key, should a server
        or proxy quote it back, shown as ``***``, and so the values of `query` and the credentials of the
        proxy of the environment requests go through (`proxy_secrets`). A key or value too short to tell from
        words is left alone; so is a proxy's password, but where it stands after its user name and a
        colon."""
        text = mask_key(text, self.api_key)
        for value in self.query.values():
            # A gateway may take its key in the query (`code=...`, `key=...`): masked as the API key is.
            text = mask_key(text, value)
        for secret in self._proxy_secrets:
            text = mask_key(text, secret) if len(secret) >= _SHORTEST_KEY else text
            if ":" in secret:
                text = text.replace(secret, f"{secret.partition(':')[0]}:***")
        return text

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
        try:
            client = httpx.AsyncClient(timeout=self.timeout, transport=self._transport, limits=limits)
        except (httpx.InvalidURL, ValueError, ImportError) as exc:
            # httpx reads the environment's proxies as it makes a client (none when given a transport): a
            # setting it cannot read failed every request, "run again to retry", a password shown in part.
            problem: Exception | None = exc
        else:
            problem = None
        if problem is not None:  # raised out of the `except`: httpx's message quotes the password in part
            raise unusable_proxy(type(self).__name__, problem)
        chosen = _env_proxy_url(self._url()) if self._transport is None else None
        self._proxy = env_proxy(self._url()) if chosen is not None else ""
        self._proxy_secrets = proxy_secrets(chosen[1]) if chosen is not None else ()
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

    def _request_headers(self) -> dict[str, str]:
        """The adapter's headers, asking for no content encoding but those bide decodes itself."""
        return {**self._headers(), "accept-encoding": ACCEPT_ENCODING}

    def _url(self) -> str:
        raise NotImplementedError

    def _request_base(self) -> str:
        """`base_url` as requests are sent to it (an IPv6 zone as httpx reaches it, see `zone_for_httpx`)."""
        return zone_for_httpx(self.base_url)

    def _retrying(self, exc: BaseException, hint: float | None, delay: float) -> None:
        """Log, at INFO, a retry about to happen (`RetryPolicy.run` tells of no other: the failure of the last
        attempt is `_exhausted`'s to log), saying how long it waits, and why when the server asked more than
        the retry policy's `maximum` allows."""
        if not LOGGER.isEnabledFor(20):
            return
        why = f"HTTP {exc.status}" if isinstance(exc, TransientStatus) else failure(exc, self._redacted)
        wait = f"waiting {_seconds_shown(delay)}"
        asked = _seconds_shown(hint) if hint is not None else ""
        if hint is not None and hint > delay and asked != _seconds_shown(delay):
            wait = f"the server asked {asked}; {wait}, the retry policy's maximum"
        elif hint is not None:
            wait = f"{wait}; the server asked {asked}"
        LOGGER.info(
            "model %s%s: %s; retrying (%s)",
            self.name,
            self._through(),
            why,
            wait,
            extra={
                "model": self.name,
                "http_status": getattr(exc, "status", None),
                "retry_after": hint,
                "retry_wait": delay,
            },
        )

    def _classify(self, exc: BaseException) -> bool | float:
        """The retry verdict for a failed attempt: a transient status (waiting as its `Retry-After` asks),
        a network error or a timeout is retried, anything else is not."""
        import httpx

        if isinstance(exc, TransientStatus):
            return True if exc.retry_after is None else exc.retry_after
        return isinstance(exc, (httpx.TransportError, RequestTimeout))

    def _refuse(self, response: httpx.Response, body: ErrorBody) -> ModelError:
        status = response.status_code
        # Masked past the cut (see `shown_masked`): a key across it is masked whole.
        text = shown_masked(body.text, self._redacted, _ERROR_BODY_SHOWN)
        # The message is read from all that was read, then masked (decoded: a server may quote the key with
        # JSON escapes) and cut, saying so and how long it was: cut before it was read, the JSON of a long
        # message was unreadable, and its first 2,000 characters were shown as if they were all.
        said = cut_masked(error_message(body.text), self._redacted, _ERROR_BODY_SHOWN, more=not body.whole)
        if status in TRANSIENT:
            return TransientStatus(
                f"HTTP {status}: {said}",
                status=status,
                body=text,
                retry_after=parse_retry_after(response.headers),
            )
        check = "the model name, API key and request"
        if status == 407:
            check = "the proxy's credentials, given in its URL: http://user:password@proxy:port"
        return ModelError(
            f"model {self.name!r} at {self._shown_url()} answered {status}: {said}; this is "
            f"not retried (check {check})",
            status=status,
            body=text,
        )

    def _shown_url(self) -> str:
        """The request URL for messages, which end up on terminals and in logs: credentials in it (a proxy's,
        say) shown as ``***`` (see `masked_url`); then the proxy it went through, if any (`_through`)."""
        return masked_url(self._url()) + self._through()

    def _through(self) -> str:
        """" through the proxy ... (from HTTPS_PROXY)" when requests go through a proxy of the environment,
        whose failures (refused, 407, a tunnel it closed) would otherwise read as the model server's."""
        return f" through {self._proxy}" if self._proxy else ""

    def _exhausted(self, exc: Exception) -> ModelError:
        last = (
            # Masked and cut by `_refuse` already, saying where: cut again, the saying was lost.
            cut_masked(str(exc), self._redacted, _FAILURE_SHOWN + _CUT_SAID)
            if isinstance(exc, TransientStatus)
            else failure(exc, self._redacted)
        )
        LOGGER.warning(
            "model %s%s: giving up after %d attempts: %s",
            self.name,
            self._through(),
            self.retry.attempts,
            last,
            extra={"model": self.name, "http_status": getattr(exc, "status", None)},
        )
        what_next = "run again to retry"
        if self._proxy and _proxy_failed(exc):
            what_next = "check the proxy (or name the host in NO_PROXY to go around it), then run again"
        return ModelError(
            f"model {self.name!r} at {self._shown_url()} failed after {self.retry.attempts} attempts: "
            f"{last}; nothing was journaled, {what_next}",
            status=getattr(exc, "status", None),
            body=getattr(exc, "body", None),
        )

    async def _post(self, body: dict[str, Any]) -> Any:
        """POST `body` and return the decoded JSON answer, retrying what may be retried. The whole request
        is bounded by `timeout`, and the answer is read as it arrives, refused past `MAX_RESPONSE_BYTES`."""
        import httpx

        url, headers, params = self._url(), self._request_headers(), self.query or None

        async def attempt() -> bytes:
            client = self.client()
            async with self._deadline():
                response = await client.send(
                    client.build_request("POST", url, json=body, headers=headers, params=params), stream=True
                )
                try:
                    if response.status_code != 200:
                        refused = await _error_text(response, self.name, self._redacted)
                        raise self._refuse(response, refused)
                    return await _read_capped(response, self.name, self._redacted)
                finally:
                    await response.aclose()

        try:
            content = await self.retry.run(attempt, self._classify, self._retrying)
        except (TransientStatus, RequestTimeout, httpx.TransportError) as exc:
            failed = exc
        else:
            return self._decoded(content)
        # Raised out here, so neither chained nor its context: httpx's message (and the exceptions behind it)
        # may quote what the server sent ("illegal header line: b'...'"), which `_exhausted` shows masked.
        raise self._exhausted(failed)

    def _decoded(self, content: bytes | str) -> Any:
        """A whole answer's JSON (bytes as they came, or the text of a whole answer to a streaming request,
        see `WHOLE`). A body that is not JSON, or that is an error although the status was 200
        (`{"error": {"message": ...}}`, as some servers and proxies answer a spent quota), raises ModelError,
        the server's message in it."""
        problem: str | None = None
        try:
            # Decoded here, not by json.loads, which would also take UTF-16 or UTF-32 and a second BOM.
            text = content.removeprefix(_BOM).decode("utf-8") if isinstance(content, bytes) else content
            data = read_json(text)
        except ValueError as exc:
            problem = json_problem(exc, self._redacted)
        if problem is not None:
            # Raised out of the `except`, so not chained: the error may quote the body (a key twice), which
            # the message shows masked.
            raise ModelError(f"model {self.name!r} answered 200 with a body that is not JSON: {problem}")
        said = error_in(data)
        if said is not None:
            # Read as an answer, it failed on the missing choices or content, the server's message lost.
            raise ModelError(
                f"model {self.name!r} at {self._shown_url()} answered 200 with an error instead of a turn: "
                f"{error_shown(said, self._redacted)}; nothing was journaled: fix what "
                "the server says (a quota, the model name, the request), then run again",
                status=200,
                body=shown_masked(text, self._redacted, _ERROR_BODY_SHOWN),
            )
        return data

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

        url, headers, params = self._url(), self._request_headers(), self.query or None

        async def attempt() -> httpx.Response:
            client = self.client()
            async with self._deadline():
                response = await client.send(
                    client.build_request("POST", url, json=body, headers=headers, params=params), stream=True
                )
                if response.status_code == 200:
                    return response
                try:
                    refused = await _error_text(response, self.name, self._redacted)
                finally:
                    await response.aclose()
            raise self._refuse(response, refused)

        try:
            return await self.retry.run(attempt, self._classify, self._retrying)
        except (TransientStatus, RequestTimeout, httpx.TransportError) as exc:
            failed = exc
        raise self._exhausted(failed)  # outside the `except`: see `_post`

    def _stream_clock(self) -> StreamClock:
        """The bounds of a stream that just opened: `timeout` between pieces that add to the answer, and
        `stream_timeout` for all of it."""
        return StreamClock(self.name, idle=self.timeout, total=self.stream_timeout)


def _seconds_shown(seconds: float) -> str:
    """`seconds` as the retry log shows a wait, with its unit: to the millisecond, never in scientific
    notation ("1234s", "0.3s", "2.5s"); a server's hint past a year (`Retry-After: 1e308`) as "more than a
    year"."""
    if not seconds < _A_YEAR_S:  # (NaN and infinity too)
        return "more than a year"
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


_A_YEAR_S = 365 * 24 * 3600.0


def _proxy_failed(exc: BaseException) -> bool:
    """Whether `exc`, a request's last failure through a proxy, is the proxy's: httpx's ProxyError (a 407,
    a tunnel refused), or a connection to it that failed (requests connect to the proxy, not the server).
    A status or a timeout is the server's answer, or its silence, passed on."""
    import httpx

    return isinstance(exc, (httpx.ProxyError, httpx.ConnectError, httpx.ConnectTimeout))


class StreamClock:
    """The bounds of one streamed answer, counted while bide waits for the server or reads what it sent (not
    while the caller handles a piece): a wait for a piece that adds to the answer is cut off after `idle`
    seconds, however many keep-alive comments, pings or empty pieces came meanwhile (`progress` marks one
    that adds), and the waits of the whole stream together after `total` seconds. Either raises
    `RequestTimeout`."""

    def __init__(self, name: str, *, idle: float, total: float) -> None:
        self.name = name
        self.idle = idle
        self.total = total
        self.quiet = 0.0  # waited since the last piece that added to the answer
        self.waited = 0.0  # waited in all
        self.away = 0.0  # spent in the caller's hands (see `handed`), which does not count

    def progress(self) -> None:
        """A piece that adds to the answer arrived: the wait for the next one starts from zero."""
        self.quiet = 0.0

    async def read(self, chunks: AsyncIterator[bytes]) -> bytes | None:
        """The next chunk of `chunks` (None at its end), within what is left of both bounds."""
        loop = asyncio.get_running_loop()
        idle_left, total_left = self.idle - self.quiet, self.total - self.waited
        started = loop.time()
        try:
            async with asyncio.timeout(max(0.0, min(idle_left, total_left))):
                return await anext(chunks, None)
        except TimeoutError:
            raise self._expired(total_left <= idle_left) from None
        finally:
            spent = loop.time() - started
            self.quiet += spent
            self.waited += spent

    @contextlib.contextmanager
    def handed(self) -> Iterator[None]:
        """Time inside does not count: an adapter hands its caller a piece of the answer (a `yield`), and
        the caller's code runs until it asks for the next."""
        loop = asyncio.get_running_loop()  # the clock `sse_events` reads
        started = loop.time()
        try:
            yield
        finally:
            self.away += loop.time() - started

    def spend(self, seconds: float) -> None:
        """`seconds` went on reading what the server sent (a flood of keep-alive lines, say): they count as
        waited, and past either bound raise `RequestTimeout`."""
        self.quiet += seconds
        self.waited += seconds
        if self.waited >= self.total or self.quiet >= self.idle:
            raise self._expired(self.total - self.waited <= self.idle - self.quiet)

    def _expired(self, total: bool) -> RequestTimeout:
        if total:
            return RequestTimeout(
                f"model {self.name!r}: the stream did not end within the model's stream_timeout of "
                f"{self.total:g}s; nothing was journaled, run again to retry (raise stream_timeout "
                "for longer answers)"
            )
        return RequestTimeout(
            f"model {self.name!r}: the stream sent nothing that adds to the answer for {self.idle:g}s "
            "(the model's timeout; keep-alive comments, pings and empty pieces do not count); nothing "
            "was journaled, run again to retry"
        )


async def _read_capped(response: httpx.Response, name: str, mask: Mask) -> bytes:
    """The whole body, read as it arrives and refused once it passes `MAX_RESPONSE_BYTES` (counted after
    content decoding too, so a compressed bomb is refused): never held whole first."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _too_large(name)
    parts: list[bytes] = []
    async with contextlib.aclosing(_body(response, name, mask)) as pieces:
        async for piece in pieces:
            parts.append(piece)
    return b"".join(parts)


_ERROR_BODY_BYTES = 64 * 1024
# The most of an error body a message shows.
_ERROR_BODY_SHOWN = 2000
# Room for what `cut_masked` says after a cut, and an "HTTP 503: " before it.
_CUT_SAID = 200


@dataclass(frozen=True, slots=True)
class ErrorBody:
    """The start of a refusal's body, as `_error_text` read it: `text`, and whether it is all of the body
    (`whole`; else the rest was not read)."""

    text: str
    whole: bool


async def _error_text(response: httpx.Response, name: str, mask: Mask) -> ErrorBody:
    """The start of a refusal's body (enough for its message; past `_ERROR_BODY_BYTES` the rest is not
    read), not cut to `_ERROR_BODY_SHOWN` yet: the API key is masked in it first (see
    `HTTPModel._refuse`)."""
    parts: list[bytes] = []
    size = 0
    whole = True
    try:
        async with contextlib.aclosing(_body(response, name, mask)) as pieces:
            async for piece in pieces:
                parts.append(piece)
                size += len(piece)
                if size > _ERROR_BODY_BYTES:  # (exactly that much may be all of it)
                    whole = False
                    break
    except ModelError:
        # The status says what happened (a 429 is still waited out and retried); only its text is lost.
        return ErrorBody("(a body bide could not decode)", True)
    return ErrorBody(b"".join(parts).removeprefix(_BOM).decode("utf-8", "replace"), whole)


def _too_large(name: str) -> ModelError:
    return ModelError(
        f"model {name!r}: the answer is larger than {MAX_RESPONSE_BYTES // 2**20} MiB, bide's limit; it was "
        "not read further and nothing was journaled"
    )


# The most one step of decompression writes: memory stays small whatever a few compressed bytes inflate to.
_INFLATE_STEP = 64 * 1024


class _Inflater:
    """One layer of gzip or deflate undone a bounded step at a time (`zlib` with a `max_length`; httpx's
    own decoder inflates each network chunk in one call, so a few KB could take gigabytes before any
    limit is checked). Corrupt, cut-off or trailing data raises ModelError."""

    def __init__(self, name: str, encoding: str) -> None:
        self.name = name
        self.encoding = encoding
        self._z = zlib.decompressobj(zlib.MAX_WBITS | 16) if encoding == "gzip" else None
        self._head = b""  # the first bytes of a deflate body, until they tell whether it is zlib-wrapped
        self._fed = False

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What `data` inflates to, in pieces of at most `_INFLATE_STEP` bytes."""
        self._fed = self._fed or bool(data)
        z = self._z
        if z is None:
            # "deflate" is zlib-wrapped by the standard, but some servers send it raw (httpx reads both).
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, b""
            wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            z = self._z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        while True:
            if z.eof:
                if data or z.unused_data:
                    raise self._bad("data follows the end of its compressed body")
                return
            try:
                out = z.decompress(data, _INFLATE_STEP)
            except zlib.error as exc:
                raise self._bad(f"its {self.encoding} data is corrupt ({exc})") from None
            data = z.unconsumed_tail
            if out:
                yield out
            if not data and len(out) < _INFLATE_STEP and not z.eof:
                return  # all of `data` is in; a full step may have left output behind, so only then

    def end(self) -> None:
        """The body ended: it must have ended its compressed data too (an empty body is empty)."""
        if self._fed and (self._z is None or not self._z.eof):
            raise self._bad(f"it ended in the middle of its {self.encoding} data")

    def _bad(self, why: str) -> ModelError:
        return ModelError(
            f"model {self.name!r} sent a {self.encoding}-encoded answer bide cannot decode: {why}; nothing "
            "was journaled, run again to retry"
        )


def _inflater(response: httpx.Response, name: str, mask: Mask) -> _Inflater | None:
    """The decoder of the body's Content-Encoding (None: not encoded). Only what `ACCEPT_ENCODING` asks for
    is read: anything else, or two layers, raises ModelError (the header shown as `excerpt` shows it)."""
    given = [c.strip() for c in response.headers.get_list("content-encoding", split_commas=True)]
    given = [c for c in given if c and c.lower() != "identity"]
    codings = [c.lower() for c in given]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return _Inflater(name, "deflate" if codings[0] == "deflate" else "gzip")
    raise ModelError(
        # As sent, not lowered: the mask is of the key as it is (a proxy may have quoted it here).
        f"model {name!r} answered with Content-Encoding {excerpt(', '.join(given), mask, 100)}, which bide "
        f"does not decode (it asks for {ACCEPT_ENCODING!r}: at most one layer of gzip or deflate); nothing "
        "was read or journaled: check the server, or a proxy in between"
    )


async def _body(
    response: httpx.Response, name: str, mask: Mask, clock: StreamClock | None = None
) -> AsyncGenerator[bytes, None]:
    """The body as it arrives, content decoding undone by bide in bounded steps: past `MAX_RESPONSE_BYTES`
    as sent or as decoded, ModelError. With a `clock`, each wait is within its bounds."""
    inflater = _inflater(response, name, mask)
    sent = size = 0
    # httpx types it as an iterator; it is an async generator, closed here when the reading stops.
    raw = cast("AsyncGenerator[bytes, None]", response.aiter_raw())
    async with contextlib.aclosing(raw) as chunks:
        while True:
            chunk = await (clock.read(chunks) if clock is not None else anext(chunks, None))
            if chunk is None:
                break
            sent += len(chunk)
            if sent > MAX_RESPONSE_BYTES:
                raise _too_large(name)
            for piece in (chunk,) if inflater is None else inflater.pieces(chunk):
                size += len(piece)
                if size > MAX_RESPONSE_BYTES:
                    raise _too_large(name)
                yield piece
    if inflater is not None:
        inflater.end()


# A run of line ends: its first ends a line, and any more make blank lines, of which one does what many do.
_LINE_ENDS = re.compile(rb"[\r\n]+")
# The UTF-8 byte-order mark: one opening a body is not part of its text (the SSE standard says so of streams).
_BOM = b"\xef\xbb\xbf"


class _EventReader:
    """The server-sent events in the chunks of a body: its lines (ended by CRLF, LF or CR, decoded as UTF-8;
    bytes that are not UTF-8 raise ModelError, as they do in a whole answer, and one byte-order mark opening
    the stream is dropped) put together into (event, data) pairs."""

    __slots__ = ("_after_cr", "_data", "_event", "_line", "_mask", "_name", "_opening")

    def __init__(self, name: str, mask: Mask) -> None:
        self._name = name
        self._mask = mask
        self._line: list[bytes] = []  # the pieces of the line not ended yet
        self._after_cr = False  # the last chunk ended with CR: a LF opening the next one belongs to it
        self._opening: bytes | None = b""  # the first bytes, until they show whether a BOM opens the stream
        self._event = ""
        # The event's data lines, joined by line breaks as they come: one string per line would cost some
        # 50 bytes each, so a stream of tiny data lines took ten times the bytes it is allowed.
        self._data: io.StringIO | None = None

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """The events `chunk` completes."""
        if self._opening is not None:
            # One leading BOM is dropped, even split across chunks; a second one is text.
            opening = self._opening + chunk
            if len(opening) < len(_BOM) and _BOM.startswith(opening):
                self._opening = opening
                return []
            chunk, self._opening = opening.removeprefix(_BOM), None
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        out: list[tuple[str, str]] = []
        if b"\n" not in chunk and b"\r" not in chunk:  # a piece of a long line: no need to search it
            self._line.append(chunk)
            self._after_cr = False
            return out
        start = 0
        for end in _LINE_ENDS.finditer(chunk):
            self._line.append(chunk[start : end.start()])
            self._take(b"".join(self._line), out)
            self._line = []
            start = end.end()
            if start - end.start() > 1 and chunk[end.start() : start] != b"\r\n":
                self._take(b"", out)  # more than one line end (any run but CRLF): a blank line
        if start < len(chunk):
            self._line.append(chunk[start:])
        self._after_cr = chunk.endswith(b"\r")
        return out

    def _take(self, line: bytes, out: list[tuple[str, str]]) -> None:
        if not line:
            if self._data is not None:
                out.append((self._event, self._data.getvalue()))
                self._data = None
            self._event = ""
            return
        text = _utf8(self._name, line, self._mask)
        if text.startswith(":"):
            return
        field, _, value = text.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            self._event = value
        elif field == "data":
            if self._data is None:
                self._data = io.StringIO()
            else:
                self._data.write("\n")
            self._data.write(value)


def _utf8(name: str, line: bytes, mask: Mask) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason, start = exc.reason, exc.start
    # Replacing the bytes would hand a tool arguments the model did not write. The line is shown around the
    # first byte that is not UTF-8, the API key masked on either side of it before the window is cut (the
    # key, ASCII, cannot hold that byte). Raised out of the `except`: the UnicodeDecodeError holds the line.
    # Each side masked only near the byte (see `shown_masked`): a line may be 30 MB.
    window = 20 + _MASK_MARGIN
    before = mask(line[max(0, start - 4 * window) : start].decode("utf-8", "ignore")[-window:])[-20:]
    after = shown_masked(line[start : start + 4 * window].decode("utf-8", "surrogateescape"), mask, 20)
    shown = (before + after).encode("utf-8", "surrogateescape")
    raise ModelError(
        f"model {name!r} streamed a line that is not UTF-8 ({reason} at byte {start}: {shown!r}); nothing "
        "was journaled, run again to retry"
    )


# The event name `sse_events` gives a body that is one JSON document, not an event stream: no event of a
# stream can have it (a line break ends an event's name).
WHOLE = "\n"
# How much white space may open a body before `sse_events` reads it as an event stream without knowing.
_OPENING = 64 * 1024


async def sse_events(
    response: httpx.Response, name: str, clock: StreamClock, mask: Mask, through: str = ""
) -> AsyncGenerator[tuple[str, str], None]:
    """The (event, data) pairs of a server-sent-events body (`event` is "" when the server names none), read
    within the `clock`'s bounds (the time spent reading the lines, and the caller's handling of each event
    until it asks for the next, count too, so a flood of keep-alive lines or empty events is cut off like a
    silence; what the caller spends in `clock.handed()` does not). Bytes are counted as they arrive, so a
    stream past `MAX_RESPONSE_BYTES` is refused even if it never ends a line. A connection that breaks
    mid-stream raises ModelError (naming the proxy it came `through`, `HTTPModel._through`): nothing of the
    turn is journaled, run again. `mask` masks the API key in what an error shows of the stream.

    A body that opens with ``{`` or ``[`` is one JSON document, not events (a server that ignores
    ``stream: true``, or an error in a 200, whatever its Content-Type says): it is read whole, within the
    same bounds, and given as the one pair (`WHOLE`, its text), for the caller to read as a whole answer."""
    import httpx

    reader = _EventReader(name, mask)
    loop = asyncio.get_running_loop()
    opening: bytes | None = b""  # the first bytes, until they show whether events or JSON come
    whole: list[bytes] | None = None
    try:
        async with contextlib.aclosing(_body(response, name, mask, clock)) as chunks:
            async for chunk in chunks:
                if whole is not None:
                    whole.append(chunk)
                    continue
                if opening is not None:
                    opening += chunk
                    first = opening.removeprefix(_BOM).lstrip()[:1]
                    if len(opening) < _OPENING and (not first or _BOM.startswith(opening)):
                        continue  # white space or half a BOM so far: nothing tells yet
                    if first in (b"{", b"["):
                        whole, opening = [opening], None
                        continue
                    chunk, opening = opening, None
                started = loop.time()
                events = reader.feed(chunk)
                clock.spend(loop.time() - started)
                for event in events:
                    started, away = loop.time(), clock.away
                    yield event
                    # The adapter decoding and dispatching the event counts as reading it (a flood of empty
                    # JSON pieces took 2.5 to 4 times `timeout` to cut off when only the lines counted); what
                    # it hands on to its own caller meanwhile does not (`StreamClock.handed`).
                    clock.spend(loop.time() - started - (clock.away - away))
                # A chunk may inflate to many more, read without waiting on the network: the event loop
                # gets its turn between them.
                await asyncio.sleep(0)
        # A last line without its end, or an event not ended by a blank line, is incomplete: dropped (the
        # caller sees its stream had no end).
    except httpx.TransportError as exc:
        broke: str | None = failure(exc, mask)
    else:
        broke = None
    if broke is not None:
        # Raised out of the `except`, so neither chained nor its context: httpx's message (and the exceptions
        # behind it) may quote what the server sent ("illegal chunk header: b'...'"), shown here masked.
        raise ModelError(
            f"model {name!r}{through}: the stream broke off ({broke}); nothing was journaled, run again to "
            "retry"
        )
    if whole is not None:
        body = b"".join(whole).removeprefix(_BOM)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad: str | None = f"{exc.reason} at byte {exc.start}"
        else:
            bad = None
        if bad is not None:
            # Out of the `except`: the UnicodeDecodeError holds the whole body, which may quote the key.
            raise ModelError(
                f"model {name!r} answered a streaming request with JSON that is not UTF-8 ({bad}); nothing "
                "was journaled, run again to retry"
            )
        yield WHOLE, text


# A UTF-16 surrogate: in text only as half of a pair a proxy split (see `StreamText`), or as a lone one.
_SURROGATE = re.compile("[\ud800-\udfff]")


class StreamText:
    """Text streamed in pieces. A proxy that slices strings by UTF-16 code unit may split a character past
    U+FFFF into its two surrogates, each in a piece of its own: joined, they are the character again. A
    surrogate without its other half raises ModelError (no journal can hold it)."""

    __slots__ = ("_held", "_name", "_pieces", "_what", "came")

    def __init__(self, name: str, what: str) -> None:
        self._name = name
        self._what = what
        self._pieces: list[str] = []
        self._held = ""  # a high surrogate that ended the last piece, waiting for its low half
        self.came = False  # whether any piece came (an empty one too)

    def add(self, piece: str) -> str:
        """Add `piece`; returns the text it completes (a high surrogate ending it waits for the next)."""
        self.came = True
        if self._held:
            piece, self._held = self._held + piece, ""
        if not piece.isascii():  # ASCII, most text, holds no surrogate: nothing more to look at
            if "\ud800" <= piece[-1] <= "\udbff":
                piece, self._held = piece[:-1], piece[-1]
            if _SURROGATE.search(piece):
                piece = piece.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
                lone = _SURROGATE.search(piece)
                if lone:
                    raise self._lone(lone.group())
        if piece:
            self._pieces.append(piece)
        return piece

    def text(self) -> str:
        """All the text; a high surrogate that no piece completed raises ModelError."""
        if self._held:
            raise self._lone(self._held)
        return "".join(self._pieces)

    def _lone(self, surrogate: str) -> ModelError:
        return malformed(self._name, f"{self._what} with a lone UTF-16 surrogate ({surrogate!r})")


def adds_to_answer(piece: Any) -> bool:
    """A stream piece (a delta, or a part of one) carries something the answer did not have: text, a
    name, an id, arguments. Its indexes and types alone, and empty strings, lists and objects, add nothing:
    a stream of such pieces is as silent as keep-alives (`StreamClock.progress` is not called for it)."""
    if isinstance(piece, dict):
        return any(adds_to_answer(v) for k, v in piece.items() if k not in ("index", "type"))
    if isinstance(piece, list):
        return any(adds_to_answer(v) for v in piece)
    return piece is not None and piece != "" and piece is not False


def json_object(value: Any) -> dict[str, Any]:
    """`value` if the server sent a JSON object there, else an empty one: an optional part of an answer in
    another shape reads as absent (what the turn needs is checked by the caller)."""
    return value if isinstance(value, dict) else {}


def json_index(name: str, value: Any, default: int, mask: Mask) -> int:
    """A stream's block or call index: a JSON integer (`default` when absent); anything else raises
    ModelError (the value shown by `excerpt`), since pieces of a tool call could not be put together
    without it."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
        return value
    raise malformed(name, f"a stream piece with the index {excerpt(value, mask, 100)}")


def json_name(name: str, value: Any, what: str, mask: Mask) -> str:
    """A tool call's id or tool name as the answer gave it: a JSON string ("" when absent or null). Any
    other type raises ModelError: its text (``"['t1']"``) would name a call or a tool the model never did."""
    if value is None or isinstance(value, str):
        return value or ""
    raise malformed(name, f"a tool call whose {what} is not a string: {excerpt(value, mask)}")


def made_up_ids(ids: Sequence[str], prefix: str) -> list[str]:
    """`ids` with each missing one ("") replaced by `prefix` and a number that no id of the answer has: a
    made-up id never equals one the model sent (two calls with one id are refused as the model's error)."""
    taken = set(ids)
    out: list[str] = []
    number = 0
    for given in ids:
        if not given:
            while f"{prefix}{number}" in taken:
                number += 1
            given = f"{prefix}{number}"
            taken.add(given)
        out.append(given)
    return out


def no_calls_after_all(name: str, reason: str) -> ModelError:
    """The error for a turn whose finish reason says it called tools, holding none: they were lost on the
    way, and the turn journaled as a final answer would end the run for good."""
    return malformed(name, f"a turn that stopped to call tools (finish reason {reason!r}) but holds no call")


def malformed(name: str, what: str) -> ModelError:
    """The error for an answer whose shape is not the API's (a part a turn needs is missing or wrong); a
    part of the answer in `what` is shown by `excerpt`."""
    return ModelError(f"model {name!r} sent {what}; nothing was journaled, run again to retry")


Mask = Callable[[str], str]
"""A model's `HTTPModel._redacted`: text with the model's API key, should a server quote it, masked."""

# The most of a part of an answer an error message shows.
_EXCERPT = 200


def excerpt(value: Any, mask: Mask, limit: int = _EXCERPT) -> str:
    """`value`, a part of an answer, as an error message shows it: its repr, cut to `limit` characters, the
    API key masked (`mask`) in what is shown (`shown_masked`: a key across the cut too). Text is masked
    before its repr, which would double the backslash of a JSON escape; the repr of anything else is
    masked as it stands (the mask reads the escapes a repr writes). Every server-given value an error
    message shows goes through here (or through `shown_masked`), never `{value!r}`."""
    if isinstance(value, str):
        return repr(shown_masked(value, mask, limit))
    return shown_masked(repr(value), mask, limit)


def json_event(name: str, data: str, mask: Mask) -> Any:
    try:
        return read_json(data)
    except ValueError as exc:
        problem = json_problem(exc, mask)
    # Raised out of the `except`, so neither chained nor its context: the error may quote the event (a key
    # twice), which the message shows masked.
    raise ModelError(
        f"model {name!r} streamed an event that is not JSON ({problem}): {excerpt(data, mask)}; nothing was "
        "journaled, run again to retry"
    )


# The most of a refusal, or of a text a content filter cut, that an error keeps in its `body`.
_BODY_KEPT = 64 * 1024


def kept_masked(text: str, mask: Mask) -> str:
    """`text` as an error's `body` keeps it: its first `_BODY_KEPT` characters (saying where it was cut),
    the API key masked in them (`cut_masked`)."""
    return cut_masked(text, mask, _BODY_KEPT)


def error_shown(said: str, mask: Mask) -> str:
    """A server's error message as an error of bide's shows it: cut to `_ERROR_BODY_SHOWN` characters,
    saying so, the API key masked (`mask`) in what is shown (`cut_masked`: a key across the cut too)."""
    return cut_masked(said, mask, _ERROR_BODY_SHOWN)


def unfinished(name: str, through: str = "") -> ModelError:
    """The error for a stream that ended before its turn did (`through`: the proxy it came through, see
    `HTTPModel._through`)."""
    return ModelError(
        f"model {name!r}{through}: the stream ended before the turn did; nothing was journaled, run again to "
        "retry"
    )


def cut_off(name: str, reason: str, limit: str) -> ModelError:
    """The error for a turn the token limit cut off while it held tool calls: what they carry may be
    missing or partial (an argument left out runs the tool with its default), so none of them runs."""
    return ModelError(
        f"model {name!r} was cut off at its output token limit (finish reason {reason!r}) in a turn with "
        f"tool calls, whose arguments may be missing or cut short; none was run and nothing was journaled: "
        f"raise {limit}, then run again"
    )


def filtered(name: str, reason: str) -> ModelError:
    """The error for a turn the provider's safety filter stopped while it held tool calls ("content_filter",
    "refusal"): cut where the filter stopped it, so none of them runs."""
    return ModelError(
        f"model {name!r} was stopped by the provider's content filter (finish reason {reason!r}) in a turn "
        "with tool calls, which may be cut short; none was run and nothing was journaled: run again to ask "
        "again, or change the request that the filter stopped"
    )


def filtered_answer(name: str, reason: str, text: str, mask: Mask) -> ModelError:
    """The error for an answer without tool calls that the provider's safety filter stopped: what came is
    cut where the filter stopped it (or is nothing), so it is not the run's answer, which would be final.
    The text is shown, and kept in `body`, with the API key masked (`mask`)."""
    wrote = "before it wrote anything"
    if text:
        wrote = f"after writing {excerpt(text, mask, 300)}, cut short there"
    return ModelError(
        f"model {name!r} was stopped by the provider's content filter (finish reason {reason!r}) {wrote}; "
        "nothing was journaled and the run is not finished: change the request that the filter stopped (a "
        "new run), or run again to ask again",
        body=kept_masked(text, mask),
    )


def refused(name: str, text: str, mask: Mask) -> ModelError:
    """The error for a turn in which the model refused (OpenAI's ``refusal``): journaled, an empty answer
    would end the run for good and the refusal would be lost, so it is shown here, and in `body`, with the
    API key masked (`mask`)."""
    return ModelError(
        f"model {name!r} refused to answer: {excerpt(text, mask, 1000)}; nothing was journaled and the run "
        "is not finished: change the request (the input, the system prompt or the tools) in a new run, or "
        "run again to ask again",
        body=kept_masked(text, mask),
    )


def nothing_written(name: str, reason: str, limit: str) -> ModelError:
    """The error for a turn cut off at the output token limit before it wrote any answer or call (a
    reasoning model can spend all of it thinking): journaled, an empty answer would end the run for good."""
    return ModelError(
        f"model {name!r} reached its output token limit (finish reason {reason!r}) before it wrote any "
        f"answer (a reasoning model may spend it all on thinking); nothing was journaled: raise {limit}, "
        "then run again"
    )


def unknown_end(name: str, what: str, reason: str, mask: Mask, hint: str = "") -> ModelError:
    """The error for a turn that ended for a reason bide does not know: it may be partial, or no answer at
    all, and journaled as the final answer it would end the run for good. The reason is server text,
    shown by `excerpt`."""
    return ModelError(
        f"model {name!r} ended its turn with the {what} {excerpt(reason, mask, 100)}, which bide does not "
        "know: the answer may be partial or not an answer at all, so nothing was journaled and the run is "
        f"not finished; run again to ask again{hint}"
    )


def absent_arguments(tools: Sequence[ToolSpec], tool: str) -> dict[str, Any] | str:
    """The arguments of a call of `tool` that came without any (absent, null or empty text): {} when the
    request declares `tool` without parameters; else "", text that is not a JSON object, so the model is
    told its arguments are invalid and the tool does not run (as {} it would run on its defaults)."""
    for spec in tools:
        if spec.name == tool:
            return {} if _takes_nothing(spec.parameters) else ""
    return ""


def _takes_nothing(schema: Any) -> bool:
    """Whether an argument schema takes nothing: an object with no properties, none required and no others
    allowed (pydantic's for a model without fields, which leaves additionalProperties out when it ignores
    other keys and sets it false when it forbids them)."""
    return (
        isinstance(schema, dict)
        and schema.get("type") == "object"
        and not schema.get("properties")
        and not schema.get("required")
        and schema.get("additionalProperties", False) is False
        and not any(key in schema for key in ("patternProperties", "anyOf", "oneOf", "allOf", "$ref"))
    )


def too_many_calls(name: str) -> ModelError:
    """The error for a turn with more tool calls than `MAX_TOOL_CALLS` (the rest of it is not read)."""
    return ModelError(
        f"model {name!r} sent more than {MAX_TOOL_CALLS} tool calls in one turn, bide's limit; nothing was "
        "journaled: run again to ask again (and ask the model for fewer calls at a time)"
    )
