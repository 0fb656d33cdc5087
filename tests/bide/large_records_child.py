"""Child of test_pg_large_records.py: drives runs whose records are several MB on a PostgreSQL store.

Usage: large_records_child.py URL PREFIX LEDGER SIZE ROUNDS

Each round sends an input of SIZE bytes as a run and as a thread message, and calls a side effect (one
fsynced ledger line) that returns SIZE bytes. Prints one JSON line per round: the sizes read back.
"""

from __future__ import annotations

import json
import os
import sys

import bide
from bide.testing import ScriptedModel, call, reply


def main() -> None:
    url, prefix, ledger, size, rounds = (
        sys.argv[1],
        sys.argv[2],
        sys.argv[3],
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    store = bide.open_store(url, table_prefix=prefix)

    @bide.tool(timeout=60)
    def export_report(name: str) -> str:
        """Build and send a report (a side effect)."""
        with open(ledger, "a") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        return "r" * size

    for i in range(rounds):
        script = [call("export_report", name=f"q{i}"), reply("sent")]
        agent = bide.Agent(ScriptedModel(script * 2), store=store, tools=[export_report])
        run = agent.run_sync(f"run-{i}", "x" * size)
        sent = agent.thread(f"thread-{i}").send_sync("y" * size, segment=0)
        result = bide.Journal(store, f"run-{i}").load().get("result:c0.0")
        assert isinstance(result, bide.ToolResult)
        start = bide.Journal(store, f"thread-{i}").load().get("run:start")
        assert isinstance(start, bide.Start)
        print(
            json.dumps(
                {
                    "run": run.answer,
                    "thread": sent.answer,
                    "result": len(str(result.result)),
                    "message": len(start.input),
                }
            ),
            flush=True,
        )
    store.close()


if __name__ == "__main__":
    main()
