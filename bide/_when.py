"""Times as people read them: ISO 8601 in UTC, and how far away ("in 42 s", "3 s ago")."""

from __future__ import annotations

import datetime as _dt
import time

__all__ = ["iso", "when"]


def iso(ts: float) -> str:
    """Unix seconds as ISO 8601 UTC with milliseconds: ``2026-12-01T14:19:32.120Z``."""
    moment = _dt.datetime.fromtimestamp(ts, tz=_dt.UTC)
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
