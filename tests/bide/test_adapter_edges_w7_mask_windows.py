"""Masking the API key in what an error shows, at the edges of the window it masks: a text that masking
shrinks (many copies of the key) is masked far enough that no key cut at the window's raw end shows in
part; "&" and a long run of letters is read in linear time; a long escape a hostile server pads is not kept
in the readers' caches."""

from __future__ import annotations

from bide import _http
from bide._http import cut_masked, mask_key, shown_masked

KEY = "sk-proj-Q7vT2mXk9LpR4wYz8NbC3dFh6JsG1aEu5oIy0rMq"  # 48 characters
LIMIT = 2000


def keys_then_a_key_at_the_window_end() -> str:
    """Copies of the key (each masked to 3 characters) filling the first masked window, then a key whose
    first 15 characters are the last of that window: shown raw once masking shrank the window."""
    margin = _http._MASK_MARGIN
    unit = KEY + " "
    copies = (LIMIT + margin - 15) // len(unit)
    pad = LIMIT + margin - copies * len(unit) - 15
    text = unit * copies + "x" * pad + KEY + " tail" + "y" * 3000
    assert text[LIMIT + margin - 15 : LIMIT + margin] == KEY[:15]
    return text


def mask(text: str) -> str:
    return mask_key(text, KEY)


def test_a_key_cut_at_the_raw_end_of_a_shrunk_window_is_not_shown_in_part() -> None:
    text = keys_then_a_key_at_the_window_end()
    for shown in (shown_masked(text, mask, LIMIT), cut_masked(text, mask, LIMIT)):
        assert KEY[:15] not in shown  # before: "...xxxsk-proj-Q7vT2mX"
        assert KEY[:8] not in shown
        assert "***" in shown
    assert cut_masked(text, mask, LIMIT).endswith("characters)")


def test_a_text_masking_does_not_shrink_is_masked_in_one_window() -> None:
    seen: list[int] = []

    def counting(text: str) -> str:
        seen.append(len(text))
        return mask(text)

    text = "y" * 100_000 + KEY
    assert shown_masked(text, counting, LIMIT) == "y" * LIMIT
    assert seen == [LIMIT + _http._MASK_MARGIN]


def test_an_ampersand_before_a_long_run_of_letters_is_one_short_site() -> None:
    # Read as one site, every opening of it was tried: quadratic in the run (80,000 letters took seconds).
    site = _http._decoding().search("x &" + "a" * 80_000 + " y")
    assert site is not None
    assert len(site.group()) <= 33
    assert mask_key("x &" + "a" * 80_000 + " " + KEY, KEY).endswith(" ***")


def test_a_long_padded_reference_is_read_but_not_remembered() -> None:
    padded = "&#x" + "0" * 60_000 + "73;"
    before = _http._read_short_site.cache_info().currsize
    assert _http._read_site(padded) == "s"
    assert _http._read_short_site.cache_info().currsize == before
    # Still masked through it: the key's first character written as that padded reference.
    assert mask_key("say " + padded + KEY[1:] + " end", KEY) == "say *** end"
