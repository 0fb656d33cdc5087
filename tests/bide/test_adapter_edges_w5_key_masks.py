"""The API key is masked where a server quotes it (a) HTML-escaped (``&amp;``, ``&#43;``, ``&#x2B;``,
``&sol;``), (b) split across the ``data:`` lines of one server-sent event (joined with a line break), and
(c) in part: any run of 16 of its consecutive characters (half of a key shorter than 32, 8 at the least)
is masked, as it stands or escaped. A key shorter than 8 characters is still not masked, and an
OpenAI-style hint ("sk-...6789", 4 characters) is left as it is."""

from __future__ import annotations

import asyncio
import html
import json
import string
import urllib.parse
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from raw_http import StartServer, one_turn

import bide

# A key with characters HTML, JSON, repr and URLs each escape.
KEY = "sk-AbCd/EfGhIj+KlMnOp&QrSt<Uv>Wx'Yz\"0123456789=="
LONG_KEY = "sk-proj-" + "".join(string.ascii_letters[i % 52] + str(i % 10) for i in range(46))  # 100


def _model(kind: str, url: str, key: str = KEY) -> bide.Model:
    retry = bide.RetryPolicy(attempts=1)
    if kind == "openai":
        return bide.OpenAIModel("m", api_key=key, base_url=f"{url}/v1", retry=retry, timeout=10)
    return bide.AnthropicModel("m", api_key=key, base_url=url, retry=retry, timeout=10)


def _http(body: bytes, status: bytes = b"200 OK", kind: bytes = b"text/event-stream") -> bytes:
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: " + kind + b"\r\nconnection: close\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode() + body
    )


def _failure(model: bide.Model, stream: bool) -> bide.ModelError:
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, stream))
    return caught.value


def mask_key(text: str, key: str) -> str:
    """`text` as a model with the API key `key` shows it in its errors."""
    return bide.OpenAIModel("m", api_key=key, base_url="http://127.0.0.1:9/v1")._redacted(text)


def _runs(key: str, length: int) -> list[str]:
    return [key[i : i + length] for i in range(len(key) - length + 1)]


# -- (a) HTML-escaped -------------------------------------------------------------------------------------

HTML_FORMS: dict[str, Callable[[str], str]] = {
    "named": lambda k: html.escape(k),  # &amp; &lt; &gt; &quot; &#x27;
    "decimal": lambda k: "".join(f"&#{ord(c)};" for c in k),
    "hex": lambda k: "".join(f"&#x{ord(c):X};" for c in k),
    "hex, lower, zeros": lambda k: "".join(f"&#x00{ord(c):x};" for c in k),
    "html5 names": lambda k: k.replace("/", "&sol;").replace("+", "&plus;").replace("=", "&equals;"),
    "no semicolons": lambda k: k.replace("&", "&amp").replace("<", "&lt").replace("+", "&#43"),
}


@pytest.mark.parametrize("form", list(HTML_FORMS))
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_key_an_html_error_page_escapes_is_masked(kind: str, form: str, raw_server: StartServer) -> None:
    """Before, each form was shown whole: the mask knew the key as it is, as JSON, repr and URLs write it."""
    escaped = HTML_FORMS[form](KEY)
    assert html.unescape(escaped) == KEY  # what a browser, or anyone, reads it as
    page = f"<html><body><h1>401</h1><p>Invalid key: {escaped}</p></body></html>".encode()
    reply = _http(page, b"401 Unauthorized", b"text/html")
    server = raw_server(lambda conn: conn.sendall(reply))
    error = _failure(_model(kind, server.url), False)
    for shown in (str(error), error.body or ""):
        assert "Invalid key: ***</p>" in shown, shown
        assert not any(run in html.unescape(shown) for run in _runs(KEY, 16))


# -- (b) split across the data lines of one event ---------------------------------------------------------


