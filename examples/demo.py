"""A team of agents on shared order records, through a certified machine: `make demo`.

    python examples/demo.py [--workdir DIR] [--keep]

Offline and self-contained: everything lives in a temporary directory (SQLite files). What happens:

1. The order machine below (`orders`) is certified (`govern certify examples/demo.py:orders`) and the
   certificate is checked offline (`govern check`).
2. Three agents run as separate processes (payments, warehouse, support), each a durable bide agent
   whose tools append governed events to one shared event log. The models are scripted, unless
   OPENAI_API_KEY and OPENAI_BASE_URL are set (then OPENAI_MODEL, default gpt-4o-mini, drives them).
3. Mid-run, the warehouse agent's process is killed with SIGKILL and started again: it resumes from its
   journal, and its retried call appends nothing new.
4. The support agent refunds cancelled orders at a "bank" (a file outside the journal): a real side
   effect, fired at most once, and gated by the governed state: the refund tool refuses an order that the
   log does not hold cancelled (a cancellation that lands after the shipment is a no-op), and one whose
   cancel found it not charged (a cancellation that lands before the payment: there is no payment to send
   back); the model is told why. Its process is killed with SIGKILL after the bank executed a refund and
   before the answer reached the journal. Restarted, the run halts with `bide.OutcomeUnknown` instead of
   refunding twice; the demo looks the refund up at the bank, records it with `bide resolve`, and the run
   completes. The bank holds one refund per order cancelled after its payment, and none for another order.
5. Three replica processes follow the log live, each with a different delivery order (log order,
   shuffled windows with duplicates, reversed windows), applying the certificate's delivery rules.
6. At the end: every replica's final state (identical), the event accounting (no event twice, none lost),
   the halt and its resolution, every refund against the log (its order charged when its cancel applied),
   the certificate check, and an offline audit verification of every agent's journal (bide-audit). The
   demo fails (exit 1) if any check fails, including when the agents recorded nothing (a real model that
   calls no tools) and when the bank refunded an order that was not charged when its cancel applied.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

import bide
import govern
from bide import audit
from bide.testing import Call, ScriptedModel, Turn, reply

MACHINE_FILE = Path(__file__).resolve()

# The shared record: one order. Cancelling a paid order is compensated by a refund (the invariant's repair);
# restock is not idempotent (a redelivery would add stock twice), and ship/cancel, pay/ship, ... do not
# commute, so the certificate lists them as causal-order obligations: replicas keep their log order.
orders = govern.Registry("orders")
status = orders.enum("status", ["pending", "paid", "shipped", "cancelled"])
charged = orders.bool("charged")
stock = orders.int("stock", 0, 3)
orders.invariant(
    "shipped_orders_are_charged", holds=(status != "shipped") | charged, repair={status: "pending"}
)
orders.invariant(
    "cancelled_orders_are_refunded", holds=(status != "cancelled") | ~charged, repair={charged: False}
)
orders.event("pay", guard=status == "pending", effect={status: "paid", charged: True})
orders.event("restock", guard=stock < 3, effect={stock: stock + 1})
orders.event("ship", guard=(status == "paid") & (stock > 0), effect={status: "shipped", stock: stock - 1})
orders.event("cancel", guard=(status == "pending") | (status == "paid"), effect={status: "cancelled"})
orders.independent("pay", "restock")
orders.independent("cancel", "restock")
ORDERS = ["order-1", "order-2", "order-3", "order-4"]
MODEL_DELAY = 0.2  # seconds per scripted model turn, so the run is visible and the kill lands mid-run
KILL_AFTER = 3  # events appended by the warehouse before its process is killed
BANK_ANSWER_DELAY = 1.5  # seconds the bank takes to answer a refund: the kill lands in this window
REFUND_TIMEOUT = 2.0  # the refund tool's deadline: after it, the halted call can be resolved
HALTED_EXIT = 3  # an agent process whose run halted (OutcomeUnknown) exits with this code

ROLES: dict[str, dict[str, Any]] = {
    "payments": {
        "events": ["pay"],
        "task": "You run payments. Take payment for order-3, order-4, order-1 and order-2. Report what "
        "happened to each order.",
        # The orders support cancels are paid first: each cancel then mostly finds its order paid (a
        # refund to make, so the demo has a refund to kill), and the race left is with the shipment. When
        # support's cancels come before the payments instead, they come before the shipments too.
        "script": [("pay", "order-3"), ("pay", "order-4"), ("pay", "order-1"), ("pay", "order-2")],
    },
    "warehouse": {
        "events": ["restock", "ship"],
        "task": "You run the warehouse. Restock order-1, order-2, order-3 and order-4 and ship each one. An "
        "order ships only once it is paid and in stock; try again later if it is not paid yet.",
        "script": [
            ("restock", "order-1"),
            ("restock", "order-2"),
            ("ship", "order-1"),
            ("restock", "order-3"),
            ("ship", "order-2"),
            ("restock", "order-4"),
            ("ship", "order-3"),
            ("ship", "order-4"),
            ("ship", "order-1"),
        ],
    },
    "support": {
        "events": ["cancel"],
        "task": "You are customer support. The customers of order-3 and order-4 asked to cancel their "
        "orders. Cancel them; then, for each order your cancel left cancelled, send its payment back with "
        "refund_payment (the bank refunds only an order that was paid when your cancel applied: not one "
        "that shipped before the cancel, nor one cancelled before its payment), and report the outcome.",
        # its scripted model decides each refund from the cancel's result, and reports the refund's answer
        "orders": ["order-3", "order-4"],
        "pace": 3,  # support answers slowly: its cancellations race the payments
    },
}
REPLICA_MODES = {
    "replica-a": "log order",
    "replica-b": "shuffled + duplicates",
    "replica-c": "reversed windows",
}


# -- shared helpers ---------------------------------------------------------------------------------------


def load_machine(workdir: Path) -> govern.Machine:
    return govern.Machine.load(workdir / "orders.machine")


def python_tool(module: str, *args: str) -> list[str]:
    """The command line of a console script (`govern`, `bide-audit`), run with this interpreter so it works
    whether or not the scripts are on PATH."""
    return [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())", *args]


def compact(state: dict[str, Any]) -> str:
    """A state in a few words: labels as they are, booleans by name, integers with their name."""
    words = []
    for name, value in state.items():
        if isinstance(value, bool):
            words.append(name if value else f"not {name}")
        elif isinstance(value, int):
            words.append(f"{name} {value}")
        else:
            words.append(str(value))
    return ", ".join(words)


def counted(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, sort_keys=True))
    os.replace(tmp, path)


# -- agent process ----------------------------------------------------------------------------------------


def scripted(role: str) -> ScriptedModel:
    delay = MODEL_DELAY * ROLES[role].get("pace", 1)
    if role == "support":
        # Each turn is decided from the conversation so far: a cancel, or a refund the cancel allows.
        turns = len(ROLES[role]["orders"]) * 2 + 1
        return ScriptedModel([support_turn] * turns, name=f"scripted-{role}", delay=delay)
    script: list[Turn] = [
        Turn(calls=(Call(event, {"record": record}),)) for event, record in ROLES[role]["script"]
    ]
    script.append(reply(f"{role}: done, {len(script)} tool calls made."))
    return ScriptedModel(script, name=f"scripted-{role}", delay=delay)


def support_turn(request: bide.ModelRequest) -> Turn:
    """The scripted support agent's next turn: cancel each of its orders, and refund an order only when
    its cancel's result says the order is now cancelled (a cancel after the shipment is a no-op). Its
    final answer reports each order's outcome as the tools told it: refunded only when the refund tool
    said so, and otherwise why not."""
    results = {m.tool_call_id: m for m in request.messages if isinstance(m, bide.ToolMessage)}
    calls = [
        (c.name, c.arguments.get("record") if isinstance(c.arguments, dict) else None, results.get(c.id))
        for m in request.messages
        if isinstance(m, bide.AssistantMessage)
        for c in m.tool_calls
    ]
    outcomes: list[str] = []
    for order in ROLES["support"]["orders"]:
        cancels = [result for name, record, result in calls if name == "cancel" and record == order]
        if not cancels:
            return Turn(calls=(Call("cancel", {"record": order}),))
        status = cancelled_status(cancels[-1])
        refunds = [result for name, record, result in calls if name == "refund_payment" and record == order]
        if status != "cancelled":
            outcomes.append(f"{order} not refunded: the cancel left it {status}")
        elif not refunds:
            return Turn(calls=(Call("refund_payment", {"record": order}),))
        elif refunds[-1] is None or refunds[-1].is_error:
            told = "no answer" if refunds[-1] is None else refunds[-1].content
            outcomes.append(f"{order} not refunded: {told}")
        else:
            outcomes.append(f"{order} refunded")
    done = f"support: done, {len(calls)} tool calls made"
    return reply("; ".join([done, *outcomes]) + ".")


def cancelled_status(result: bide.ToolMessage | None) -> str:
    """The order status a cancel's tool result reports ("unknown" when it reports none)."""
    try:
        told = json.loads(result.content) if result is not None and not result.is_error else {}
        return str(told["state"]["status"])
    except (ValueError, TypeError, KeyError):
        return "unknown"


