"""Agent process for the multi-process tests: one bide agent whose scripted model records governed events.

Usage: _agent_worker.py STORE_URL LOG_URL LOG_NAME RUN_ID SEED CALLS
The script is a pure function of SEED, so a restarted process replays the same run.
"""

from __future__ import annotations

import random
import sys

from machines import order_machine

import bide
from bide.testing import Call, ScriptedModel, Turn, reply
from govern.runtime._agents import event_tool
from govern.runtime._eventlog import EventLog


def script(seed: int, calls: int) -> list[Turn]:
    rng = random.Random(seed)
    machine = order_machine()
    turns: list[Turn] = []
    left = calls
    while left:
        width = min(left, rng.choice([1, 1, 2]))
        turns.append(
            Turn(
                calls=tuple(
                    Call(rng.choice(machine.events), {"record": f"order-{rng.randrange(4)}"})
                    for _ in range(width)
                )
            )
        )
        left -= width
    turns.append(reply("done"))
    return turns


def main() -> None:
    store_url, log_url, log_name, run_id, seed, calls = sys.argv[1:7]
    machine = order_machine()
    log = EventLog(log_url, name=log_name)
    store = bide.open_store(store_url)
    tools = [event_tool(machine, log, event) for event in machine.events]
    # Each turn takes 30 ms, so that the test, polling the log from a third process on a busy 2-core
    # machine, still finds its victims mid-run (with 10 ms the whole run could pass before it looked).
    model = ScriptedModel(script(int(seed), int(calls)), delay=0.03)
    # A restarted worker waits for the lease its killed predecessor held (1 s after its last renewal).
    agent = bide.Agent(
        model, store=store, tools=tools, name="worker", max_turns=1000, lease_ttl=1.0, lease_wait=20.0
    )
    result = agent.run_sync(run_id, "work on the orders")
    print(result.answer, flush=True)
    store.close()


if __name__ == "__main__":
    main()