@pytest.mark.parametrize("split", [3, 10, 24, len(KEY) - 2])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_key_across_two_data_lines_is_masked(kind: str, split: int, raw_server: StartServer) -> None:
    """An event's data lines are joined with a line break: the key stood in the message with one inside
    it, and was shown (its repr: "sk-AbCd/EfGh\\nIj+...")."""
    quoted = json.dumps(f"invalid key {KEY} given")  # the key as the server's JSON writes it
    at = quoted.index("sk-") + split
    event = f"data: {{\"error\": {{\"message\": {quoted[:at]}\ndata: {quoted[at:]}}}}}\n\n".encode()
    reply = _http(event)
    server = raw_server(lambda conn: conn.sendall(reply))
    said = str(_failure(_model(kind, server.url), True))
    assert "invalid key ***" in said and "given" in said, said
    flat = said.replace("\\n", "").replace("\\\\", "\\")
    assert not any(run in flat or json.dumps(run)[1:-1] in flat for run in _runs(KEY, 8)), said


def test_a_key_across_several_lines_and_blank_ones_is_masked() -> None:
    broken = "\n".join([KEY[:5], KEY[5:9], "", KEY[9:30], KEY[30:]])
    assert mask_key(f"key: {broken}!", KEY) == "key: ***!"
    assert mask_key(repr([f"key: {broken}!"]), KEY) == "['key: ***!']"
    assert mask_key(f"key: {KEY[:20]}\r\n{KEY[20:]}!", KEY) == "key: ***!"


# -- (c) a part of the key --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_first_40_characters_of_a_long_key_are_masked(kind: str, raw_server: StartServer) -> None:
    """Before, a server echoing the key's first 40 of 100 characters had them shown: only the whole key
    was masked. An OpenAI-style hint of its last 4 stays."""
    said_by_server = f"Incorrect API key provided: {LONG_KEY[:40]}...; your key ends sk-...{LONG_KEY[-4:]}"
    body = json.dumps({"error": {"message": said_by_server}}).encode()
    reply = _http(body, b"401 Unauthorized", b"application/json")
    server = raw_server(lambda conn: conn.sendall(reply))
    error = _failure(_model(kind, server.url, LONG_KEY), False)
    assert f"Incorrect API key provided: ***...; your key ends sk-...{LONG_KEY[-4:]}" in str(error), error
    assert LONG_KEY[:16] not in str(error) + (error.body or "")


@pytest.mark.parametrize(
    ("length", "run"), [(8, 8), (9, 8), (16, 8), (20, 10), (31, 15), (32, 16), (100, 16), (300, 16)]
)
def test_the_shortest_run_masked(length: int, run: int) -> None:
    """The rule, at its edges: a run of `run` consecutive characters is masked anywhere in the key, one
    fewer is not."""
    key = "".join(string.ascii_letters[(7 * i) % 52] for i in range(length))
    for start in range(length - run + 1):
        assert mask_key(f"<{key[start : start + run]}>", key) == "<***>"
        if run > 1:
            assert mask_key(f"<{key[start : start + run - 1]}>", key) == f"<{key[start : start + run - 1]}>"


def test_a_key_shorter_than_8_characters_is_not_masked() -> None:
    assert mask_key("the key abcdefg is wrong", "abcdefg") == "the key abcdefg is wrong"


# -- the law: however a server quotes a run of the key, no 16 of its characters are shown ----------------

ENCODINGS: dict[str, Callable[[str], str]] = {
    "raw": lambda c: c,
    "json": lambda c: json.dumps(c)[1:-1],
    "json unicode": lambda c: f"\\u{ord(c):04x}",
    "escaped slash": lambda c: "\\/" if c == "/" else json.dumps(c)[1:-1],
    "repr": lambda c: repr(c)[1:-1],
    "percent": lambda c: urllib.parse.quote(c, safe=""),
    "html": lambda c: html.escape(c),
    "html decimal": lambda c: f"&#{ord(c)};",
    "html hex": lambda c: f"&#x{ord(c):x};",
}
PRINTABLE = string.ascii_letters + string.digits + string.punctuation


