"""The one retry policy: waits grow, honour a server's hint, and the classifier decides what is retried."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bide import ConfigError, RetryPolicy


@given(
    retry=st.integers(min_value=0, max_value=5000),
    hint=st.none() | st.floats(min_value=0, max_value=1e6),
    seed=st.integers(),
)
def test_wait_is_bounded_and_honours_the_hint(retry: int, hint: float | None, seed: int) -> None:
    policy = RetryPolicy(initial=0.05, maximum=3.0, multiplier=2.0)
    delay = policy.wait(retry, hint, rng=random.Random(seed))
    assert 0 <= delay <= policy.maximum
    ceiling = min(policy.maximum, 0.05 * 2.0 ** min(retry, 64))
    assert delay <= max(ceiling, min(hint or 0, policy.maximum)) + 1e-12
    if hint is not None:
        assert delay >= min(hint, policy.maximum)


def test_without_jitter_the_waits_double_up_to_the_maximum() -> None:
    policy = RetryPolicy(initial=0.5, maximum=3.0, multiplier=2.0, jitter=False)
    assert [policy.wait(n) for n in range(4)] == [0.5, 1.0, 2.0, 3.0]


def test_run_retries_only_what_the_classifier_allows() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not yet")
        return "done"

    policy = RetryPolicy(attempts=3, initial=0, jitter=False)
    assert asyncio.run(policy.run(flaky, lambda exc: isinstance(exc, ConnectionRefusedError))) == "done"
    assert len(calls) == 3

    calls.clear()
    with pytest.raises(ConnectionRefusedError):
        asyncio.run(policy.run(flaky, lambda exc: False))
    assert len(calls) == 1


def test_run_sync_raises_the_last_exception_when_attempts_run_out() -> None:
    calls: list[int] = []

    def always() -> None:
        calls.append(1)
        raise TimeoutError(f"attempt {len(calls)}")

    with pytest.raises(TimeoutError, match="attempt 2"):
        RetryPolicy(attempts=2, initial=0).run_sync(always, lambda exc: 0.0)
    assert len(calls) == 2


def test_a_policy_without_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)


@pytest.mark.parametrize(
    "options",
    [{"initial": float("nan")}, {"maximum": float("inf")}, {"initial": -1.0}, {"multiplier": float("nan")}],
)
def test_a_policy_that_is_not_made_of_durations_is_refused(options: dict[str, float]) -> None:
    """A NaN wait slept for no time at all (every comparison with it is false); an infinite one forever."""
    with pytest.raises(ConfigError, match=next(iter(options))):
        RetryPolicy(**options)
