"""Times as people read them (ISO 8601 in UTC, and how far away: "in 42 s", "3 s ago"), and durations as
callers give them (`seconds`, which refuses what no clock arithmetic can use)."""

from __future__ import annotations

import datetime as _dt
import math
import time

from ._errors import ConfigError

__all__ = ["iso", "seconds", "when"]

_TINY = math.ulp(0.0)  # the least duration above 0
MAX_SECONDS = 10**7  # about 116 days: longer than any lease, window or margin, and far from overflowing ms


def seconds(name: str, value: object, *, zero: bool = True) -> float:
    """`value` as a duration in seconds: a finite number from 0 (from just above 0 with `zero=False`) to
    `MAX_SECONDS`; anything else raises ConfigError naming `name`. NaN matters most: every comparison
    with it is false, so a NaN margin would let a deadline pass at once."""
    if type(value) is float and (0.0 if zero else _TINY) <= value <= MAX_SECONDS:
        return value  # the common case (a float in range; NaN fails the comparison), decided at once
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if number and (0.0 if zero else _TINY) <= value <= MAX_SECONDS:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    floor = "0 or more" if zero else "more than 0"
    raise ConfigError(f"{name} must be a number of seconds, {floor}, at most {MAX_SECONDS:,}; got {value!r}")


def iso(ts: float) -> str:
    """Unix seconds as ISO 8601 UTC with milliseconds: ``2026-12-01T14:19:32.120Z``; a time no date can
    hold (past the year 9999, or not a number) as its seconds: ``1e+15 s after the Unix epoch``."""
    try:
        moment = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{ts:g} s after the Unix epoch"
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def when(ts: float, now: float | None = None) -> str:
    """``2026-12-01T14:20:14.000Z (in 42 s)``: the time and its distance from `now` (default: the clock)."""
    now = time.time() if now is None else now
    delta = ts - now
    if abs(delta) < 0.05:
        rel = "now"
    elif delta > 0:
        rel = f"in {_span(delta)}"
    else:
        rel = f"{_span(-delta)} ago"
    return f"{iso(ts)} ({rel})"


def _span(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
