"""The crash-benchmark workflow as a DBOS workflow on DBOS's SQLite system database (see common.py for the
command line).

`order` is a `@DBOS.workflow()` of three `@DBOS.step()`s: `prepare` (the read), `charge` and
`send_receipt` (the side effects); its return value is the answer. Recovery is DBOS's own: relaunching the
same application (same code, hence the same application version and executor) makes `DBOS.launch()`
recover the workflows left PENDING; the driver then waits on `DBOS.retrieve_workflow(id)`. A workflow id
that was never recorded is started with `SetWorkflowID`. DBOS logs that its SQLite system database is for
development and testing (PostgreSQL is what it recommends in production).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import common
from dbos import DBOS, DBOSConfig, SetWorkflowID

_state: Any = None  # the trial's state directory, set before launch (steps read it)


@DBOS.step()
def prepare() -> dict[str, Any]:
    return common.read_order(_state)


@DBOS.step()
def charge(order: dict[str, Any]) -> str:
    workflow = DBOS.workflow_id or ""
    return common.fire(_state, workflow, "charge", common.charge_result(order), key=workflow)


@DBOS.step()
def send_receipt(order: dict[str, Any]) -> str:
    workflow = DBOS.workflow_id or ""
    return common.fire(_state, workflow, "send_receipt", common.receipt_result(order), key=workflow)


@DBOS.workflow()
def order_workflow() -> str:
    order = prepare()
    charged = charge(order)
    receipt = send_receipt(order)
    return common.answer(order, charged, receipt)


def drive(workflow: str) -> None:
    """Wait for a recovered workflow, or start one that was never recorded; report completed."""
    started = time.perf_counter()
    if DBOS.get_workflow_status(workflow) is None:
        with SetWorkflowID(workflow):
            answer = order_workflow()
    else:
        answer = DBOS.retrieve_workflow(workflow).get_result()
    common.report("completed", started, answer=answer)


def main() -> None:
    global _state
    opts = common.parse_args(__doc__.splitlines()[0] if __doc__ else "")
    _state = opts.state
    logging.getLogger("dbos").setLevel(logging.ERROR)  # keep the development-database warning off stdout
    config: DBOSConfig = {
        "name": "crash-benchmark",
        "system_database_url": f"sqlite:///{opts.state / 'dbos.sqlite'}",
        "log_level": "ERROR",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        if opts.bench:
            durations = []
            for i in range(opts.bench + 1):
                t0 = time.perf_counter()
                with SetWorkflowID(f"bench-{i}"):
                    order_workflow()
                durations.append(time.perf_counter() - t0)
            common.report_bench(durations[1:])  # the first run pays the one-time setup
            return
        common.arm_kill(opts.kill_after)
        drive(opts.workflow)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
