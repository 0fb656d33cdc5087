"""An app for the operations tests: `bide worker --app ops_app:build`, and `python ops_app.py URL PREFIX RUN`
to leave a run crashed (its first model turn fails) for the worker to resume.

Resumed, the run calls `effect` once and answers. `effect` is a side effect that appends "start" and "end"
lines to $OPS_EFFECT_LOG around a sleep of $OPS_EFFECT_SECONDS (default 0); a coroutine with
$OPS_EFFECT_ASYNC=1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

import bide
from bide.testing import Fail, ScriptedModel, call, reply


def _log(line: str) -> None:
    with open(os.environ.get("OPS_EFFECT_LOG", "effects.log"), "a") as f:
        f.write(line + "\n")


@bide.tool(safety=bide.ReadOnly)
def peek(order: str) -> str:
    """Look an order up."""
    return "open"


@bide.tool
def effect(order: str) -> str:
    """A side effect that takes a while."""
    _log(f"start {order}")
    time.sleep(float(os.environ.get("OPS_EFFECT_SECONDS", "0")))
    _log(f"end {order}")
    return "done"


@bide.tool(name="effect", timeout=300)
async def async_effect(order: str) -> str:
    """The same side effect, written as a coroutine (used when $OPS_EFFECT_ASYNC is 1)."""
    _log(f"start {order}")
    await asyncio.sleep(float(os.environ.get("OPS_EFFECT_SECONDS", "0")))
    _log(f"end {order}")
    return "done"


def build(store: bide.Store) -> bide.Agent:
    script = ScriptedModel([call("peek", order="o"), call("effect", order="o"), reply("finished")])
    chosen = async_effect if os.environ.get("OPS_EFFECT_ASYNC") == "1" else effect
    return bide.Agent(script, store=store, tools=[peek, chosen], name="ops", lease_ttl=1.0)


def crash(url: str, prefix: str, run_id: str) -> None:
    """Start `run_id` and let its second model turn fail: the run is left for a worker."""
    store = bide.open_store(url, table_prefix=prefix)
    try:
        agent = bide.Agent(
            ScriptedModel([call("peek", order="o"), Fail(bide.ModelError("model down"))]),
            store=store,
            tools=[peek, effect],
            name="ops",
        )
        with contextlib.suppress(bide.ModelError):
            agent.run_sync(run_id, "go")
    finally:
        store.close()


if __name__ == "__main__":
    crash(sys.argv[1], sys.argv[2], sys.argv[3])
