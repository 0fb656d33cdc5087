"""Child for the paused-driver cancel test: drives one run whose side effect stops the whole process
(SIGSTOP, as a long GC pause or a suspended VM would) once it has fired, until the parent's SIGCONT.

    python cancel_paused_child.py STORE_URL PREFIX RUN_ID

Prints "fired" when the effect has fired (just before it stops), then one JSON line once the drive ends:
{"status": ..., "answer": ...} or {"error": <exception class>, "message": ...}. CHARGE_TIMEOUT in the
environment is the tool's timeout in seconds (60 by default).
"""

from __future__ import annotations

import json
import os
import signal
import sys

import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(timeout=float(os.environ.get("CHARGE_TIMEOUT", "60")))
def charge(cents: int) -> str:
    """Charge a card."""
    print("fired", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # until the parent's SIGCONT, long past this driver's lease
    return f"charged {cents}"


def main() -> None:
    url, prefix, run_id = sys.argv[1:4]
    store = bide.open_store(url, table_prefix=prefix)
    script = [call("charge", cents=500), reply("charged")]
    agent = bide.Agent(ScriptedModel(script), store=store, tools=[charge], lease_ttl=1.0)
    try:
        result = agent.run_sync(run_id, "charge 500")
        outcome = {"status": result.status, "answer": result.answer}
    except bide.BideError as exc:
        outcome = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps(outcome), flush=True)
    store.close()


if __name__ == "__main__":
    main()
