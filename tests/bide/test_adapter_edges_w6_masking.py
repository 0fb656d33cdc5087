"""Masking the API key costs what is shown, not what came: every message masks a window of the text it
shows (plus a margin), then cuts it, so a 30 MB stream event that is not JSON no longer held the event loop
for tens of seconds; `mask_key` itself does a bounded amount of work per character whatever the key (a key
that repeats itself, "sk-test-000...", or one holding backslash-n pairs, which made its regex backtrack
exponentially). The promise stays: a key, or a run of 16 of its characters, in what is shown is masked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from raw_http import StartServer, one_turn

import bide
from bide import _http
from bide._http import excerpt, mask_key

KEY = "sk-proj-Q7vT2mXk9LpR4wYz8NbC3dFh6JsG1aEu5oIy0rMq"
ROOT = Path(__file__).resolve().parents[2]


class _Recording:
    """A mask that records the length of every text it is given."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.lengths: list[int] = []

    def __call__(self, text: str) -> str:
        self.lengths.append(len(text))
        return mask_key(text, self.key)


def _sse(data: bytes) -> bytes:
    event = b"data: " + data + b"\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
    head += b"content-length: %d\r\n\r\n"
    return head % len(event) + event


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_huge_event_that_is_not_json_is_masked_only_where_it_is_shown(
    kind: str, raw_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the whole 3 MB event was masked (30 MB took 13 s to 130 s). The key across the cut of the
    excerpt (200 characters) is masked all the same."""
    data = b"&" * 190 + KEY.encode() + b"#" * 3_000_000
    server = raw_server(lambda conn: conn.sendall(_sse(data)))
    lengths: list[int] = []
    real = mask_key

    def recorded(text: str, key: str) -> str:
        lengths.append(len(text))
        return real(text, key)

    monkeypatch.setattr(_http, "mask_key", recorded)
    cls = bide.OpenAIModel if kind == "openai" else bide.AnthropicModel
    model = cls("m", api_key=KEY, base_url=server.url + ("/v1" if kind == "openai" else ""), max_retries=0)
    with pytest.raises(bide.ModelError) as caught:
        asyncio.run(one_turn(model, True))
    message = str(caught.value)
    assert "streamed an event that is not JSON" in message
    assert "&" * 190 + "***" in message and KEY[:10] not in message, message[:400]
    assert lengths and max(lengths) < 10_000, max(lengths)


def test_every_message_helper_masks_a_bounded_window() -> None:
    """`excerpt`, `error_shown`, `failure`, `kept_masked` and `json_problem`'s masks see the shown part and
    a margin, never the whole of a long text; a key straddling each cut is masked."""
    long = "x" * 1990 + KEY + "y" * 1_000_000
    for show in (
        lambda mask: excerpt(long, mask),
        lambda mask: excerpt([long], mask),
        lambda mask: _http.error_shown(long, mask),
        lambda mask: _http.failure(ValueError(long), mask),
        lambda mask: _http.kept_masked(long, mask),
    ):
        mask = _Recording(KEY)
        shown = show(mask)
        assert max(mask.lengths) < 100_000, max(mask.lengths)
        assert KEY[:8] not in shown and KEY[-8:] not in shown


def test_a_line_that_is_not_utf8_is_masked_around_its_bad_byte_only() -> None:
    """The 20 characters on either side of the byte are shown; a key ending or starting there is masked."""
    line = b"z" * 2_000_000 + KEY.encode() + b"\xff" + KEY.encode() + b"z" * 2_000_000
    mask = _Recording(KEY)
    with pytest.raises(bide.ModelError) as caught:
        _http._utf8("m", line, mask)
    assert max(mask.lengths) < 100_000, max(mask.lengths)
    shown = str(caught.value)
    assert "***" in shown and KEY[-10:] not in shown and KEY[:10] not in shown, shown


def test_a_self_repeating_key_takes_a_bounded_number_of_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, `_runs` grew every place a piece of "a" * 200 was found once per alignment: 29 s on 1 MB.
    Counted in steps (each a slice compared in C) rather than timed: fewer than one per character."""
    steps = 0
    real = _http._longest

    def counted(holds: Any, most: int) -> int:
        def counting(n: int) -> bool:
            nonlocal steps
            steps += 1
            return bool(holds(n))

        return real(counting, most)

    monkeypatch.setattr(_http, "_longest", counted)
    for key in ("a" * 200, "sk-test-" + "0" * 28, "ab" * 50):
        shortest = min(len(key), max(8, min(16, len(key) // 2)))
        for text in ((key[: shortest - 1] + "#") * (200_000 // shortest), key[3] * 200_000):
            steps = 0
            masked = mask_key(text, key)
            assert steps < len(text), (key[:10], steps)
            assert key[:shortest] not in masked


def test_a_key_of_backslash_n_pairs_is_masked_without_backtracking() -> None:
    """A key holding "\\n" pairs (printable ASCII, taken by the model) made the regex that allowed a line
    break between any two characters backtrack exponentially: 56 characters took seconds, each 4 more about
    16 times that. Run in a child, whose hang (the old code's) fails the test."""
    code = (
        "from bide._http import mask_key\n"
        "key = 'sk-' + '\\\\n' * 30 + 'Zq'\n"
        "assert mask_key('sk-' + '\\\\n' * 60 + '!', key) == '***!'\n"
        "import json\n"
        "assert mask_key('said ' + json.dumps(key) + ' and ' + key, key) == 'said \"***\" and ***'\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.strip() == "ok", done.stderr


def _runs_by_brute_force(text: str, key: str) -> list[str]:
    """Every substring of `text` (line breaks left out) that is a run of `key` to be masked."""
    shortest = min(len(key), max(8, min(16, len(key) // 2)))
    flat = text.replace("\r", "").replace("\n", "")
    return [
        flat[i : i + shortest]
        for i in range(len(flat) - shortest + 1)
        if flat[i : i + shortest] in key
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.text("ab0-", min_size=8, max_size=40),
    st.lists(st.sampled_from(["a", "b", "0", "-", "#", "\n", "ab", "0000", "ba"]), max_size=60),
)
def test_no_run_survives_in_text_made_of_the_keys_own_characters(key: str, parts: list[str]) -> None:
    """Keys and texts from a few characters, so that runs overlap and repeat: every window of the run
    length that is part of the key is gone after masking (checked against a brute-force search)."""
    text = "".join(parts) + key[: len(key) // 2] + "\n" + key[len(key) // 2 :]
    masked = mask_key(text, key)
    assert _runs_by_brute_force(masked.replace("***", "\x00"), key) == [], (key, text, masked)


def test_a_refusal_kept_in_the_body_is_bounded() -> None:
    """The body keeps the first 64 KiB of a refusal (it kept all of it, masked as a whole: 32 MB at most),
    the key masked in it and the cut said."""
    error = _http.refused("m", "n" * 70_000 + KEY, lambda text: mask_key(text, KEY))
    assert error.body is not None and error.body.startswith("n" * 65_536 + "... (cut here, of 70,0")


def test_a_json_error_message_is_masked_as_shown() -> None:
    """`json_problem` masks what it shows of the reader's message."""
    try:
        json.loads("x" + KEY)
    except ValueError as exc:
        shown = _http.json_problem(exc, lambda text: mask_key(text, KEY))
    assert KEY not in shown
