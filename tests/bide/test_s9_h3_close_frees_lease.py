"""A drive stopped by its store's close() frees its run's lease on the way out, when no call of it may still
be running: another process takes the run at once instead of waiting out lease_ttl. While a side effect
of the drive runs, the lease stays held (at most once comes first).

Before: the close refused the drive's release like any other request, so a restart elsewhere met
RunInFlight ("being driven by another driver") for the whole lease_ttl (ten minutes here).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import bide
from bide.testing import ScriptedModel, call, reply

BOUND = 60.0  # seconds: only ever reached by a hang

# Process A: drives run "r" (lease_ttl 600 s) and closes its store between turns (in the model's second
# turn, after the side effect's result was journaled); the drive ends in the store's refusal.
_CLOSES_BETWEEN_TURNS = """
import asyncio, sys
import bide
from bide.testing import ScriptedModel, call, reply

url, prefix, effects, how = sys.argv[1:5]
store = bide.open_store(url, table_prefix=prefix)

@bide.tool
def charge(amount: int) -> str:
    '''Charge (a side effect).'''
    with open(effects, "a") as f:
        f.write("charged\\n")
    return "charged"

def closing(request):
    store.close()
    return reply("done")

agent = bide.Agent(ScriptedModel([call("charge", amount=5), closing]), store=store, tools=[charge],
                   lease_ttl=600.0)
try:
    if how == "sync":
        agent.run_sync("r", "charge 5")
    else:
        asyncio.run(agent.run("r", "charge 5"))
except bide.StoreError as exc:
    print("stopped:", exc)
"""

# Process A: closes its store while its async side effect is running, and lets the effect return only
# when told to (a line on stdin).
_CLOSES_UNDER_A_CALL = """
import asyncio, sys
import bide
from bide.testing import ScriptedModel, call, reply

url, prefix = sys.argv[1:3]
store = bide.open_store(url, table_prefix=prefix)

