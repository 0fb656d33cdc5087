"""The crash-benchmark workflow as a bide agent on a SQLite store (see common.py for the command line).

An offline scripted model asks for `get_order` (read only), then `charge_card` and `send_receipt` (side
effects: an attempt marker is journaled before each call), then answers. Recovery is bide's own: run the
same run id again. A run that finds an attempt marker without a result halts with `bide.OutcomeUnknown`.
With `--reconcile`, each side effect has a reconciler that looks its idempotency key up in the effect ledger
(the system of record), and the driver waits past the attempt's deadline so the reconciler may decide.
"""

from __future__ import annotations

import time
from pathlib import Path

import common

import bide
from bide.testing import ScriptedModel, call, reply

EFFECT_TIMEOUT = 1.0  # seconds: the deadline a reconciler waits for (the effect is a local fsync)
LEASE_TTL = 1.0  # seconds
CLOCK_SKEW = 0.1  # one machine, one clock: a small margin past the deadline is enough


def make_agent(state: Path, reconcile: bool) -> bide.Agent:
    def record_of(attempt: bide.AttemptInfo) -> bide.Outcome:
        """The reconciler: the ledger says whether this call's effect happened."""
        for entry in common.ledger(state):
            if entry["key"] == attempt.idempotency_key:
                return bide.Outcome.succeeded(entry["result"], evidence={"ledger": entry["key"]})
        return bide.Outcome.not_started()

    reconciler = record_of if reconcile else None

    @bide.tool(safety=bide.ReadOnly)
    async def get_order(order_id: str) -> dict[str, object]:
        """Read the order to process."""
        return common.read_order(state)

    @bide.tool(reconcile=reconciler, timeout=EFFECT_TIMEOUT)
    async def charge_card(customer: str, cents: int) -> str:
        """Charge the customer's card."""
        ctx = bide.current_call()
        result = common.charge_result({"customer": customer, "cents": cents})
        return common.fire(state, ctx.run_id, "charge", result, key=ctx.idempotency_key)

    @bide.tool(reconcile=reconciler, timeout=EFFECT_TIMEOUT)
    async def send_receipt(customer: str) -> str:
        """Email the customer a receipt."""
        ctx = bide.current_call()
        result = common.receipt_result({"customer": customer})
        return common.fire(state, ctx.run_id, "send_receipt", result, key=ctx.idempotency_key)

    model = ScriptedModel(
        [
            call("get_order", order_id="order"),
            call("charge_card", customer="alice", cents=500),
            call("send_receipt", customer="alice"),
            reply("charged alice 500 cents; receipt sent to alice"),
        ],
        record=False,
    )
    store = bide.open_store(f"sqlite:///{state / 'bide.db'}")
    return bide.Agent(
        model,
        store=store,
        tools=[get_order, charge_card, send_receipt],
        system="You process orders.",
        clock_skew=CLOCK_SKEW,
        # A killed driver's lease must expire before the recovery drives the run (a paused process may
        # still be alive): a short lease, and a recovery that waits for it.
        lease_ttl=LEASE_TTL,
        lease_wait=2 * LEASE_TTL,
    )


def drive(agent: bide.Agent, workflow: str, reconcile: bool) -> None:
    """Start or resume the run; report completed or halted (with the halted call and its tool)."""
    started = time.perf_counter()
    while True:
        drive_began = time.time()
        try:
            result = agent.run_sync(workflow, f"process order {workflow}")
        except bide.OutcomeUnknown as halt:
            # The reconciler is asked once the call's deadline and the clock skew have passed. A drive that
            # began before that moment may have reached the call before it (and the time to the halt, the
            # lease's release included, may have carried the clock past it): it drives again then. A drive
            # begun after it asked the reconciler, so its halt is final. (Deciding by the clock at the halt
            # reported such a drive as halted now and then under load.)
            ready_at = None if halt.deadline is None else halt.deadline + CLOCK_SKEW
            if reconcile and ready_at is not None and drive_began < ready_at:
                time.sleep(max(0.0, ready_at - time.time()) + 0.01)
                continue
            common.report("halted", started, tool=halt.tool, call=halt.call_id)
            return
        common.report("completed", started, answer=result.answer)
        return


def main() -> None:
    opts = common.parse_args(__doc__.splitlines()[0] if __doc__ else "")
    agent = make_agent(opts.state, opts.reconcile)
    if opts.bench:
        durations, commits = [], 0
        for i in range(opts.bench + 1):
            before = getattr(agent.store, "commits", 0)
            t0 = time.perf_counter()
            agent.run_sync(f"bench-{i}", f"process order bench-{i}")
            durations.append(time.perf_counter() - t0)
            commits += getattr(agent.store, "commits", 0) - before if i else 0
        # the first run pays the one-time setup
        common.report_bench(durations[1:], commits_per_workflow=commits / opts.bench)
        return
    common.arm_kill(opts.kill_after)
    drive(agent, opts.workflow, opts.reconcile)


if __name__ == "__main__":
    main()