@st.composite
def _quoted_runs(draw: Any) -> tuple[str, str, list[str], list[int]]:
    key = draw(st.text(PRINTABLE, min_size=8, max_size=120))
    shortest = min(len(key), max(8, min(16, len(key) // 2)))
    start = draw(st.integers(0, len(key) - shortest))
    end = draw(st.integers(start + shortest, len(key)))
    encode = ENCODINGS[draw(st.sampled_from(list(ENCODINGS)))]
    pieces = [encode(c) for c in key[start:end]]
    breaks = draw(st.lists(st.integers(1, len(pieces) - 1), max_size=3)) if len(pieces) > 1 else []
    for at in sorted(set(breaks), reverse=True):
        pieces.insert(at, draw(st.sampled_from(["\n", "\r\n", "\n\n"])))
    return key, draw(st.text(PRINTABLE + " \n", max_size=40)), pieces, [start, end]


@settings(max_examples=400, deadline=None)
@given(_quoted_runs(), st.text(PRINTABLE + " \n", max_size=40))
# A stray backslash before the run: read first, "\\" took the backslash of "\u003a" (":"), and the run was
# shown (found by hypothesis).
@example((":" + "0" * 19, "\\", [f"\\u{ord(c):04x}" for c in ":" + "0" * 9], [0, 10]), "")
def test_no_run_of_the_key_survives_however_it_is_quoted(
    quoted: tuple[str, str, list[str], list[int]], after: str
) -> None:
    key, before, pieces, _ = quoted
    text = before + "".join(pieces) + after
    masked = mask_key(text, key)
    shortest = min(len(key), max(8, min(16, len(key) // 2)))
    # Every window of `shortest` characters of the run, as the server wrote it (breaks and all), is gone.
    chars = [i for i, piece in enumerate(pieces) if piece not in ("\n", "\r\n", "\n\n")]
    for first in range(len(chars) - shortest + 1):
        window = "".join(pieces[chars[first] : chars[first + shortest - 1] + 1])
        assert window not in masked, (text, masked)
    assert "***" in masked


@pytest.mark.parametrize(
    ("key", "before", "run"),
    [
        # "\\" took the backslash of "\u003a" (":"): "u003a" was left as it stands (found by hypothesis).
        (":" + "0" * 19, "\\", "".join(f"\\u{ord(c):04x}" for c in ":" + "0" * 9)),
        # "%41" read as "A": the run's "1" was gone.
        ("1bcd/efgA", "%4", "1bcd%2Fefg"),
        # "&lt;" read as "<": the run's "lt;" was gone.
        ('lt;ab"cd<', "&", "lt;ab&quot;cd"),
        # An HTML page leaves a key's backslashes as they stand: read as JSON's, three were two.
        ('0000\\\\\\"', "", "0000\\\\\\&quot;"),
        # A long run of odd backslashes: read in other pairs, it was cut short after as many characters as the
        # key and a run hold (16, 36) before the run, and its last pair, which took the run's backslash, was
        # skipped as read already: "u0061" and "u003a" were left as they stand (found by fuzzing).
        ("abcdefgh", "\\" * 17, "".join(f"\\u{ord(c):04x}" for c in "abcdefgh")),
        (":" + "0" * 19, "\\" * 31, "".join(f"\\u{ord(c):04x}" for c in ":" + "0" * 9)),
    ],
)
def test_a_run_is_masked_however_what_stands_before_it_is_read(key: str, before: str, run: str) -> None:
    """Before, escapes were found from the left only, all kinds at once: an escape begun before a quoted
    run (after a stray backslash, "%4", "&") took its first character, and the run was shown."""
    assert mask_key(f"{before}{run}.", key) == f"{before}***."


@settings(max_examples=200, deadline=None)
@given(st.text(PRINTABLE, min_size=8, max_size=60), st.text(string.printable, max_size=200))
def test_text_that_holds_no_character_of_the_key_is_left_as_it_is(key: str, text: str) -> None:
    other = "".join(c for c in text if c not in key and c not in "\\%&")
    assert mask_key(other, key) == other
