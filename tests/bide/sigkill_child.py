"""Child process for the SIGKILL tests: one agent run with a side effect that appends a line to a file.

    python sigkill_child.py STORE_URL RUN_ID EFFECT_FILE

BIDE_TEST_PREFIX sets the SQL table prefix; with BIDE_TEST_GO=<file> the child waits for that file to exist
before it runs (a start barrier). With BIDE_TEST_PAUSE_AT=<point> and BIDE_TEST_SIGNAL=<file>, the child
writes <point> to the signal file when it reaches the point and then sleeps until the parent kills it with
SIGKILL. Points:
before_marker, before_call, inside_call, after_call, after_result, before_answer, after_end.
Prints the outcome of the run as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from child_harness import HookedStore, append_line, signal_parent, start_barrier, wait_for_kill

import bide
from bide.testing import ScriptedModel, call, reply

POINT = os.environ.get("BIDE_TEST_PAUSE_AT", "")
SIGNAL = os.environ.get("BIDE_TEST_SIGNAL", "")


def pause(point: str) -> None:
    if point == POINT:
        signal_parent(SIGNAL, point)
        wait_for_kill()


def before_write(keys: list[str]) -> None:
    if any(k.startswith("attempt:") for k in keys):
        pause("before_marker")
    if keys[0].startswith("result:"):
        pause("after_call")
    if "model:1" in keys:
        pause("before_answer")


def after_write(keys: list[str]) -> None:
    if keys[0].startswith("result:"):
        pause("after_result")
    if "run:end" in keys:
        pause("after_end")


def main() -> None:
    url, run_id, effect = sys.argv[1], sys.argv[2], sys.argv[3]

    # Async on purpose: the pauses block the event loop, so no tool timeout can fire while the parent
    # gets ready to kill the process.
    async def append(text: str) -> str:
        """Append a line to the effect file (the side effect)."""
        pause("before_call")
        append_line(effect, text)
        pause("inside_call")
        return "appended"

    tool = bide.Tool.from_function(append, name="append_line", timeout=1.0)
    store = bide.open_store(url, table_prefix=os.environ.get("BIDE_TEST_PREFIX", "bide_"))
    go = os.environ.get("BIDE_TEST_GO")
    if go:
        start_barrier(go)  # for the multi-process race
    model = ScriptedModel([call("append_line", text="charged alice 500"), reply("done")])
    # A killed driver's lease expires after a second; a restart waits for it (and a racing process for the
    # driver that holds it) up to BIDE_TEST_LEASE_WAIT seconds.
    agent = bide.Agent(
        model,
        store=HookedStore(store, before=before_write, after=after_write),  # type: ignore[arg-type]
        tools=[tool],
        lease_ttl=1.0,
        lease_wait=float(os.environ.get("BIDE_TEST_LEASE_WAIT", "10")),
    )
    try:
        result = asyncio.run(agent.run(run_id, "charge alice"))
        out: dict[str, Any] = {"outcome": "completed", "answer": result.answer}
    except bide.OutcomeUnknown as halt:
        out = {"outcome": "halted", "call_id": halt.call_id, "tool": halt.tool, "arguments": halt.arguments}
    except bide.RunInFlight:
        out = {"outcome": "in_flight"}
    finally:
        store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
