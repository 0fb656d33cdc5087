"""Child process for the parallel SIGKILL test: one turn with three side effects run in parallel.

    python parallel_child.py STORE_URL RUN_ID EFFECT_DIR

Each call `act(name)` appends a line to EFFECT_DIR/<name> (one line per real fire). With
BIDE_TEST_PAUSE_AT=<point> and BIDE_TEST_SIGNAL=<file>, the calls are choreographed so the kill lands
between two side effects of the turn:

- "a" fires and returns at once; its result is journaled;
- "c" is claimed (its marker journaled) and then waits, never firing;
- "b" waits until a's result is journaled and c has started; at point "between" it signals before it fires,
  at point "after_b" it fires first. Then the process blocks (its event loop too) until the parent kills it.

Without a pause point, every call just fires. Prints one JSON line: the outcome, and for a halt the call
ids that halted (the raised one first, then those in its `also`).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from child_harness import HookedStore, append_line, signal_parent, wait_for_kill

import bide
from bide.testing import Call, ScriptedModel, Turn, reply

POINT = os.environ.get("BIDE_TEST_PAUSE_AT", "")
SIGNAL = os.environ.get("BIDE_TEST_SIGNAL", "")


def main() -> None:
    url, run_id, effects = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    store = bide.open_store(url)

    async def drive() -> dict[str, Any]:
        a_done = asyncio.Event()  # set once a's result is journaled
        c_started = asyncio.Event()

        def watch(keys: list[str]) -> None:
            if "result:c0.0" in keys:
                a_done.set()

        def fire(name: str) -> None:
            append_line(effects / name, "fired")

        async def act(name: str) -> str:
            """Act on the world (the side effect)."""
            if POINT and name == "c":
                c_started.set()
                await asyncio.sleep(3600)
            if POINT and name == "b":
                await a_done.wait()
                await c_started.wait()
                if POINT == "after_b":
                    fire(name)
                signal_parent(SIGNAL, POINT)
                wait_for_kill()  # blocks the event loop: no deadline fires, nothing else of the drive runs
            fire(name)
            return f"{name} done"

        tool = bide.Tool.from_function(act, timeout=2.0)
        model = ScriptedModel([Turn(calls=tuple(Call("act", {"name": n}) for n in "abc")), reply("done")])
        watched = HookedStore(store, after=watch)
        agent = bide.Agent(model, store=watched, tools=[tool], lease_ttl=1.0, lease_wait=10.0)  # type: ignore[arg-type]
        try:
            result = await agent.run(run_id, "act")
        except bide.OutcomeUnknown as halt:
            halted = [halt.call_id, *(e.call_id for e in halt.also if isinstance(e, bide.RunHalted))]
            return {"outcome": "halted", "halted": halted}
        return {"outcome": "completed", "answer": result.answer}

    try:
        out = asyncio.run(drive())
    finally:
        store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
