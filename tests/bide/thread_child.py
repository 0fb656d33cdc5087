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
import time
from collections.abc import Sequence
from typing import Any

import bide
from bide.testing import ScriptedModel, StreamingScriptedModel, call, reply

PAUSE_AT = os.environ.get("BIDE_TEST_PAUSE_AT", "")
SIGNAL = os.environ.get("BIDE_TEST_SIGNAL", "")
STOP_AFTER = os.environ.get("BIDE_TEST_STOP_AFTER", "")


def wait_for_kill() -> None:
    while True:
        time.sleep(1)


class PausingStore:
    """Passes every call to the real store; after the write holding the key PAUSE_AT, signals and waits."""

    def __init__(self, inner: bide.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ainsert_many(
        self, run_id: str, items: Sequence[tuple[str, bytes]], **options: Any
    ) -> list[bide.Entry]:
        out = await self.inner.ainsert_many(run_id, items, **options)
        if PAUSE_AT and any(k == PAUSE_AT for k, _ in items):
            with open(SIGNAL + ".tmp", "w") as f:
                f.write(PAUSE_AT)
            os.replace(SIGNAL + ".tmp", SIGNAL)
            wait_for_kill()
        return out


def main() -> None:
    url, run_id, effect, mode = sys.argv[1:5]

    async def append_line(text: str) -> str:
        """Append a line to the effect file (the side effect)."""
        with open(effect, "a") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        return "appended"

    tool = bide.Tool.from_function(append_line, timeout=1.0)
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
                model, store=PausingStore(store), tools=[tool], lease_ttl=1.0, lease_wait=10.0  # type: ignore[arg-type]
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
