"""Child of test_pg_silent_network.py, run inside its own network namespace: opens a bide store or a govern
event log at the URL it is given (timeout in seconds), writes once, prints "ready", waits for a line on
stdin (the parent cuts the network path meanwhile), writes again and prints the outcome as one JSON line:
{"error": exception class name or null, "message": ..., "seconds": how long the second write took}."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import bide
import govern
from bide.testing import ScriptedModel, reply


def main() -> None:
    kind, url, timeout, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if kind == "store":
        store = bide.SQLStore(url, table_prefix=name, busy_timeout=timeout)

        def write() -> None:
            agent = bide.Agent(ScriptedModel([reply("ok")]), store=store)
            agent.run_sync(f"run-{uuid.uuid4().hex}", "go")
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
        from demo import orders

        machine = orders.build()
        log = govern.EventLog(url, name=name, machine=machine, timeout=timeout)

        def write() -> None:
            log.append(
                govern.Event(
                    id=uuid.uuid4().hex, machine=machine.digest, record="order-1", event="pay", producer="p"
                )
            )

    write()
    print("ready", flush=True)
    sys.stdin.readline()
    started = time.monotonic()
    error: BaseException | None = None
    try:
        write()
    except Exception as e:
        error = e
    outcome = {
        "error": None if error is None else type(error).__name__,
        "message": str(error),
        "seconds": time.monotonic() - started,
    }
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
