"""Child process for test_bide_async_pause.py: one run whose async side effect appends a line to a ledger.

    python async_pause_child.py STORE_URL LEDGER [SIGNAL]

BIDE_TEST_PREFIX sets the SQL table prefix. With SIGNAL, the child stops itself (SIGSTOP, as a GC pause or
a frozen VM would) where its claimed call's deadline is being set, after the attempt marker committed and
before the tool's first step, once it wrote "paused" to SIGNAL; the parent wakes it with SIGCONT. With
BIDE_TEST_PAUSE_IN_TOOL=1 it stops inside the tool instead, from a callback of its event loop while the
tool waits at an `await`, and the response the tool waits for arrives as it wakes: the tool's next step is
ready before the deadline's timer, so the pause lands at that await and nowhere else. (A pause in the
tool's own code between an await and its effect is a pause inside a synchronous call, which no deadline
can stop: docs/guarantee.md. A parent's SIGSTOP timed by a sleep landed there now and then, and the effect
fired twice.) Prints the outcome of the run as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from signal import SIGSTOP
from typing import Any

from child_harness import append_line, signal_parent

import bide
import bide._tools
from bide.testing import ScriptedModel, call, reply


def stop_where_the_deadline_is_set(signal: str) -> None:
    armed = bide._tools.run_with_deadline

    async def stopping(awaitable: Awaitable[Any], timeout: float | Callable[[], float]) -> Any:
        signal_parent(signal, "paused")
        os.kill(os.getpid(), SIGSTOP)  # until the parent's SIGCONT
        return await armed(awaitable, timeout)

    bide._tools.run_with_deadline = stopping  # type: ignore[assignment]


def main() -> None:
    url, ledger = sys.argv[1], sys.argv[2]
    in_tool = os.environ.get("BIDE_TEST_PAUSE_IN_TOOL") == "1" and len(sys.argv) > 3
    if len(sys.argv) > 3 and not in_tool:
        stop_where_the_deadline_is_set(sys.argv[3])

    def reconcile(attempt: bide.AttemptInfo) -> bide.Outcome:
        if os.path.exists(ledger) and attempt.idempotency_key in Path(ledger).read_text():
            return bide.Outcome.succeeded("charged", evidence="the ledger has the key")
        return bide.Outcome.not_started(evidence="the ledger has no line with the key")

    async def charge(cents: int) -> str:
        """Charge a card."""
        await asyncio.sleep(0.1)  # a well-behaved async tool: it awaits its provider first
        if in_tool:
            # The process stops (from the loop's next callback) while the tool waits for a response, which
            # arrives as it wakes: the tool's next step is then ready before the deadline's timer is.
            loop = asyncio.get_running_loop()
            response: asyncio.Future[None] = loop.create_future()

            def stop_then_answer() -> None:
                os.kill(os.getpid(), SIGSTOP)  # until the parent's SIGCONT
                response.set_result(None)

            loop.call_soon(stop_then_answer)
            signal_parent(sys.argv[3], "paused")
            await response
        append_line(ledger, f"{bide.current_call().idempotency_key} {os.getpid()}")
        return "charged"

    tool = bide.Tool.from_function(charge, timeout=1.0, reconcile=reconcile)
    store = bide.open_store(url, table_prefix=os.environ.get("BIDE_TEST_PREFIX", "bide_"))
    model = ScriptedModel([call("charge", cents=500), reply("Done.")])
    agent = bide.Agent(model, store=store, tools=[tool], lease_ttl=0.6, lease_wait=5.0, clock_skew=0.2)
    try:
        outcome = {"outcome": "completed", "answer": agent.run_sync("order-1", "charge 500").answer}
    except bide.BideError as exc:
        outcome = {"outcome": type(exc).__name__, "answer": str(exc)}
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
