"""A call is decided only once its deadline plus its driver's clock-skew margin has passed.

Agents given `clock_skew=5` (their clocks may be up to 5 s apart) wrote markers whose deadline a person's
`bide resolve`, at its default margin of 1 s, took as past 1 s after it on the resolver's clock: a driver
whose clock was 4.5 s behind was still calling the tool, "not started" was accepted, and the next drive
fired the call a second time. The marker now records its driver's margin, and every decider (a resolver, a
reconciler of another agent, a cancel) waits the larger of its own and that one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide
from bide.testing import ScriptedModel, call, reply

T0 = 1_800_000_000.0
TIMEOUT = 30.0
DEADLINE = T0 + TIMEOUT


@bide.tool(timeout=TIMEOUT)
async def wire() -> str:
    """Send a wire (its outcome is lost)."""
    raise ConnectionResetError("lost after sending")


def halted(store: bide.Store, run_id: str, *, at: float = T0, clock_skew: float = 5.0) -> None:
    """`run_id` halted on its wire's unknown outcome, driven at `at` by an agent given `clock_skew`."""
    agent = bide.Agent(
        ScriptedModel([call("wire"), reply("sent")]), store=store, tools=[wire], name="a",
        clock=lambda: at, clock_skew=clock_skew,
    )  # fmt: skip
    with pytest.raises(bide.OutcomeUnknown):
        agent.run_sync(run_id, "pay")


def test_a_resolution_at_a_smaller_margin_waits_for_the_drivers(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path}/runs.db")
    try:
        halted(store, "r")
        # 2 s past the deadline: past the resolver's 1 s, not the driver's 5 s.
        with pytest.raises(bide.HaltInFlight, match=r"plus 5 s clock skew") as refused:
            bide.resolve_halt(
                store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=1.0,
                clock=lambda: DEADLINE + 2,
            )  # fmt: skip
        assert refused.value.retry_after == DEADLINE + 5
        assert bide.run_status(store, "r").status == "halted"
        bide.resolve_halt(
            store, "r", "c0.0", outcome=bide.Outcome.failed("never arrived"), clock_skew=1.0,
            clock=lambda: DEADLINE + 5.5,
        )  # fmt: skip
        assert bide.run_status(store, "r").status != "halted"
    finally:
        store.close()


def test_a_larger_margin_of_the_resolver_still_counts(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path}/runs.db")
    try:
        halted(store, "r", clock_skew=0.5)
        with pytest.raises(bide.HaltInFlight, match=r"plus 3 s clock skew"):
            bide.resolve_halt(
                store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=3.0,
                clock=lambda: DEADLINE + 2,
            )  # fmt: skip
    finally:
        store.close()


def test_another_agents_reconciler_is_asked_only_past_the_drivers_margin(tmp_path: Path) -> None:
    """An agent given the default margin (1 s) resumes the run of one given 5 s: its reconciler is not
    asked until the deadline plus 5 s."""
    store = bide.open_store(f"sqlite:///{tmp_path}/runs.db")
    asked: list[float] = []
    now = [DEADLINE + 2]

    def lookup(info: bide.AttemptInfo) -> bide.Outcome:
        asked.append(now[0])
        return bide.Outcome.failed("the bank has no such wire")

    reconciled = bide.Tool.from_function(wire.fn, name="wire", timeout=TIMEOUT, reconcile=lookup)
    try:
        halted(store, "r")
        other = bide.Agent(
            ScriptedModel([call("wire"), reply("told")]), store=store, tools=[reconciled], name="a",
            clock=lambda: now[0],
        )  # fmt: skip
        with pytest.raises(bide.OutcomeUnknown, match="its reconciler may decide it from"):
            other.run_sync("r", "pay")
        assert asked == []
        now[0] = DEADLINE + 5.5
        assert other.run_sync("r", "pay").answer == "told"
        assert asked == [DEADLINE + 5.5]
    finally:
        store.close()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bide._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_bide_resolve_and_show_go_by_the_drivers_margin(tmp_path: Path) -> None:
    """On the wall clock: the deadline passed 2 s ago, and the driver was given 30 s of skew."""
    url = f"sqlite:///{tmp_path}/runs.db"
    store = bide.open_store(url)
    try:
        halted(store, "r", at=time.time() - TIMEOUT - 2, clock_skew=30.0)
    finally:
        store.close()
    shown = cli("show", "--store", url, "r")
    assert shown.returncode == 0, shown.stderr
    assert "(--clock-skew 1, raised to the 30 s its driver was given; --attempt 0)" in shown.stdout
    refused = cli("resolve", "--store", url, "r", "c0.0", "--not-started", "--json")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert "plus 30 s clock skew" in refused.stdout + refused.stderr
    listed = cli("show", "--store", url, "r", "--json")
    assert json.loads(listed.stdout)["run"]["status"] == "halted"
