"""Child process for the contention tests: drives runs whose side effect appends a line to a file.

    python contention_child.py STORE_URL PREFIX EFFECT_DIR RUN_IDS [OPTIONS as JSON]

Each run charges once: its tool appends "<run id>" to EFFECT_DIR/<run id> (one line per real fire) and,
for `started_after_deadline`, notes when it really started. Options (JSON object):

- model_delay: seconds the scripted model sleeps per turn;
- timeout: the tool's timeout; sync (bool): a synchronous tool (run in a worker thread); work: seconds the
  tool works; threads: size of the default thread pool;
- lease_ttl, lease_wait: the agent's lease settings; reconcile_lag: give the tool a reconciler whose
  system of record (the effect files) shows a fire only after that many seconds;
- go: a start-barrier file.

Prints one JSON line: {run id: outcome}, outcome one of completed, halted, in_flight, not_started.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import bide
from bide.testing import ScriptedModel, call, reply


def main() -> None:
    url, prefix, effect_dir, run_ids = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4].split(",")
    opts: dict[str, Any] = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    work = float(opts.get("work", 0.0))

    def fire(run_id: str) -> str:
        # The time the call started, taken first: opening the file can wait behind other processes' fsyncs
        # for longer than is left of a 50 ms window (seen once in CI: 0.18 ms past the deadline).
        started = time.time()
        with open(effect_dir / run_id, "a") as f:
            f.write(f"{started}\n")
            f.flush()
            os.fsync(f.fileno())
        return "charged"

    async def charge_async(run_id: str) -> str:
        """Charge (async)."""
        out = fire(run_id)
        await asyncio.sleep(work)
        return out

    def charge_sync(run_id: str) -> str:
        """Charge (sync)."""
        out = fire(run_id)
        time.sleep(work)
        return out

    lag = opts.get("reconcile_lag")

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome | None:
        path = effect_dir / attempt.run_id
        seen = path.read_text().split() if path.exists() else []
        if any(float(t) <= time.time() - lag for t in seen):
            return bide.Outcome.succeeded("charged", evidence="ledger")
        return bide.Outcome.not_started(evidence="not in the ledger (yet)")

    fn = charge_sync if opts.get("sync") else charge_async
    tool = bide.Tool.from_function(
        fn,
        name="charge",
        timeout=float(opts.get("timeout", 5.0)),
        reconcile=reconcile if lag is not None else None,
    )
    store = bide.open_store(url, table_prefix=prefix)
    go = opts.get("go")
    if go:
        Path(f"{go}.ready.{os.getpid()}").touch()
        while not os.path.exists(go):
            time.sleep(0.001)

    async def one(run_id: str) -> str:
        model = ScriptedModel(
            [call("charge", run_id=run_id), reply("done")], delay=float(opts.get("model_delay", 0.0))
        )
        agent = bide.Agent(
            model,
            store=store,
            tools=[tool],
            lease_ttl=float(opts.get("lease_ttl", 30.0)),
            lease_wait=float(opts.get("lease_wait", 0.0)),
            clock_skew=float(opts.get("clock_skew", 1.0)),
        )
        try:
            result = await agent.run(run_id, "charge")
        except bide.OutcomeUnknown:
            return "halted"
        except bide.RunInFlight:
            return "in_flight"
        except bide.ToolNotStarted:
            return "not_started"
        assert result.answer == "done"
        return "completed"

    async def all_runs() -> dict[str, str]:
        if opts.get("threads"):
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(int(opts["threads"])))
        outcomes = await asyncio.gather(*(one(r) for r in run_ids))
        return dict(zip(run_ids, outcomes, strict=True))

    try:
        outcomes = asyncio.run(all_runs())
        # A synchronous call that ran past its deadline is journaled by a keeper thread when it returns.
        for thread in threading.enumerate():
            if thread.name.startswith("bide-overrun"):
                thread.join(timeout=60)
        print(json.dumps(outcomes), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
