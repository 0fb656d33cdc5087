"""A decider interrupted between its two writes (its claim of the call committed, its outcome never
written: killed, or the second write failed) decided nothing: the attempt to decide is still the one that
really ran.

A decider's claim is an attempt marker of its own (by "resolver"), stamped with the decider's time and no
call made under it. It was taken for the live attempt: the next reconciler was asked about it (a window in
which nothing was charged), answered "not started" truthfully for that window, and the call, which had
fired under the attempt before, fired again. The halt named that claim too, and resolving the attempt that
really ran was refused as "tried again since"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import bide
from bide._journal import Journal
from bide._records import Attempt, attempt_key
from bide._when import iso
from bide.testing import ScriptedModel, call, reply

HERE = Path(__file__).resolve().parent


class TimedLedger:
    """A payment provider's records: when each charge was made, so a decider can look an attempt up by
    its window (from its start to its deadline), as `AttemptInfo` invites."""

    def __init__(self) -> None:
        self.charged_at: list[float] = []

    def tool(self, **kwargs: Any) -> bide.Tool:
        ledger = self

        def charge_card(cents: int) -> str:
            """Charge a card."""
            ledger.charged_at.append(time.time())
            raise RuntimeError("the connection dropped after the request was sent")

        return bide.Tool.from_function(charge_card, **kwargs)

    def tool_that_answers(self, **kwargs: Any) -> bide.Tool:
        def charge_card(cents: int) -> str:
            """Charge a card."""
            self.charged_at.append(time.time())
            return "charged"

        return bide.Tool.from_function(charge_card, **kwargs)

    def reconcile(self, attempt: bide.AttemptInfo) -> bide.Outcome:
        """Decide by the attempt's own window: a charge made inside it is that attempt's."""
        slack = 1.0
        inside = [t for t in self.charged_at if attempt.attempted_at - slack <= t <= attempt.deadline + slack]
        return bide.Outcome.succeeded("charged") if inside else bide.Outcome.not_started()


def _agent(store: bide.Store, tool: bide.Tool, clock: Any = time.time, **options: Any) -> bide.Agent:
    """An agent on one machine's clock: no skew margin, as the resolutions here are given (a resolution
    waits at least the margin the call's driver was given)."""
    model = ScriptedModel([call("charge_card", cents=5), reply("done")])
    options.setdefault("clock_skew", 0)
    return bide.Agent(model, store=store, tools=[tool], clock=clock, **options)


def _halted(store: bide.Store, ledger: TimedLedger) -> bide.OutcomeUnknown:
    """Run "r" until its charge fired and its outcome was lost (attempt 0)."""
    with pytest.raises(bide.OutcomeUnknown) as halt:
        _agent(store, ledger.tool(timeout=0.5)).run_sync("r", "charge")
    assert halt.value.attempt == 0 and len(ledger.charged_at) == 1
    return halt.value


def _claim_of_an_interrupted_decider(store: bide.Store, at: float) -> None:
    """What a decider leaves that committed its claim and was killed before it wrote its outcome."""
    journal = Journal(store, "r").load()
    first = journal.get(attempt_key("c0.0", 0))
    assert isinstance(first, Attempt)
    at_ms = int(at * 1000)
    journal.write(
        [
            Attempt(
                key=attempt_key("c0.0", 1),
                call_id="c0.0",
                tool=first.tool,
                arguments=first.arguments,
                gen=1,
                claim="cd" * 16,
                attempted_at_ms=at_ms,
                deadline_ms=at_ms,
                by="resolver",
            )
        ]
    )


def test_a_reconciler_is_asked_about_the_attempt_that_ran_not_an_interrupted_deciders_claim(
    store: bide.Store,
) -> None:
    ledger = TimedLedger()
    first = _halted(store, ledger)
    later = time.time() + 3600
    _claim_of_an_interrupted_decider(store, later - 60)
    asked: list[tuple[int, float]] = []

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        asked.append((attempt.attempt, attempt.attempted_at))
        return ledger.reconcile(attempt)

    tool = ledger.tool_that_answers(timeout=0.5, reconcile=reconcile)
    result = _agent(store, tool, clock=lambda: later).run_sync("r", "charge")
    assert result.answer == "done"
    assert asked == [(0, first.attempted_at)]
    assert len(ledger.charged_at) == 1  # not charged again


