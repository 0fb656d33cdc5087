"""Crash recovery, offline: a durable run resumes without firing its side effect again, then a run that
loses a side effect's outcome halts with OutcomeUnknown and is resolved from the system of record.

    python examples/recover.py

Uses a scripted model (no API key) and a SQLite journal in a temporary directory. Crashes are simulated
in-process: the first by a model outage after the charge, the second by the process "dying" inside the
charge, after the money moved but before its result was journaled.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import bide
from bide.testing import Fail, ScriptedModel, call, reply


class ProcessDied(BaseException):
    """Stands in for SIGKILL: nothing after it runs, no `except Exception` catches it."""


class PaymentProvider:
    """The system of record: charges by idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, tuple[str, int]] = {}
        self.die_after_next_charge = False

    def charge_tool(self) -> bide.Tool:
        provider = self

        async def charge_card(customer: str, cents: int, idempotency_key: str) -> str:
            """Charge a customer's card (a side effect: at most once)."""
            provider.charges[idempotency_key] = (customer, cents)
            if provider.die_after_next_charge:
                provider.die_after_next_charge = False
                raise ProcessDied
            return f"charged {customer} {cents} cents"

        return bide.Tool.from_function(charge_card, timeout=1.0)


def script() -> ScriptedModel:
    return ScriptedModel(
        [call("charge_card", customer="alice", cents=500), reply("Charged alice 500 cents.")]
    )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = bide.open_store(f"sqlite:///{Path(tmp) / 'bide.db'}")
        provider = PaymentProvider()

        print("== 1. a crash after the charge was journaled ==")
        outage = ScriptedModel(
            [
                call("charge_card", customer="alice", cents=500),
                Fail(bide.ModelError("model outage")),
                reply("unreachable"),
            ]
        )
        agent = bide.Agent(outage, store=store, tools=[provider.charge_tool()], system="You charge cards.")
        try:
            await agent.run("order-1", "Charge alice 500 cents")
        except bide.ModelError as exc:
            print(f"first drive failed: {exc}")
        print(f"charges so far: {len(provider.charges)}")
        resumed = bide.Agent(
            script(), store=store, tools=[provider.charge_tool()], system="You charge cards."
        )
        result = await resumed.run("order-1", "Charge alice 500 cents")
        print(
            f"resumed: {result.answer!r}; charges: {len(provider.charges)} "
            "(the charge was replayed, not redone)"
        )
        assert len(provider.charges) == 1

        print("\n== 2. a crash between the charge and its journaled result ==")
        provider.die_after_next_charge = True
        # One machine, one clock: a small clock-skew margin, which the resolution below waits past too (a
        # resolver waits at least the margin the call's driver was given).
        agent = bide.Agent(
            script(), store=store, tools=[provider.charge_tool()], system="You charge cards.", clock_skew=0.1
        )
        try:
            await agent.run("order-2", "Charge alice 500 cents")
        except ProcessDied:
            print("the process died inside charge_card, after the money moved")
        agent = bide.Agent(script(), store=store, tools=[provider.charge_tool()], system="You charge cards.")
        try:
            await agent.run("order-2", "Charge alice 500 cents")
            raise SystemExit("expected a halt")
        except bide.OutcomeUnknown as halt:
            print(
                f"resume halted: run={halt.run_id} call={halt.call_id} tool={halt.tool} "
                f"arguments={halt.arguments}"
            )
            call_id = halt.call_id
            wait = halt.deadline + 0.2 - time.time()
        print(f"charges: {len(provider.charges)} (one per order: the halted charge was not fired again)")

        # Look the call up in the system of record by its stable idempotency key, then record the outcome.
        key = bide.idempotency_key_for("order-2", call_id)
        found = provider.charges.get(key)
        print(f"provider has a charge for {key}: {found}")
        await asyncio.sleep(max(0.0, wait))  # the call's deadline must pass before anyone may decide it
        if found:
            outcome = bide.Outcome.succeeded(
                f"charged {found[0]} {found[1]} cents", evidence={"provider_key": key}
            )
        else:
            outcome = bide.Outcome.not_started()
        await bide.aresolve_halt(store, "order-2", call_id, outcome=outcome, clock_skew=0.1)
        print(f"resolved {call_id} as {outcome.kind}")
        result = await bide.Agent(
            script(), store=store, tools=[provider.charge_tool()], system="You charge cards."
        ).run("order-2", "Charge alice 500 cents")
        print(f"run order-2 finished: {result.answer!r}; charges: {len(provider.charges)}")
        assert len(provider.charges) == 2  # one per order, never two for one order
        print(f"status of order-2: {bide.run_status(store, 'order-2').status}")
        store.close()


if __name__ == "__main__":
    asyncio.run(main())
