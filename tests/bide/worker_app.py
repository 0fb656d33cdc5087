"""An app for the worker tests: `bide worker --app worker_app:build`, and a driver to kill.

    python worker_app.py STORE_URL PREFIX RUN_IDS     drive the runs (the parent SIGKILLs this process)

Each run charges twice (two side-effect calls) and answers. A charge appends "<run id> <n>" to the ledger
file $WORKER_LEDGER (one line per real fire, fsynced); the tool's reconciler looks the call up there, so
a call whose driver died in the window is decided from the ledger. Settings from the environment:
WORKER_MODEL_DELAY (seconds per model turn), WORKER_LEASE_TTL (seconds).
"""

from __future__ import annotations

import asyncio
import os
import sys

import bide
from bide.testing import ScriptedModel, call, reply

LEDGER = os.environ.get("WORKER_LEDGER", "ledger.txt")


def _fire(line: str) -> None:
    with open(LEDGER, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _in_ledger(line: str) -> bool:
    return os.path.exists(LEDGER) and line in open(LEDGER).read().splitlines()


async def charge(run_id: str, n: int) -> str:
    """Charge a customer (a real side effect: one ledger line)."""
    _fire(f"{run_id} {n}")
    return f"charged {n}"


def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
    args = attempt.arguments
    assert isinstance(args, dict)
    line = f"{args['run_id']} {args['n']}"
    if _in_ledger(line):
        return bide.Outcome.succeeded(f"charged {args['n']}", evidence="ledger")
    return bide.Outcome.not_started(evidence="not in the ledger")


CHARGE = bide.Tool.from_function(charge, name="charge", timeout=0.5, reconcile=reconcile)


class PerRunModel:
    """A scripted model per run (the run id is in the request), so one agent serves every run."""

    name = "per-run"

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
        run = request.run_id
        script = ScriptedModel(
            [call("charge", run_id=run, n=1), call("charge", run_id=run, n=2), reply(f"{run} done")],
            delay=self.delay,
        )
        return await script.complete(request)


def build(store: bide.Store) -> bide.Agent:
    return bide.Agent(
        PerRunModel(float(os.environ.get("WORKER_MODEL_DELAY", "0"))),
        store=store,
        tools=[CHARGE],
        name="payments",
        lease_ttl=float(os.environ.get("WORKER_LEASE_TTL", "1.0")),
        clock_skew=0.1,
    )


def main() -> None:
    url, prefix, run_ids = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    store = bide.open_store(url, table_prefix=prefix)
    agent = build(store)

    async def drive_all() -> None:
        await asyncio.gather(*(agent.run(r, f"charge {r}") for r in run_ids), return_exceptions=True)

    print("driving", flush=True)
    asyncio.run(drive_all())


if __name__ == "__main__":
    main()
