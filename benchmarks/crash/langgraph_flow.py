"""The crash-benchmark workflow as a LangGraph graph checkpointed by SqliteSaver (see common.py for the
command line).

A `StateGraph` of four nodes, `prepare` (the read) -> `charge` -> `send_receipt` (the side effects) ->
`finish` (the answer), compiled with a `SqliteSaver` and invoked with `durability="sync"` (a checkpoint is
written before the next step starts, LangGraph's most durable mode). Recovery is LangGraph's own: a thread
whose last checkpoint still has nodes to run is resumed with `invoke(None, config)`; a thread with no
checkpoint is started with its input.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any, TypedDict

import common
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph


class OrderState(TypedDict, total=False):
    workflow: str
    order: dict[str, Any]
    charged: str
    receipt: str
    answer: str


def build(state_dir: Path) -> Any:
    def prepare(state: OrderState) -> OrderState:
        return {"order": common.read_order(state_dir)}

    def charge(state: OrderState) -> OrderState:
        result = common.charge_result(state["order"])
        return {"charged": common.fire(state_dir, state["workflow"], "charge", result, key=state["workflow"])}

    def send_receipt(state: OrderState) -> OrderState:
        result = common.receipt_result(state["order"])
        wf = state["workflow"]
        return {"receipt": common.fire(state_dir, wf, "send_receipt", result, key=wf)}

    def finish(state: OrderState) -> OrderState:
        return {"answer": common.answer(state["order"], state["charged"], state["receipt"])}

    graph = StateGraph(OrderState)
    graph.add_node("prepare", prepare)
    graph.add_node("charge", charge)
    graph.add_node("send_receipt", send_receipt)
    graph.add_node("finish", finish)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "charge")
    graph.add_edge("charge", "send_receipt")
    graph.add_edge("send_receipt", "finish")
    graph.add_edge("finish", END)
    conn = sqlite3.connect(state_dir / "langgraph.sqlite", check_same_thread=False)
    return graph.compile(checkpointer=SqliteSaver(conn))


def drive(app: Any, workflow: str) -> None:
    """Start the thread if it has no checkpoint, else resume it from its last one; report the outcome."""
    started = time.perf_counter()
    config = {"configurable": {"thread_id": workflow}}
    if app.checkpointer.get_tuple(config) is None:
        final = app.invoke({"workflow": workflow}, config, durability="sync")
    else:
        final = app.invoke(None, config, durability="sync")
    if "answer" in final:
        common.report("completed", started, answer=final["answer"])
    else:
        common.report("failed", started, reason=f"resumed thread ended without an answer: {sorted(final)}")


def main() -> None:
    opts = common.parse_args(__doc__.splitlines()[0] if __doc__ else "")
    app = build(opts.state)
    if opts.bench:
        durations = []
        for i in range(opts.bench + 1):
            t0 = time.perf_counter()
            config = {"configurable": {"thread_id": f"bench-{i}"}}
            app.invoke({"workflow": f"bench-{i}"}, config, durability="sync")
            durations.append(time.perf_counter() - t0)
        common.report_bench(durations[1:])  # the first run pays the one-time setup
        return
    common.arm_kill(opts.kill_after)
    drive(app, opts.workflow)


if __name__ == "__main__":
    main()
