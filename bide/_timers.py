"""Durable timers: a tool the model calls to wait, whose wake-up time is journaled.

`bide.timer()` makes a tool (named "wait" unless you name it) that takes `seconds`. Its first call
journals a timer record with the wake-up time (the call's time plus `seconds`), then:

- a wait of at most `inline` seconds is slept in the drive itself (the run keeps its lease);
- a longer one pauses the run: the drive raises `bide.RunSleeping` (status "sleeping", `wake_at`) and frees
  its lease, and the run is driven again after its wake-up time (a `bide.Worker` does it within one poll
  interval).

A resumed run reads the journaled wake-up time and waits only for what is left, never from zero; once it
has passed, the call's result ("waited until <time>") is journaled and the model goes on. The timer is
not a side effect: it changes nothing outside the journal.

A journaled wake-up time is kept whatever the tool is when the run resumes: only a call that has no timer
record yet is checked against `max_seconds` (an app restarted with a lower bound, or an upgrade that
forced one, must not wake a sleeping run at once), and a call whose timer tool was renamed or removed since
still sleeps until its journaled time (waiting in the drive up to `DEFAULT_INLINE` seconds).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, create_model

from ._errors import ConfigError
from ._tools import ReadOnly, Tool

__all__ = ["TimerTool", "timer"]

# How long a timer waits in the drive itself, by default; also the bound for a journaled timer whose tool
# the agent no longer has.
DEFAULT_INLINE = 1.0
DEFAULT_MAX_SECONDS = 366 * 24 * 3600.0
# The longest wait a timer may allow: a century. Its wake-up must stay a time that clocks, dates and
# milliseconds can hold (a wait of 1e15 s wakes in the year 31,690,765, past every date type).
LIMIT_MAX_SECONDS = 100 * DEFAULT_MAX_SECONDS


class TimerTool(Tool):
    """A durable timer as a tool (see `bide.timer`); the agent runs it itself, never calls `fn`."""

    def __init__(self, *, name: str, description: str, inline: float, max_seconds: float) -> None:
        number = isinstance(inline, int | float) and not isinstance(inline, bool)
        if not (number and 0 <= inline <= LIMIT_MAX_SECONDS):
            raise ConfigError(
                f"inline must be a number of seconds from 0 to {LIMIT_MAX_SECONDS:,.0f} (a century); got "
                f"{inline!r}"
            )
        if not (
            isinstance(max_seconds, int | float)
            and not isinstance(max_seconds, bool)
            and 0 < max_seconds <= LIMIT_MAX_SECONDS
        ):
            raise ConfigError(
                f"max_seconds must be a positive number of seconds, at most {LIMIT_MAX_SECONDS:,.0f} (a "
                f"century); got {max_seconds!r}"
            )
        args: type[BaseModel] = create_model(
            "WaitArguments",
            seconds=(float, Field(gt=0, le=max_seconds, description="how long to wait, in seconds")),
        )
        super().__init__(name=name, description=description, args=args, fn=_never_called, safety=ReadOnly)
        self.inline = float(inline)
        self.max_seconds = float(max_seconds)


def _never_called(args: Any) -> Any:
    raise AssertionError("a timer tool is run by the agent itself")  # pragma: no cover


def timer(
    name: str = "wait",
    *,
    description: str = "Wait for the given number of seconds before going on (for example, to follow up "
    "later). The wait survives restarts.",
    inline: float = DEFAULT_INLINE,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> TimerTool:
    """A durable timer tool: the model calls it with `seconds`; the wake-up time is journaled, waits up to
    `inline` seconds happen in the drive, longer ones pause the run (`RunSleeping`) until it is due."""
    return TimerTool(name=name, description=description, inline=inline, max_seconds=max_seconds)
