"""Child for the cancel test: drives one run whose slow model keeps calling a read-only tool.

    python cancel_child.py STORE_URL PREFIX RUN_ID

Prints "started" once the run exists, then one JSON line: {"status": ..., "answer": ..., "turns": ...}.
"""

from __future__ import annotations

import json
import sys

import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(safety=bide.ReadOnly)
def look(n: int) -> str:
    """Look at something."""
    if n == 0:
        print("started", flush=True)
    return f"saw {n}"


def main() -> None:
    url, prefix, run_id = sys.argv[1:4]
    store = bide.open_store(url, table_prefix=prefix)
    script = [call("look", n=i) for i in range(300)] + [reply("looked at everything")]
    # 300 turns of 0.1 s: 30 s for the test's `bide cancel` to land, however loaded the machine (with the
    # default max_turns, 32, the run ended at its turn limit after about 3 s when the cancel came later).
    agent = bide.Agent(ScriptedModel(script, delay=0.1), store=store, tools=[look], max_turns=400)
    result = agent.run_sync(run_id, "look around")
    print(json.dumps({"status": result.status, "answer": result.answer, "turns": result.turns}), flush=True)
    store.close()


if __name__ == "__main__":
    main()
