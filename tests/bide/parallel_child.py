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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bide
from bide.testing import Call, ScriptedModel, Turn, reply

POINT = os.environ.get("BIDE_TEST_PAUSE_AT", "")
SIGNAL = os.environ.get("BIDE_TEST_SIGNAL", "")


def pause() -> None:
    tmp = SIGNAL + ".tmp"
    with open(tmp, "w") as f:
        f.write(POINT)
    os.replace(tmp, SIGNAL)
    while True:  # blocks the event loop: no deadline fires, nothing else of the drive runs
        time.sleep(1)


class Watch:
    """Passes every call to the real store; sets `a_done` once a's result is journaled."""

    def __init__(self, inner: bide.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.a_done = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], **options: Any
    ) -> list[bide.Entry]:
        out: list[bide.Entry] = await self.inner.ainsert_many(run_id, items, **options)
        if any(k == "result:c0.0" for k, _ in items):
            self.a_done.set()
        return out


def main() -> None:
    url, run_id, effects = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    store = bide.open_store(url)

    async def drive() -> dict[str, Any]:
        watch = Watch(store)
        c_started = asyncio.Event()

        def fire(name: str) -> None:
            with open(effects / name, "a") as f:
                f.write("fired\n")
                f.flush()
                os.fsync(f.fileno())

        async def act(name: str) -> str:
            """Act on the world (the side effect)."""
            if POINT and name == "c":
                c_started.set()
                await asyncio.sleep(3600)
            if POINT and name == "b":
                await watch.a_done.wait()
                await c_started.wait()
                if POINT == "after_b":
                    fire(name)
                pause()
            fire(name)
            return f"{name} done"

        tool = bide.Tool.from_function(act, timeout=2.0)
        model = ScriptedModel([Turn(calls=tuple(Call("act", {"name": n}) for n in "abc")), reply("done")])
        agent = bide.Agent(model, store=watch, tools=[tool], lease_ttl=1.0, lease_wait=10.0)  # type: ignore[arg-type]
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
