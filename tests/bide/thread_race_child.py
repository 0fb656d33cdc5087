"""Child process for the two-drivers-of-one-thread tests: sends one message to a thread, at the same moment
as another process (a start barrier), and prints what it saw.

    python thread_race_child.py STORE_URL TABLE_PREFIX THREAD_ID EFFECT_FILE MESSAGE SEGMENT VIA LEASE_WAIT

SEGMENT is the message's index, or "-" for none; VIA is "send" or "stream". The model (`EchoModel`)
answers each message with one side-effect call `record(text=<message>)`, which appends the message to
EFFECT_FILE, then with "answered <message>". With BIDE_TEST_HOLD=model (or tool, or answer), the first
model turn of a message (or the tool, or the answering turn) writes its pid to BIDE_TEST_HELD and waits
until the file BIDE_TEST_RELEASE exists:
the parent holds the driver that got the thread's lease there while the other one tries. BIDE_TEST_GO is
the start barrier.

Prints one JSON line: {"outcome": "completed", "answer", "segment", "replayed"} (with "events" when
streamed), {"outcome": "in_flight"} (bide.RunInFlight) or {"outcome": "mismatch"} (bide.RunMismatch).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from child_harness import append_line, signal_parent, start_barrier

import bide

HOLD = os.environ.get("BIDE_TEST_HOLD", "")
HELD = os.environ.get("BIDE_TEST_HELD", "")
RELEASE = os.environ.get("BIDE_TEST_RELEASE", "")


async def hold(point: str) -> None:
    """At the hold point, tell the parent (our pid) and wait for its release."""
    if point != HOLD:
        return
    signal_parent(HELD, str(os.getpid()))
    while not os.path.exists(RELEASE):
        await asyncio.sleep(0.01)


class EchoModel:
    """Answers a message with `record(text=message)`, then with "answered <message>"; its turns depend on
    the request only, so any process can drive any message of the thread. `delay` makes it slow."""

    name = "echo"

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay

    async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
        await asyncio.sleep(self.delay)
        messages = request.messages
        turn = sum(1 for m in messages if m.role == "assistant")
        if messages[-1].role == "user":
            await hold("model")
            call = bide.ToolCall(id=f"call_{turn}", name="record", arguments={"text": messages[-1].content})
            return bide.AssistantMessage(content="", tool_calls=[call])
        await hold("answer")
        asked = next(m.content for m in reversed(messages) if m.role == "user")
        return bide.AssistantMessage(content=f"answered {asked}")


def agent(store: bide.Store, effect: str, lease_wait: float) -> bide.Agent[str]:
    """The agent every driver of the thread uses: `record` is a side effect (at most once)."""

    async def record(text: str) -> str:
        """Record a message (the side effect)."""
        await hold("tool")
        append_line(effect, text)
        return f"recorded {text}"

    tool = bide.Tool.from_function(record, timeout=60.0)
    return bide.Agent(EchoModel(), store=store, tools=[tool], lease_ttl=1.0, lease_wait=lease_wait)


def event_line(event: bide.StreamEvent) -> str:
    return f"{type(event).__name__}{'(replayed)' if getattr(event, 'replayed', False) else ''}"


def main() -> None:
    url, prefix, thread_id, effect, message, segment_arg, via, lease_wait = sys.argv[1:9]
    segment = None if segment_arg == "-" else int(segment_arg)
    store = bide.open_store(url, table_prefix=prefix)
    thread = agent(store, effect, float(lease_wait)).thread(thread_id)

    async def drive() -> dict[str, Any]:
        if via == "send":
            result = await thread.send(message, segment=segment)
            return {"answer": result.answer, "segment": result.segment, "replayed": result.replayed}
        events = [event async for event in thread.stream(message, segment=segment)]
        last = events[-1]
        assert isinstance(last, bide.Finished)
        result = last.result
        out = {"answer": result.answer, "segment": result.segment, "replayed": result.replayed}
        return {**out, "events": [event_line(e) for e in events]}

    start_barrier(os.environ["BIDE_TEST_GO"])
    try:
        out: dict[str, Any] = {"outcome": "completed", **asyncio.run(drive())}
    except bide.RunInFlight:
        out = {"outcome": "in_flight"}
    except bide.RunMismatch:
        out = {"outcome": "mismatch"}
    finally:
        store.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
