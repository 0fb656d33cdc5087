"""A resolution names the attempt its decider looked up (docs/guarantee.md, rule 11).

Alice and Bob both find nothing in the system of record for a call that halted. Alice resolves it as not
started; the next drive calls the tool again, which fires and then fails in a way that leaves its outcome
unknown. Bob's resolution, decided from what he saw before, arrives now: applied to whatever attempt is
live, "not started" would have the next drive fire the call a second time. It is refused, in the library
and on the command line, unless it names the live attempt."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


def halted_after_a_retry(store: bide.Store, fired: list[str]) -> bide.OutcomeUnknown:
    """Run "r" to its second halt on call c0.0 (attempt 0 halted, was resolved as not started by Alice,
    and attempt 2 fired and halted); returns that halt. The agent's clock runs a minute behind: the
    deadlines its markers record have passed already on the wall clock, by which resolvers judge them,
    while each call had all its 30 s to start (a synchronous call starts only inside its window, once a
    worker thread picks it up: a short timeout, waited out, could close before that on a loaded machine)."""

    def charge(cents: int) -> str:
        """Charge a card."""
        if tries:  # the first try fails before it charges; the second charges, then fails
            fired.append("charged")
        tries.append(1)
        raise RuntimeError("the connection dropped after the request was sent")

    tries: list[int] = []

    def agent() -> bide.Agent:
        tool = bide.Tool.from_function(charge, timeout=30)
        model = ScriptedModel([call("charge", cents=5), reply("done")])
        return bide.Agent(model, store=store, tools=[tool], clock=lambda: time.time() - 60)

    with pytest.raises(bide.OutcomeUnknown) as first:
        agent().run_sync("r", "charge")
    assert first.value.attempt == 0
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started(), clock_skew=0)  # Alice
    with pytest.raises(bide.OutcomeUnknown) as second:
        agent().run_sync("r", "charge")
    assert fired == ["charged"]
    return second.value


def test_a_stale_resolution_is_refused_and_one_naming_the_live_attempt_is_recorded() -> None:
    store = bide.open_store("memory://")
    fired: list[str] = []
    halt = halted_after_a_retry(store, fired)
    assert halt.attempt == 2 and "attempt=2" in str(halt)
    assert bide.run_status(store, "r").attempt == 2
    not_started = bide.Outcome.not_started()
    with pytest.raises(bide.AttemptChanged, match="was tried more than once") as unnamed:  # Bob's, late
        bide.resolve_halt(store, "r", "c0.0", outcome=not_started, clock_skew=0)
    assert unnamed.value.attempt == 2 and "attempt=2" in str(unnamed.value)
    with pytest.raises(bide.AttemptChanged, match="was tried again since attempt 0"):
        bide.resolve_halt(store, "r", "c0.0", outcome=not_started, clock_skew=0, attempt=0)
    assert bide.run_status(store, "r").status == "halted"  # nothing was written
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.succeeded("charged"), clock_skew=0, attempt=2)

    def charge(cents: int) -> str:
        """Charge a card (must not be called again)."""
        raise AssertionError("charged twice")

    model = ScriptedModel([call("charge", cents=5), reply("done")])
    tool = bide.Tool.from_function(charge, timeout=0.05)
    assert bide.Agent(model, store=store, tools=[tool]).run_sync("r", "charge").answer == "done"
    assert fired == ["charged"]


def test_bide_resolve_refuses_a_stale_outcome_and_takes_the_attempt_bide_show_names(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = bide.open_store(url)
    try:
        halted_after_a_retry(store, [])
    finally:
        store.close()

    def bide_cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bide._cli", *args, "--store", url]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    shown = bide_cli("show", "r")
    assert shown.returncode == 0 and "attempt 2, attempted" in shown.stdout and "--attempt 2" in shown.stdout
    stale = bide_cli("resolve", "r", "c0.0", "--not-started", "--clock-skew", "0")
    assert stale.returncode == 5, stale.stderr
    assert "was tried more than once" in stale.stderr and "--attempt 2" in stale.stderr
    older = bide_cli("resolve", "r", "c0.0", "--not-started", "--attempt", "0", "--clock-skew", "0")
    assert older.returncode == 5 and "tried again since attempt 0" in older.stderr
    bad = bide_cli("resolve", "r", "c0.0", "--not-started", "--attempt", "two")
    assert bad.returncode == 2 and "attempts are numbered 0, 1, 2" in bad.stderr
    done = bide_cli("resolve", "r", "c0.0", "--succeeded", '"charged"', "--attempt", "2", "--clock-skew", "0")
    assert done.returncode == 0, done.stderr
    records = json.loads(bide_cli("show", "r", "--json").stdout)["records"]
    [result] = [r["record"] for r in records if r["key"] == "result:c0.0"]
    assert (result["result"], result["reconciled"]) == ("charged", True)