def test_the_halt_names_the_attempt_that_ran_and_resolving_it_is_accepted(store: bide.Store) -> None:
    ledger = TimedLedger()
    first = _halted(store, ledger)
    _claim_of_an_interrupted_decider(store, time.time())
    with pytest.raises(bide.OutcomeUnknown) as halt:
        _agent(store, ledger.tool(timeout=0.5)).run_sync("r", "charge")
    assert halt.value.attempt == 0 and halt.value.attempted_at == first.attempted_at
    assert bide.run_status(store, "r").attempt == 0
    time.sleep(0.5)  # past attempt 0's deadline
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.succeeded("charged"), attempt=0, clock_skew=0)
    result = _agent(store, ledger.tool(timeout=0.5)).run_sync("r", "charge")
    assert result.answer == "done" and len(ledger.charged_at) == 1
    # The decision went on past the interrupted claim: a claim of its own, then the outcome.
    journal = Journal(store, "r").load()
    claims = [journal.get(attempt_key("c0.0", gen)) for gen in range(3)]
    assert [c.by for c in claims if isinstance(c, Attempt)] == ["driver", "resolver", "resolver"]


def test_a_not_started_decision_for_the_attempt_that_ran_lets_the_next_drive_call_again(
    store: bide.Store,
) -> None:
    """The other answer: attempt 0 truly never reached the provider. The call is tried again once."""
    ledger = TimedLedger()
    _halted(store, ledger)
    ledger.charged_at.clear()  # (as if the provider never received it)
    _claim_of_an_interrupted_decider(store, time.time())
    time.sleep(0.5)
    bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.not_started(), attempt=0, clock_skew=0)
    result = _agent(store, ledger.tool_that_answers(timeout=5)).run_sync("r", "charge")
    assert result.answer == "done" and len(ledger.charged_at) == 1
    journal = Journal(store, "r").load()
    third = journal.get(attempt_key("c0.0", 3))
    assert isinstance(third, Attempt) and third.by == "driver"


RESOLVER_KILLED_AFTER_ITS_CLAIM = """
import os, signal, sys
import bide, bide._resolve
from bide._journal import Journal
bide._resolve.RESOLVE_LEASE_MS = 500  # the dead resolver's lease lapses quickly
writes = []
original = Journal.awrite_one
async def killed_after_the_claim(self, record):
    out = await original(self, record)
    writes.append(record.key)
    if record.key.startswith("attempt:"):
        os.kill(os.getpid(), signal.SIGKILL)  # the claim committed; the outcome is never written
    return out
Journal.awrite_one = killed_after_the_claim
store = bide.open_store(sys.argv[1])
bide.resolve_halt(store, "r", "c0.0", outcome=bide.Outcome.succeeded("charged"), clock_skew=0)
print("not killed", writes)
"""


def test_a_resolver_killed_after_its_claim_leaves_the_call_to_be_decided_for_the_attempt_that_ran(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    ledger = TimedLedger()
    first = _halted(store, ledger)
    time.sleep(0.5)  # past attempt 0's deadline
    path = os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])
    child = subprocess.run(
        [sys.executable, "-c", RESOLVER_KILLED_AFTER_ITS_CLAIM, url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    claim = Journal(store, "r").load().get(attempt_key("c0.0", 1))
    assert isinstance(claim, Attempt) and claim.by == "resolver"
    asked: list[int] = []

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        asked.append(attempt.attempt)
        return ledger.reconcile(attempt)

    tool = ledger.tool_that_answers(timeout=0.5, reconcile=reconcile)
    result = _agent(store, tool, lease_wait=30).run_sync("r", "charge")  # the dead resolver's lease lapses
    assert result.answer == "done" and asked == [0]
    assert len(ledger.charged_at) == 1 and first.attempt == 0
    store.close()


def test_bide_show_gives_the_times_of_the_attempt_it_names(tmp_path: Path) -> None:
    """It gave the journal's last attempt marker's times (an interrupted decider's claim, or another call's
    attempt), and so when `bide resolve` would accept an outcome, for the attempt it named."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    first = _halted(store, TimedLedger())
    _claim_of_an_interrupted_decider(store, first.attempted_at + 3600)
    store.close()
    path = os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")])
    shown = subprocess.run(
        [sys.executable, "-m", "bide._cli", "show", "r", "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.strip().startswith("attempt "))
    assert line.strip().startswith(f"attempt 0, attempted {iso(first.attempted_at)}")
    assert f"deadline {iso(first.deadline)}" in line
