"""One retry policy for everything bide retries: tools that may be retried, model HTTP calls, store writes.

Rules:

1. A policy only says *when* to try again (how many attempts, how long to wait); the caller says *whether* an
   exception may be retried, with a `classify` function. Retrying a side effect whose call may have started
   is never the policy's decision (docs/guarantee.md): the agent passes a classifier that refuses it.
2. The wait before attempt n+1 is exponential (`initial * multiplier**n`, at most `maximum`), with full
   jitter when `jitter` is on, and never shorter than a server's own hint (a `Retry-After` header), capped
   by `maximum`.
3. When the attempts run out, the last exception is raised unchanged; the caller words the message.

Written here rather than taken from tenacity or stamina: both fit the waiting, but the classifier must
return a server's hint with its verdict and the async and sync paths (agent loop, store writes) must share
one wait formula that tests can drive with a fake clock; that is these thirty lines.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["NO_RETRY", "RETRY", "Classify", "RetryPolicy", "Waiting"]

T = TypeVar("T")

RETRY = True
"""A classifier's verdict: retry after the policy's own wait."""
NO_RETRY = False
"""A classifier's verdict: raise now."""

Classify = Callable[[BaseException], "bool | float"]
"""Maps an exception to False (raise it now), True (retry) or a number: retry, waiting at least that many
seconds (a server's `Retry-After`)."""

Waiting = Callable[[BaseException, "float | None", float], None]
"""Told of each retry just before its wait: the exception, the server's hint (None when the classifier gave
none) and the seconds about to be waited, which say whether `maximum` cut the hint short."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """How often and how patiently to retry. `attempts` counts every try, the first one too (1: no retry)."""

    attempts: int = 3
    initial: float = 0.1
    maximum: float = 10.0
    multiplier: float = 2.0
    jitter: bool = True

    def __post_init__(self) -> None:
        from ._errors import ConfigError  # a ValueError too
        from ._when import seconds

        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ConfigError(f"RetryPolicy.attempts must be at least 1, got {self.attempts!r}")
        seconds("RetryPolicy.initial", self.initial)
        seconds("RetryPolicy.maximum", self.maximum)
        multiplier = self.multiplier
        if not isinstance(multiplier, (int, float)) or not 1 <= multiplier <= 1000:  # NaN fails too
            raise ConfigError(f"RetryPolicy.multiplier must be a number from 1 to 1000, got {multiplier!r}")

    def wait(self, retry: int, hint: float | None = None, *, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first retry), at least `hint` (capped)."""
        # The exponent is capped: a long deadline can reach thousands of retries, and 2.0**1024 overflows.
        ceiling = min(self.maximum, self.initial * self.multiplier ** min(retry, 64))
        delay = (rng or random).uniform(0, ceiling) if self.jitter else ceiling
        if hint is not None:
            delay = max(delay, min(hint, self.maximum))
        return delay

    async def run(
        self, attempt: Callable[[], Awaitable[T]], classify: Classify, waiting: Waiting | None = None
    ) -> T:
        """Await `attempt()` until it returns, the classifier refuses its exception, or attempts run out;
        `waiting` is told of each retry before its wait."""
        for retry in range(self.attempts):
            try:
                return await attempt()
            except Exception as exc:
                verdict = classify(exc)
                if verdict is False or retry == self.attempts - 1:
                    raise
                hint = None if verdict is True else float(verdict)
                delay = self.wait(retry, hint)
                if waiting is not None:
                    waiting(exc, hint, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def run_sync(self, attempt: Callable[[], T], classify: Classify, waiting: Waiting | None = None) -> T:
        """`run` for blocking code (store writes): the same waits, with `time.sleep`."""
        for retry in range(self.attempts):
            try:
                return attempt()
            except Exception as exc:
                verdict = classify(exc)
                if verdict is False or retry == self.attempts - 1:
                    raise
                hint = None if verdict is True else float(verdict)
                delay = self.wait(retry, hint)
                if waiting is not None:
                    waiting(exc, hint, delay)
                time.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")
