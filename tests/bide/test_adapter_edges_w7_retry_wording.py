"""The retry log's waits: to the millisecond with their unit, and a server's hint past a year (a
`Retry-After: 1e308` put a 309-digit number of seconds in the log line) as "more than a year"."""

from __future__ import annotations

import math

from bide import _http


def test_waits_are_shown_to_the_millisecond_with_their_unit() -> None:
    assert _http._seconds_shown(1234) == "1234s"
    assert _http._seconds_shown(0.3) == "0.3s"
    assert _http._seconds_shown(0.0004) == "0s"


def test_a_hint_past_a_year_is_not_spelled_out() -> None:
    for hint in (1e308, math.inf, math.nan, 365 * 24 * 3600.0):
        assert _http._seconds_shown(hint) == "more than a year"
    assert _http._seconds_shown(365 * 24 * 3600.0 - 1) == "31535999s"