def bank_refunds(workdir: Path) -> list[dict[str, Any]]:
    """The refunds the bank executed (its own records, outside every journal)."""
    try:
        lines = (workdir / "bank.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


class Cancellation(NamedTuple):
    """What the log says of a record's cancellation."""

    status: str  # the record's status after all its events
    found: dict[str, Any] | None  # the state the cancel that cancelled it found; None: no cancel applied


def cancel_reader(machine: govern.Machine, log: govern.EventLog) -> Callable[[str], Cancellation]:
    """The refund tool's reading of the log: a record's events folded in log order, its status at the end
    and the state just before the cancel that cancelled it. Replicas keep pay and cancel in log order (a
    causal-order obligation), so every replica's cancel found that same state."""

    def cancellation(record: str) -> Cancellation:
        state = machine.initial
        found: dict[str, Any] | None = None
        for event in log.read_record(record):
            before, state = state, machine.apply(state, event.event)
            if found is None and state["status"] == "cancelled":
                found = dict(before)
        return Cancellation(str(state["status"]), found)

    return cancellation


def order_reader(machine: govern.Machine, log: govern.EventLog) -> Callable[[str], dict[str, Any]]:
    """The `order_state` tool's function: a record's state as a replica of the event log sees it."""

    def order_state(record: str) -> dict[str, Any]:
        """The current state of a shared order record, as a replica of the event log sees it."""
        replica = govern.Replica(machine, log)
        replica.sync()
        return replica.state(record)

    return order_state


def refund_tool(workdir: Path, cancellation: Callable[[str], Cancellation]) -> bide.Tool:
    """The bank's refund: a real side effect (no safety declared), so bide fires it at most once. It is
    gated by the governed state: only an order the log holds cancelled, whose cancel found it charged
    (paid before the cancel, in log order), is refunded."""

    async def refund_payment(record: str) -> str:
        """Send the payment of a cancelled order back to the customer, at the bank. Refused for an order
        that is not cancelled (for example one that shipped before its cancellation), and for one that was
        cancelled before it was paid (there is no payment to send back)."""
        call = bide.current_call()
        try:
            told = await asyncio.to_thread(cancellation, record)
        except govern.EventLogError as exc:
            raise bide.NotCalled(
                f"the state of {record} could not be read ({exc}); nothing was refunded"
            ) from exc
        # No event leaves "cancelled" and the log only grows, so once a cancel applied, the order stays
        # cancelled and the state that cancel found never changes: a refused order stays refused.
        if told.found is None:
            raise bide.ToolError(
                f"{record} is {told.status}, not cancelled, so its payment is not refunded and nothing "
                "was sent to the bank: only an order the log holds cancelled is refunded"
            )
        if not told.found["charged"]:
            raise bide.ToolError(
                f"{record} was cancelled while {told.found['status']}, before it was charged, so there is no "
                "payment to refund and nothing was sent to the bank: only an order whose cancel found it "
                "charged is refunded"
            )
        with (workdir / "bank.jsonl").open("a") as bank:
            entry = {"refund": record, "call_id": call.call_id, "key": call.idempotency_key}
            bank.write(json.dumps(entry) + "\n")
            bank.flush()
            os.fsync(bank.fileno())
        await asyncio.sleep(BANK_ANSWER_DELAY)  # the money has moved; the answer is on its way
        return f"refunded the payment of {record}"

    return bide.tool(timeout=REFUND_TIMEOUT)(refund_payment)


def run_agent(role: str, workdir: Path) -> int:
    machine = load_machine(workdir)
    log = govern.EventLog(str(workdir / "events.db"))
    store = bide.open_store(f"sqlite:///{workdir / 'journal.db'}")

    order_state = order_reader(machine, log)
    tools = [govern.event_tool(machine, log, event) for event in ROLES[role]["events"]]
    tools.append(bide.Tool.from_function(order_state, safety=bide.ReadOnly))
    if role == "support":
        tools.append(refund_tool(workdir, cancel_reader(machine, log)))
    model: Any
    if os.environ.get("OPENAI_API_KEY") and os.environ.get("OPENAI_BASE_URL"):
        model = bide.OpenAIModel(os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    else:
        model = scripted(role)
    system = (
        f"You are the {role} agent of a small shop. Orders are shared records (order-1 ... order-4) that "
        "other agents change too. Every change goes through your tools; each tool result tells you the "
        "order's state right after your event, and whether it applied, changed nothing, or was compensated."
    )
    # A restarted agent waits for the lease its killed predecessor held (2 s after its last renewal).
    agent = bide.Agent(
        model,
        store=store,
        tools=tools,
        system=system,
        name=role,
        max_turns=40,
        lease_ttl=2.0,
        lease_wait=15.0,
        clock_skew=0.5,  # one machine's clock: `bide resolve --clock-skew 0.5` below waits that long too
    )
    try:
        result = agent.run_sync(f"demo-{role}", ROLES[role]["task"])
    except bide.OutcomeUnknown as halt:
        # The honest answer after a lost outcome: stop, and say which call needs a decision.
        print(json.dumps({"halted": type(halt).__name__, "call_id": halt.call_id, "tool": halt.tool,
                          "arguments": halt.arguments}), flush=True)
        return HALTED_EXIT
    finally:
        store.close()
    print(result.answer, flush=True)
    return 0


# -- replica process --------------------------------------------------------------------------------------


def run_replica(name: str, workdir: Path) -> int:
    machine = load_machine(workdir)
    log = govern.EventLog(str(workdir / "events.db"))
    replica = govern.Replica(machine, log, track_root=True)
    rng = random.Random(name)
    mode = REPLICA_MODES[name]
    status = workdir / f"{name}.json"
    while True:
        window = log.read(replica.position, rng.randint(2, 10))
        if window:
            if mode == "shuffled + duplicates":
                window = window + rng.sample(window, k=rng.randint(0, len(window)))
                rng.shuffle(window)
            elif mode == "reversed windows":
                window.reverse()
            replica.deliver(window)
            write_json(
                status, {"position": replica.position, "duplicates": replica.duplicates, "done": False}
            )
        elif (workdir / "agents-done").exists() and replica.position == log.length():
            break
        else:
            time.sleep(0.02)
    valid = all(machine.is_valid(replica.state_id(k)) for k in replica.records())
    write_json(
        status,
        {
            "position": replica.position,
            "duplicates": replica.duplicates,
            "done": True,
            "digest": replica.digest(),
            "root": replica.root(),
            "states": replica.states(),
            "valid": valid,
        },
    )
    return 0


# -- the conductor ----------------------------------------------------------------------------------------


class Demo:
    def __init__(self, workdir: Path, console: Console) -> None:
        self.workdir = workdir
        self.console = console
        self.agents: dict[str, subprocess.Popen[str]] = {}
        self.agent_status: dict[str, str] = dict.fromkeys(ROLES, "starting")
        self.replicas: dict[str, subprocess.Popen[str]] = {}
        self.failures: list[str] = []
        self.results: list[str] = []
        self.halts: list[dict[str, Any]] = []  # what each halted agent process reported
        self.resolutions: list[str] = []  # the `bide resolve` command lines that settled them
        self.real_model = bool(os.environ.get("OPENAI_API_KEY") and os.environ.get("OPENAI_BASE_URL"))

    def spawn(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--workdir", str(self.workdir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def certify(self) -> govern.Machine:
        cert = self.workdir / "orders.govern-cert.json"
        made = subprocess.run(
            python_tool("govern.cli", "certify", f"{MACHINE_FILE}:orders", "-o", str(cert)),
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"govern certify failed (exit {made.returncode}):\n{made.stdout}{made.stderr}")
        checked = subprocess.run(
            python_tool("govern.cli", "check", str(cert)), capture_output=True, text=True
        )
        self.check_output = checked.stdout.strip() or checked.stderr.strip()
        self.check_code = checked.returncode
        machine = orders.build()
        document = json.loads(cert.read_text())
        self.cert_matches = document["machine"] == machine.rules()
        self.cert_digest = document["digest"]
        machine.save(self.workdir / "orders.machine")
        govern.EventLog(str(self.workdir / "events.db")).bind(machine)
        return machine

    def progress(self, log: govern.EventLog) -> Group:
        events = log.read()
        table = Table(title=f"shared event log: {len(events)} events", expand=False)
        for column in ("process", "status", "events", "last event"):
            table.add_column(column)
        for role in ROLES:
            mine = [e for e in events if e.producer == f"demo-{role}"]
            last = f"{mine[-1].event} {mine[-1].record} @{mine[-1].position}" if mine else ""
            table.add_row(f"agent {role}", self.agent_status[role], str(len(mine)), last)
        for name, mode in REPLICA_MODES.items():
            status = self.replica_status(name)
            shown = "done" if status.get("done") else "following"
            table.add_row(f"{name} ({mode})", shown, f"{status.get('position', 0)} applied", "")
        return Group(table)

    def replica_status(self, name: str) -> dict[str, Any]:
        try:
            value: dict[str, Any] = json.loads((self.workdir / f"{name}.json").read_text())
            return value
        except (OSError, ValueError):
            return {}

    def run(self) -> int:
        started = time.monotonic()
        console = self.console
        console.rule("[bold]bide + govern: a team of agents on shared order records")
        console.print(f"work directory: {self.workdir}")
        machine = self.certify()
        cert = self.workdir / "orders.govern-cert.json"
        console.print(f"$ govern certify examples/demo.py:orders -o {cert}")
        console.print(f"$ govern check {cert}   (exit {self.check_code})")
        report = machine.report
        obligations = ", ".join("/".join(w.events) for w in report.obligations) or "none"
        dedupe = ", ".join(w.events[0] for w in report.not_idempotent) or "none"
        console.print(
            f"machine [bold]{machine.name}[/]: events {', '.join(machine.events)}; "
            f"certificate {self.cert_digest[:23]}..."
        )
        console.print(f"delivery rules: causal order for {obligations}; deduplicate {dedupe}")
        log = govern.EventLog(str(self.workdir / "events.db"))
        for role in ROLES:
            self.agents[role] = self.spawn("--agent", role)
            self.agent_status[role] = "running"
        for name in REPLICA_MODES:
            self.replicas[name] = self.spawn("--replica", name)
        killed = support_killed = False
        kill_note = "the warehouse finished before it could be killed"
        with Live(self.progress(log), console=console, refresh_per_second=8, transient=False) as live:
            while any(p is not None for p in self.agents.values()):
                for role, proc in list(self.agents.items()):
                    if proc is None or proc.poll() is None:
                        continue
                    out, err = proc.communicate()
                    self.agents[role] = None  # type: ignore[assignment]
                    if proc.returncode == 0:
                        self.agent_status[role] = "done"
                        self.results.append(out.strip())
                    elif proc.returncode == HALTED_EXIT:
                        halt = json.loads(out.strip().splitlines()[-1])
                        self.halts.append(halt)
                        self.agent_status[role] = "halted: OutcomeUnknown"
                        live.console.print(
                            f"[bold yellow]HALTED[/] agent {role}: bide.OutcomeUnknown on call "
                            f"{halt['call_id']} {halt['tool']}({escape(json.dumps(halt['arguments']))}): "
                            "it may have fired once or not at all, so bide will not call it again"
                        )
                        if self.resolve(role, halt, live.console):
                            self.agent_status[role] = "resolved, resumed"
                            self.agents[role] = self.spawn("--agent", role)
                    else:
                        self.agent_status[role] = f"failed ({proc.returncode})"
                        self.failures.append(f"agent {role} exited {proc.returncode}: {err.strip()[-2000:]}")
                support = self.agents.get("support")
                if not support_killed and support is not None and support.poll() is None:
                    refunds = bank_refunds(self.workdir)
                    if refunds:
                        # The bank has executed the refund; its answer is not in the journal yet.
                        os.kill(support.pid, signal.SIGKILL)
                        support.wait()
                        support_killed = True
                        live.console.print(
                            f"[bold red]SIGKILL[/] support agent (pid {support.pid}) after the bank executed "
                            f"the refund of {refunds[0]['refund']}, before its answer reached the journal; "
                            "restarting it"
                        )
                        self.agent_status["support"] = "restarted"
                        self.agents["support"] = self.spawn("--agent", "support")
                warehouse = self.agents.get("warehouse")
                if not killed and warehouse is not None and warehouse.poll() is None:
                    appended = sum(1 for e in log.read() if e.producer == "demo-warehouse")
                    if appended >= KILL_AFTER:
                        os.kill(warehouse.pid, signal.SIGKILL)
                        warehouse.wait()
                        killed = True
                        kill_note = (
                            f"killed the warehouse agent with SIGKILL after {appended} events; restarted "
                            "it, and it resumed from its journal"
                        )
                        live.console.print(
                            f"[bold red]SIGKILL[/] warehouse agent (pid {warehouse.pid}) after "
                            f"{appended} events; restarting it"
                        )
                        self.agent_status["warehouse"] = "restarted"
                        self.agents["warehouse"] = self.spawn("--agent", "warehouse")
                live.update(self.progress(log))
                time.sleep(0.1)
            (self.workdir / "agents-done").touch()
            for name, proc in self.replicas.items():
                try:
                    _, err = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    _, err = proc.communicate()
                if proc.returncode != 0:
                    self.failures.append(f"{name} exited {proc.returncode}: {err.strip()[-2000:]}")
            live.update(self.progress(log))
        console.print()
        console.print(kill_note)
        for line in self.results:
            console.print(f"  {line}")
        self.report_consequences()
        self.report_replicas(machine, log)
        self.report_events(log)
        self.report_halt()
        self.report_refunds(machine, log)
        self.report_certificate()
        self.report_audit()
        elapsed = time.monotonic() - started
        console.rule()
        if self.failures:
            for failure in self.failures:
                console.print(f"[bold red]FAILED[/] {failure}")
            console.print(f"demo FAILED in {elapsed:.1f}s")
            return 1
        console.print(f"[bold green]demo passed[/] in {elapsed:.1f}s")
        return 0

    def resolve(self, role: str, halt: dict[str, Any], console: Console) -> bool:
        """Settle a halted call as an operator would: look it up at the bank, record what happened with
        `bide resolve` (retried while the call's deadline has not passed), then the run can go on."""
        found = [r for r in bank_refunds(self.workdir) if r["call_id"] == halt["call_id"]]
        if found:
            outcome = ["--succeeded", json.dumps(f"refunded the payment of {found[0]['refund']}")]
            evidence: dict[str, Any] = {"bank": found[0]}
        else:
            outcome = ["--not-started"]
            evidence = {"bank": "no refund was made under this call"}
        run = f"demo-{role}"
        store = f"sqlite:///{self.workdir / 'journal.db'}"
        shown = f"bide resolve --store {store} {run} {halt['call_id']} {' '.join(outcome)}"
        command = python_tool(
            "bide._cli", "resolve", "--store", store, run,
            halt["call_id"], *outcome, "--evidence", json.dumps(evidence), "--clock-skew", "0.5",
        )
        give_up = time.monotonic() + 30
        while True:
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode == 0:
                console.print(f"$ {escape(shown)}   [dim](the bank says: {escape(json.dumps(evidence))})[/]")
                console.print(f"  {escape(done.stdout.strip())}")
                self.resolutions.append(shown)
                return True
            if done.returncode == 5 and "may still be running" in done.stderr and time.monotonic() < give_up:
                time.sleep(0.3)  # before the call's deadline it may still be running: wait, then record
                continue
            self.failures.append(f"{shown} exited {done.returncode}: {done.stderr.strip()}")
            return False

    def report_halt(self) -> None:
        """The side effect lost in the crash: halted, resolved, and fired exactly once at the bank."""
        refunds = bank_refunds(self.workdir)
        per_order: dict[str, int] = {}
        for refund in refunds:
            per_order[refund["refund"]] = per_order.get(refund["refund"], 0) + 1
        store = bide.open_store(f"sqlite:///{self.workdir / 'journal.db'}")
        journal = bide.Journal(store, "demo-support").load()
        # A refused refund (a ToolError the model saw) sent nothing to the bank: only the calls that
        # succeeded have a refund there.
        calls = [
            r
            for r in journal.records()
            if isinstance(r, bide.ToolResult) and r.tool == "refund_payment" and not r.is_error
        ]
        status = bide.run_status(store, "demo-support").status
        store.close()
        twice = sorted(order for order, n in per_order.items() if n > 1)
        if twice or len(refunds) != len(calls):
            self.failures.append(
                f"bank refunds {per_order} for {len(calls)} refund calls that succeeded; twice: {twice}"
            )
            return
        if not self.halts or not self.resolutions:
            if self.real_model and not refunds:
                self.console.print("note: the model made no refund, so there was no side effect to interrupt")
                return
            self.failures.append("no side effect halted with OutcomeUnknown, or the halt was not resolved")
            return
        if status != "completed":
            self.failures.append(f"the support run is {status} after its halt was resolved")
            return
        halt = self.halts[0]
        self.console.print(
            f"[bold green]result: halt shown and resolved[/]: the refund call {halt['call_id']} lost its "
            f"answer to SIGKILL; the restarted run halted with OutcomeUnknown instead of refunding again; "
            f"`bide resolve` recorded the bank's evidence and the run completed. The bank holds "
            f"{counted(len(refunds), 'refund')} for {counted(len(per_order), 'order')}, none twice"
        )

    def report_refunds(self, machine: govern.Machine, log: govern.EventLog) -> None:
        """Every refund the bank made, against the log: only an order cancelled in the final state of the
        log, whose cancel found it charged (paid before the cancel, in log order), is refunded."""
        cancellation = cancel_reader(machine, log)
        refunded = sorted({refund["refund"] for refund in bank_refunds(self.workdir)})
        told = {order: cancellation(order) for order in refunded}
        not_cancelled = {order: t.status for order, t in told.items() if t.found is None}
        uncharged = {
            order: t.found["status"]
            for order, t in told.items()
            if t.found is not None and not t.found["charged"]
        }
        if not_cancelled:
            shown = ", ".join(f"{order} ({status})" for order, status in not_cancelled.items())
            self.failures.append(
                f"the bank refunded orders that are not cancelled in the final state of the log: {shown}; a "
                "refund must follow an applied cancellation (the refund tool checks the order's state)"
            )
        if uncharged:
            shown = ", ".join(f"{order} (cancelled while {status})" for order, status in uncharged.items())
            self.failures.append(
                f"the bank refunded orders that were not charged when their cancel applied: {shown}; a "
                "refund must follow the payment it sends back (the refund tool checks what the cancel found)"
            )
        if not_cancelled or uncharged:
            return
        kept = []
        for order in ROLES["support"]["orders"]:
            if order not in refunded:
                t = cancellation(order)
                why = t.status if t.found is None or t.found["charged"] else "cancelled before it was charged"
                kept.append(f"{order} ({why})")
        made = (
            f"the bank refunded {', '.join(refunded)}, each cancelled in the log after it was charged"
            if refunded
            else "the bank made no refund"
        )
        self.console.print(
            f"[bold green]result: refunds match cancellations[/]: {made}"
            + (f"; not refunded: {', '.join(kept)}" if kept else "")
        )

    def report_consequences(self) -> None:
        """What each model was told: the consequence of each of its events (from the agents' journals)."""
        store = bide.open_store(f"sqlite:///{self.workdir / 'journal.db'}")
        table = Table(title="what the agents saw (tool results in their journals)")
        for column in ("agent", "event", "log position", "outcome", "order state right after"):
            table.add_column(column)
        for role in ROLES:
            for r in bide.Journal(store, f"demo-{role}").load().records():
                if isinstance(r, bide.ToolResult) and isinstance(r.result, dict) and "outcome" in r.result:
                    res = r.result
                    style = {"applied": "green", "no-op": "yellow", "compensated": "magenta"}[res["outcome"]]
                    table.add_row(
                        role,
                        f"{res['event']} {res['record']}",
                        str(res["position"]),
                        f"[{style}]{res['outcome']}[/]",
                        compact(res["state"]),
                    )
        store.close()
        self.console.print(table)

    def report_replicas(self, machine: govern.Machine, log: govern.EventLog) -> None:
        statuses = {name: self.replica_status(name) for name in REPLICA_MODES}
        reference = govern.Replica(machine, log)
        reference.sync()
        records = sorted(
            {k for s in statuses.values() for k in s.get("states", {})} | set(reference.records())
        )
        table = Table(title="final state of every order, per replica")
        table.add_column("order")
        for name, mode in REPLICA_MODES.items():
            table.add_column(f"{name}\n({mode})")
        for record in records:
            cells = []
            for name in REPLICA_MODES:
                state = statuses[name].get("states", {}).get(record)
                cells.append("?" if state is None else compact(state))
            table.add_row(record, *cells)
        self.console.print(table)
        digests = {name: s.get("digest") for name, s in statuses.items()}
        for name, s in statuses.items():
            self.console.print(
                f"  {name}: {s.get('position', 0)} events applied, {s.get('duplicates', 0)} "
                f"duplicates dropped, digest {str(s.get('digest'))[:16]}..., "
                f"every state valid: {s.get('valid')}"
            )
        identical = len(set(digests.values())) == 1 and reference.digest() in digests.values()
        valid = all(s.get("valid") for s in statuses.values())
        if identical and valid:
            self.console.print(
                f"[bold green]result: replicas identical[/] ({len(digests)} replicas, digest "
                f"{reference.digest()[:16]}..., equal to a fresh fold of the log)"
            )
        else:
            self.failures.append(f"replicas differ or hold invalid states: {digests}")

    def report_events(self, log: govern.EventLog) -> None:
        events = log.read()
        store = bide.open_store(f"sqlite:///{self.workdir / 'journal.db'}")
        lost, extra = [], []
        calls = 0
        for role in ROLES:
            run = f"demo-{role}"
            results = [
                r
                for r in bide.Journal(store, run).load().records()
                if isinstance(r, bide.ToolResult) and r.tool in ROLES[role]["events"] and not r.is_error
            ]
            calls += len(results)
            expected = {r.result["event_id"] for r in results}
            if len(expected) != len(results):
                extra.append(f"{run}: two tool calls report the same event")
            stored = {e.id for e in events if e.producer == run}
            lost += sorted(expected - stored)
            extra += sorted(stored - expected)
        store.close()
        silent = [role for role in ROLES if not any(e.producer == f"demo-{role}" for e in events)]
        if silent:
            # A model that calls no tools changes nothing: that is not a demo of anything.
            self.failures.append(
                f"the agents recorded nothing: {', '.join(silent)} appended no event "
                f"({len(events)} events in all); did the model call no tools?"
            )
        dense = [e.position for e in events] == list(range(len(events)))
        unique = len({e.id for e in events}) == len(events)
        if dense and unique and not lost and not extra and calls == len(events):
            self.console.print(
                f"[bold green]result: events exact[/]: {len(events)} events for {calls} tool calls, "
                "positions dense, none appended twice, none lost"
            )
        else:
            self.failures.append(f"event accounting: dense={dense} unique={unique} lost={lost} extra={extra}")

    def report_certificate(self) -> None:
        first = self.check_output.splitlines()[0] if self.check_output else ""
        if self.check_code == 0 and self.cert_matches:
            self.console.print(
                f"[bold green]result: certificate valid[/] ({first}; govern check exit 0; its "
                "machine is the one the agents ran)"
            )
        else:
            self.failures.append(
                f"govern check exit {self.check_code} (machine matches: {self.cert_matches}): "
                f"{self.check_output}"
            )

    def report_audit(self) -> None:
        key = self.workdir / "audit-key"
        made = subprocess.run(
            python_tool("bide.audit._cli", "keygen", str(key)), capture_output=True, text=True
        )
        if made.returncode != 0:
            self.failures.append(f"bide-audit keygen failed: {made.stderr.strip()}")
            return
        journal = f"sqlite:///{self.workdir / 'journal.db'}"
        packages = {role: self.workdir / f"{role}.evidence.json" for role in ROLES}
        exports = {
            role: subprocess.Popen(
                python_tool(
                    "bide.audit._cli",
                    "export",
                    "--store",
                    journal,
                    "--run",
                    f"demo-{role}",
                    "-o",
                    str(package),
                    "--key",
                    str(key),
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for role, package in packages.items()
        }
        for role, proc in exports.items():
            _, err = proc.communicate()
            if proc.returncode != 0:
                self.failures.append(f"bide-audit export {role} failed: {err.strip()}")
        checks = {
            role: subprocess.Popen(
                python_tool("bide.audit._cli", "verify-evidence", str(package), "--pubkey", f"{key}.pub"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for role, package in packages.items()
        }
        verified = 0
        for role, proc in checks.items():
            out, err = proc.communicate()
            if proc.returncode == 0:
                verified += 1
            else:
                self.failures.append(
                    f"bide-audit verify-evidence {role}: exit {proc.returncode} {out.strip()} {err.strip()}"
                )
        if verified == len(ROLES):
            self.console.print(
                f"[bold green]result: audit verified[/]: every agent's journal ({verified} runs) "
                "exported as a signed evidence package and verified offline by bide-audit"
            )
        self.commit_log(key)

    def commit_log(self, key: Path) -> None:
        """Sign the event log's Merkle tree head and check it, and each replica's root against it."""
        log = govern.EventLog(str(self.workdir / "events.db"))
        size = log.length()
        root = log.root(size)
        head = audit.sign_head(audit.load_signing_key(key), "govern-log:main", size, bytes.fromhex(root))
        audit.check_head(head, audit.load_public_key(f"{key}.pub"))
        roots = {name: self.replica_status(name).get("root") for name in REPLICA_MODES}
        if set(roots.values()) == {root}:
            self.console.print(
                f"[bold green]result: log committed[/]: signed tree head over {size} events (root "
                f"{root[:16]}...) verified; every replica recomputed that root from the events it applied"
            )
        else:
            self.failures.append(f"log root {root} but replicas computed {roots}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir", help="where to keep the SQLite files (default: a fresh temporary directory)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--agent", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--replica", choices=sorted(REPLICA_MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.agent:
        return run_agent(args.agent, Path(args.workdir))
    if args.replica:
        return run_replica(args.replica, Path(args.workdir))
    own = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="bide-demo-")) if own else Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return Demo(workdir, Console()).run()
    finally:
        if own and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
