"""A driver whose clock is behind the others' (within the clock skew margin), driving one charge whose
synchronous tool overruns its timeout: the process keeps the run's lease renewed until the call returns.

    python skew_child.py URL PREFIX OFFSET_S LEASE_TTL_S EFFECTS STARTED RELEASE

The tool writes STARTED when it begins, waits until RELEASE exists (the parent creates it once it has seen
the call overrun its 2 s timeout for long enough; at most 60 s) and appends one line to EFFECTS. The
timeout leaves a loaded machine room to start the call (a synchronous call starts only inside its window,
once a worker thread picks it up). The drive's outcome is printed as JSON: the overrun halts it
(OutcomeUnknown)."""

from __future__ import annotations

import json
import os
import sys
import time

from child_harness import signal_parent

import bide
from bide.testing import ScriptedModel, call, reply


def main() -> None:
    url, prefix, offset, ttl, effects, started, release = sys.argv[1:8]
    skew = float(offset)

    @bide.tool(timeout=2.0)
    def charge(customer: str) -> str:
        """Charge a customer."""
        signal_parent(started, "started")
        give_up = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < give_up:
            time.sleep(0.01)
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