@bide.tool
async def charge(amount: int) -> str:
    '''Charge (a side effect).'''
    store.close()
    print("charging", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    return "charged"

agent = bide.Agent(ScriptedModel([call("charge", amount=5), reply("done")]), store=store, tools=[charge],
                   lease_ttl=600.0)
try:
    asyncio.run(agent.run("r", "charge 5"))
except bide.StoreError as exc:
    print("stopped:", exc)
"""


def _charging(store: bide.Store, fired: list[int]) -> bide.Agent[str]:
    @bide.tool
    def charge(amount: int) -> str:
        """Charge (a side effect)."""
        fired.append(amount)
        return "charged"

    return bide.Agent(ScriptedModel([call("charge", amount=5), reply("done")]), store=store, tools=[charge])


def _env() -> dict[str, str]:
    repo = str(Path(bide.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}


def test_a_run_whose_drive_a_close_stopped_between_turns_is_taken_at_once_elsewhere(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = durable_store_spec
    effects = tmp_path / "effects"
    for how in ("async", "sync"):
        run_prefix = f"{prefix[:-1]}{how[0]}_"
        done = subprocess.run(
            [sys.executable, "-c", _CLOSES_BETWEEN_TURNS, url, run_prefix, str(effects), how],
            capture_output=True, text=True, timeout=4 * BOUND, env=_env(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "stopped:" in done.stdout and "is closed" in done.stdout, done.stdout
        store = bide.open_store(url, table_prefix=run_prefix)
        fired: list[int] = []
        try:
            # lease_wait 0 (the default): a lease still held would be RunInFlight here, for ten minutes.
            result = asyncio.run(_charging(store, fired).run("r", "charge 5"))
        finally:
            store.close()
        assert result.status == "completed" and result.answer == "done"
        assert fired == []  # journaled by A: not fired again
    assert effects.read_text().splitlines() == ["charged", "charged"]  # once per store


def test_a_close_under_a_running_side_effect_keeps_the_lease_while_it_runs(
    durable_store_spec: tuple[str, str],
) -> None:
    url, prefix = durable_store_spec
    closer = subprocess.Popen(
        [sys.executable, "-c", _CLOSES_UNDER_A_CALL, url, prefix],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert closer.stdout is not None and closer.stdin is not None
        assert closer.stdout.readline() == "charging\n"
        store = bide.open_store(url, table_prefix=prefix)
        fired: list[int] = []
        try:
            try:
                asyncio.run(_charging(store, fired).run("r", "charge 5"))
            except bide.RunInFlight:
                taken = False
            else:
                taken = True
        finally:
            store.close()
        assert not taken and fired == [], "the run was taken while its side effect was still running"
        closer.stdin.write("go\n")
        closer.stdin.flush()
        out, err = closer.communicate(timeout=BOUND)
    finally:
        if closer.poll() is None:
            closer.kill()
            closer.wait()
    assert closer.returncode == 0, err
    assert "stopped:" in out and "ran and returned" in out, out


# Process A: its synchronous side effect (timeout 1.5 s) closes the store as it starts, then runs for 4 s,
# past its deadline; lease_ttl 1 s. The drive must keep the lease renewed while the call runs, and past its
# deadline a keeper must (both through the closing store), until the call has returned and its outcome is
# journaled.
_CLOSES_UNDER_A_SYNC_CALL = """
import sys, time
import bide
from bide.testing import ScriptedModel, call, reply

url, prefix, effects = sys.argv[1:4]
store = bide.open_store(url, table_prefix=prefix)

def charge(amount: int) -> str:
    '''Charge (a side effect).'''
    store.close()
    print("charging", flush=True)
    time.sleep(4.0)
    with open(effects, "a") as f:
        f.write("charged by A\\n")
    return "charged"

tool = bide.Tool.from_function(charge, timeout=1.5)
agent = bide.Agent(ScriptedModel([call("charge", amount=5), reply("done")]), store=store, tools=[tool],
                   lease_ttl=1.0, clock_skew=0.2)
try:
    agent.run_sync("r", "charge 5")
except bide.BideError as exc:
    print("stopped:", type(exc).__name__)
"""


def test_a_close_under_a_synchronous_call_keeps_its_lease_renewed_until_it_returns_past_its_deadline(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """Before: the closing store refused the drive's renewals, and five seconds after close() it closed for
    good under the running call, so the keeper could not renew either: the lease lapsed, another driver took
    the run, its reconciler found no effect yet (the call was still running) and said not started, and the
    side effect fired twice."""
    url, prefix = durable_store_spec
    effects = tmp_path / "effects"
    effects.touch()

    def charge(amount: int) -> str:
        """Charge (a side effect)."""
        with effects.open("a") as f:
            f.write("charged by B\n")
        return "charged"

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        if "charged" in effects.read_text():
            return bide.Outcome.succeeded("charged")
        return bide.Outcome.not_started()

    closer = subprocess.Popen(
        [sys.executable, "-c", _CLOSES_UNDER_A_SYNC_CALL, url, prefix, str(effects)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        assert closer.stdout is not None
        assert closer.stdout.readline() == "charging\n"
        store = bide.open_store(url, table_prefix=prefix)
        tool = bide.Tool.from_function(charge, timeout=1.5, reconcile=reconcile)
        model = ScriptedModel([call("charge", amount=5), reply("done")])
        agent = bide.Agent(model, store=store, tools=[tool], lease_ttl=1.0, clock_skew=0.2)
        try:
            until = time.monotonic() + BOUND
            while True:
                try:
                    result = agent.run_sync("r", "charge 5")
                    break
                except (bide.RunInFlight, bide.OutcomeUnknown):
                    # (OutcomeUnknown: A's call is in doubt until its reconciler may decide, after its
                    # deadline; run again then, as a worker does)
                    assert time.monotonic() < until, "the run was never taken"
                    time.sleep(0.1)
        finally:
            store.close()
        _, err = closer.communicate(timeout=BOUND)
    finally:
        if closer.poll() is None:
            closer.kill()
            closer.wait()
    assert closer.returncode == 0, err
    assert effects.read_text().splitlines() == ["charged by A"]  # once: B took the run once A's was journaled
    assert result.status == "completed" and result.answer == "done"
