"""A driver whose clock is behind the others' (within the clock skew margin), driving one charge whose
synchronous tool overruns its timeout: the process keeps the run's lease renewed until the call returns.

    python skew_child.py URL PREFIX OFFSET_S LEASE_TTL_S EFFECTS STARTED

The tool writes STARTED when it begins, sleeps 2.5 s (its timeout is 0.5 s) and appends one line to
EFFECTS. The drive's outcome is printed as JSON: the overrun halts it (OutcomeUnknown)."""

from __future__ import annotations

import json
import sys
import time

from child_harness import signal_parent

import bide
from bide.testing import ScriptedModel, call, reply


def main() -> None:
    url, prefix, offset, ttl, effects, started = sys.argv[1:7]
    skew = float(offset)

    @bide.tool(timeout=0.5)
    def charge(customer: str) -> str:
        """Charge a customer."""
        signal_parent(started, "started")
        time.sleep(2.5)
        with open(effects, "a") as f:
            f.write(f"{customer}\n")
        return "charged"

    store = bide.open_store(url, table_prefix=prefix)
    model = ScriptedModel([call("charge", customer="alice"), reply("done")])
    agent = bide.Agent(
        model, store=store, tools=[charge], clock=lambda: time.time() + skew, lease_ttl=float(ttl)
    )
    try:
        agent.run_sync("skewed", "charge alice")
        outcome = "completed"
    except bide.BideError as exc:
        outcome = type(exc).__name__
    store.close()
    print(json.dumps({"outcome": outcome}))


if __name__ == "__main__":
    main()
