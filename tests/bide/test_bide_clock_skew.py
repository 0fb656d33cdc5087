"""Drivers whose clocks differ by less than the clock skew margin (docs/guarantee.md, "Clocks").

A lease's expiry is written on its holder's clock. Before, another driver took a lease at that bare
expiry on its own clock: a holder 0.9 s behind (within the default 1 s margin) with a 1 s lease looked
expired 0.1 s after each renewal, so while its synchronous call overran its timeout, another driver
took the run, decided the call (`resolve` as not started, exit 0) and fired it again: 2 fires in 6 of 6
runs. A fresh lease is now granted over another holder's only once its expiry is the margin past.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from child_harness import finish, spawn, wait_for_file

import bide
from bide.testing import ScriptedModel, call, reply

CHILD = Path(__file__).with_name("skew_child.py")


def test_a_lagging_drivers_overrunning_call_is_neither_decided_nor_fired_again(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = durable_store_spec
    effects, started, release = tmp_path / "effects", tmp_path / "started", tmp_path / "release"
    lagging = spawn(CHILD, url, prefix, "-0.9", "1.0", str(effects), str(started), str(release))
    try:
        wait_for_file(started, [lagging])
        store = bide.open_store(url, table_prefix=prefix)
        try:
            # The call runs until the test releases it. From the moment its deadline (on the lagging clock)
            # and the resolver's 1 s margin have passed, it overruns, and only the lease keeps others out.
            records = bide.Journal(store, "skewed").load().records()
            [marker] = [r for r in records if isinstance(r, bide.Attempt)]
            since = marker.deadline_ms / 1000 + 1.0
            time.sleep(max(0.0, since - time.time()))
            fired: list[str] = []

            @bide.tool(timeout=0.5)
            def charge(customer: str) -> str:
                """Charge a customer."""
                fired.append(customer)
                return "charged"

            model = ScriptedModel([call("charge", customer="alice"), reply("done")])
            other = bide.Agent(model, store=store, tools=[charge], lease_ttl=1.0)
            tries = 0
            # For 2 s (six renewals of the 1 s lease, every 1/3 s) and at least five tries, however slowly
            # they go: every moment between renewals, not one that happens to follow a renewal.
            while (time.time() - since < 2.0 or tries < 5) and time.time() - since < 30:
                with pytest.raises(bide.RunInFlight):
                    other.run_sync("skewed", "charge alice")
                not_started = bide.Outcome.not_started(evidence="no charge in the ledger")
                with pytest.raises(bide.HaltInFlight, match="being driven by another driver"):
                    bide.resolve_halt(store, "skewed", "c0.0", outcome=not_started)
                tries += 1
                time.sleep(0.05)
            assert fired == [] and tries >= 5
        finally:
            release.touch()
            store.close()
        result, _ = finish(lagging)
    finally:
        if lagging.poll() is None:
            lagging.kill()
            lagging.wait()
    assert result["outcome"] == "OutcomeUnknown"  # the overrun halts the drive; the call did return
    assert effects.read_text().splitlines() == ["alice"]


def test_lease_wait_is_measured_on_a_local_clock_not_the_agents(tmp_path: Path) -> None:
    """`lease_wait` is a local wait: a wall clock stepped back an hour while a drive waits for another
    driver's lease no longer makes it wait an hour more (it was measured on the agent's clock)."""
    store = bide.open_store(f"sqlite:///{tmp_path / 'bide.db'}")
    try:
        store.lease("busy", "another-driver", now_ms=int(time.time() * 1000), ttl_ms=120_000)
        steps = iter([0.0])

        def stepped_back() -> float:  # the first reading, then an hour earlier (an NTP step)
            return time.time() + next(steps, -3600.0)

        agent = bide.Agent(ScriptedModel([reply("again")]), store=store, clock=stepped_back, lease_wait=1.0)
        began = time.monotonic()

        async def drive() -> None:
            await asyncio.wait_for(agent.run("busy", "hi"), timeout=20)

        with pytest.raises(bide.RunInFlight):
            asyncio.run(drive())
        assert time.monotonic() - began < 10
    finally:
        store.close()
