"""Child process for the thread and stream SIGKILL tests.

    python thread_child.py STORE_URL RUN_ID EFFECT_FILE MODE

Side effects append a line to EFFECT_FILE. MODE:

- ``thread``: sends a conversation thread two messages (`segment=` given, so a restart resends them
  exactly once); message 1 makes two side-effect calls. With BIDE_TEST_PAUSE_AT=<key> and
  BIDE_TEST_SIGNAL=<file>, the child writes the signal file once the journal write holding <key> has
  committed, then sleeps until the parent kills it with SIGKILL.
- ``stream``: streams a run with two side-effect calls, printing one JSON line per event as it comes (and
  sleeping forever after the event named by BIDE_TEST_STOP_AFTER, for the parent to kill it).
- ``run``: drives the same run to its end with `run`.

Prints the outcome as the last JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from child_harness import HookedStore, append_line, signal_parent, wait_for_kill

import bide
from bide.testing import ScriptedModel, StreamingScriptedModel, call, reply

PAUSE_AT = os.environ.get("BIDE_TEST_PAUSE_AT", "")
SIGNAL = os.environ.get("BIDE_TEST_SIGNAL", "")
STOP_AFTER = os.environ.get("BIDE_TEST_STOP_AFTER", "")


def pause_after(keys: list[str]) -> None:
    """After the write holding the key PAUSE_AT: signal the parent and wait to be killed."""
    if PAUSE_AT and PAUSE_AT in keys:
        signal_parent(SIGNAL, PAUSE_AT)
        wait_for_kill()


def main() -> None:
    url, run_id, effect, mode = sys.argv[1:5]

    async def append(text: str) -> str:
        """Append a line to the effect file (the side effect)."""
        append_line(effect, text)
        return "appended"

    tool = bide.Tool.from_function(append, name="append_line", timeout=1.0)
    store = bide.open_store(url)
    out: dict[str, Any]
    try:
        if mode == "thread":
            model = ScriptedModel(
                [
                    call("append_line", text="m0"),
                    reply("message 0 done"),
                    call("append_line", text="m1 first"),
                    call("append_line", text="m1 second"),
                    reply("message 1 done"),
                ]
            )
            agent = bide.Agent(
                model,
                store=HookedStore(store, after=pause_after),  # type: ignore[arg-type]
                tools=[tool],
                lease_ttl=1.0,
                lease_wait=10.0,
            )
            thread = agent.thread(run_id)

            async def converse() -> list[str]:
                first = await thread.send("hello", segment=0)
                second = await thread.send("do two things", segment=1)
                return [first.answer, second.answer]

            out = {"outcome": "completed", "answers": asyncio.run(converse())}
        else:
            model = StreamingScriptedModel(
                [
                    call("append_line", text="s first"),
                    call("append_line", text="s second"),
                    reply("all appended"),
                ],
                chunk=4,
            )
            agent = bide.Agent(model, store=store, tools=[tool], lease_ttl=1.0, lease_wait=10.0)
            if mode == "run":
                out = {"outcome": "completed", "answer": agent.run_sync(run_id, "append twice").answer}
            else:

                async def stream() -> None:
                    async for event in agent.stream(run_id, "append twice"):
                        line = {"type": type(event).__name__, "replayed": getattr(event, "replayed", False)}
                        if isinstance(event, bide.ToolCallFinished):
                            line["call_id"] = event.call_id
                        print(json.dumps(line), flush=True)
                        if line["type"] + ":" + str(line.get("call_id", "")) == STOP_AFTER:
                            wait_for_kill()

                asyncio.run(stream())
                out = {"outcome": "completed"}
    except bide.OutcomeUnknown as halt:
        out = {"outcome": "halted", "call_id": halt.call_id}
    finally:
        store.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
