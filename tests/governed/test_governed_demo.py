"""`make demo` end to end: the demo runs offline in a subprocess and reports every result it promises."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rich.console import Console

import bide
import govern
from bide.testing import ScriptedModel, call, reply

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


@pytest.mark.slow
def test_the_demo_runs_and_everything_checks_out(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)  # the scripted models: offline and deterministic per agent
    done = subprocess.run(
        [sys.executable, str(DEMO), "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "SIGKILL warehouse agent" in out
    assert "resumed from its journal" in out
    # the real side effect: killed after the bank acted, halted instead of refunding twice, resolved
    assert "SIGKILL support agent" in out and "before its answer reached the journal" in out
    assert "HALTED agent support: bide.OutcomeUnknown on call" in out and "refund_payment" in out
    assert "$ bide resolve --store sqlite:///" in out and "--succeeded" in out
    # which call is resolved depends on the race of order-3's cancel with its payment (refused or not)
    assert re.search(r"resolved call c\d+\.0 of run demo-support as succeeded", out)
    assert "result: halt shown and resolved" in out and ", none twice" in out
    # Each refund fired exactly once, and only for an order the log ends with cancelled and paid before
    # its cancel: a cancel that landed after the shipment was a no-op, one that landed before the payment
    # found nothing to refund, and neither order was refunded.
    refunds = [json.loads(line)["refund"] for line in (tmp_path / "bank.jsonl").read_text().splitlines()]
    machine = govern.Machine.load(tmp_path / "orders.machine")
    log = govern.EventLog(str(tmp_path / "events.db"))
    final = govern.Replica(machine, log)
    final.sync()

    def paid_before_cancel(order: str) -> bool:
        events = [e.event for e in log.read_record(order)]
        return "pay" in events and events.index("pay") < events.index("cancel")

    refundable = [
        order
        for order in ("order-3", "order-4")
        if final.state(order)["status"] == "cancelled" and paid_before_cancel(order)
    ]
    assert refunds and sorted(refunds) == refundable
    assert "result: refunds match cancellations: the bank refunded " + ", ".join(refundable) in out
    assert "result: replicas identical (3 replicas" in out
    assert "result: events exact: " in out and "none appended twice, none lost" in out
    assert "result: certificate valid" in out
    assert "result: audit verified" in out
    assert "result: log committed: signed tree head over" in out
    assert "demo passed" in out
    # The files the demo leaves behind are real: the certificate, the log and the journal.
    assert (tmp_path / "orders.govern-cert.json").exists()
    assert (tmp_path / "events.db").exists() and (tmp_path / "journal.db").exists()


def _send_chat(handler: http.server.BaseHTTPRequestHandler, model: str, message: dict[str, Any]) -> None:
    """Answer a chat-completions request with one assistant `message`."""
    reply = json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
    ).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(reply)))
    handler.end_headers()
    handler.wfile.write(reply)


def _demo_against(
    handler: type[http.server.BaseHTTPRequestHandler], tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    """Run the demo (with `args`) with its agents driven by a loopback OpenAI-compatible `handler`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            **os.environ,
            "COLUMNS": "200",
            "OPENAI_API_KEY": "test-key",
            "OPENAI_MODEL": "loopback-model",
            "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
        }
        return subprocess.run(
            [sys.executable, str(DEMO), "--workdir", str(tmp_path), *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    finally:
        server.shutdown()


class _SilentModel(http.server.BaseHTTPRequestHandler):
    """A loopback OpenAI-compatible endpoint whose model answers at once and calls no tool."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _send_chat(self, body["model"], {"role": "assistant", "content": "nothing to do"})

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_the_demo_fails_when_the_agents_record_nothing(tmp_path: Path) -> None:
    done = _demo_against(_SilentModel, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the agents recorded nothing: payments, warehouse, support appended no event" in done.stdout
    assert "demo FAILED" in done.stdout and "demo passed" not in done.stdout


@functools.cache
def _demo_module() -> Any:
    """examples/demo.py, imported as a module (it is a script, not a package)."""
    spec = importlib.util.spec_from_file_location("demo_module", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    return demo


def _log(machine: govern.Machine, events: list[tuple[str, str]], url: str = "memory://") -> govern.EventLog:
    """The event log at `url` with `events` (event, order) appended in that order."""
    log = govern.EventLog(url, machine=machine)
    for i, (event, order) in enumerate(events):
        made = govern.Event(id=f"e{i}", machine=machine.digest, record=order, event=event, producer="shop")
        log.append(made)
    return log


def _shipped_order_4(machine: govern.Machine) -> govern.EventLog:
    """A log where order-3 is paid and order-4 paid, restocked and shipped (a cancel of it is a no-op)."""
    shipped = [("pay", "order-3"), ("pay", "order-4"), ("restock", "order-4"), ("ship", "order-4")]
    return _log(machine, shipped)


# order-3's cancel overtook its payment (the payment after it is a no-op); order-4 is paid
CANCELLED_BEFORE_PAID = [("cancel", "order-3"), ("pay", "order-3"), ("pay", "order-4")]


def _refund_agent(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    model: Any,
    log: govern.EventLog | None = None,
    store_url: str = "memory://",
) -> tuple[bide.RunResult, govern.EventLog]:
    """The demo's support agent (its cancel, order_state and refund tools) driven by `model` in-process, on
    `log` (default: `_shipped_order_4`), journaled in the store at `store_url`."""
    demo = _demo_module()
    monkeypatch.setattr(demo, "BANK_ANSWER_DELAY", 0.0)
    machine = demo.orders.build()
    log = _shipped_order_4(machine) if log is None else log
    order_state = demo.order_reader(machine, log)
    tools = [
        govern.event_tool(machine, log, "cancel"),
        bide.Tool.from_function(order_state, safety=bide.ReadOnly),
        demo.refund_tool(tmp_path, demo.cancel_reader(machine, log)),
    ]
    store = bide.open_store(store_url)
    try:
        agent = bide.Agent(model, store=store, tools=tools)
        return agent.run_sync("demo-support", "cancel order-3 and order-4, refund the cancelled ones"), log
    finally:
        store.close()


def test_the_refund_tool_refuses_an_order_that_is_not_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedModel([call("refund_payment", record="order-4"), reply("done")])
    _refund_agent(tmp_path, monkeypatch, model)
    [told] = [m for m in model.requests[1].messages if isinstance(m, bide.ToolMessage)]
    assert told.is_error and "order-4 is shipped, not cancelled" in told.content
    assert "nothing was sent to the bank" in told.content
    assert not (tmp_path / "bank.jsonl").exists()


def test_the_scripted_support_agent_refunds_only_what_its_cancels_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = _demo_module()
    monkeypatch.setattr(demo, "MODEL_DELAY", 0.0)
    result, log = _refund_agent(tmp_path, monkeypatch, demo.scripted("support"))
    assert [(e.event, e.record) for e in log.read()][-2:] == [("cancel", "order-3"), ("cancel", "order-4")]
    assert [r["refund"] for r in demo.bank_refunds(tmp_path)] == ["order-3"]
    assert result.answer == (
        "support: done, 3 tool calls made; order-3 refunded; "
        "order-4 not refunded: the cancel left it shipped."
    )


REFUSED_UNPAID = (
    "order-3 was cancelled while pending, before it was charged, so there is no payment to refund and "
    "nothing was sent to the bank"
)


def test_the_refund_tool_refuses_an_order_cancelled_before_it_was_charged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = _demo_module().orders.build()
    log = _log(machine, CANCELLED_BEFORE_PAID)
    model = ScriptedModel(
        [call("refund_payment", record="order-3"), call("refund_payment", record="order-4"), reply("done")]
    )
    _refund_agent(tmp_path, monkeypatch, model, log)
    [refused] = [m for m in model.requests[1].messages if isinstance(m, bide.ToolMessage)]
    assert refused.is_error and REFUSED_UNPAID in refused.content
    # an order that is still unpaid-cancelled is refused; one paid and then cancelled is not
    assert [r["refund"] for r in _demo_module().bank_refunds(tmp_path)] == []
    log.append(govern.Event(id="c4", machine=machine.digest, record="order-4", event="cancel", producer="s"))
    model = ScriptedModel([call("refund_payment", record="order-4"), reply("done")])
    _refund_agent(tmp_path, monkeypatch, model, log)
    [refunded] = [m for m in model.requests[1].messages if isinstance(m, bide.ToolMessage)]
    assert not refunded.is_error and refunded.content == "refunded the payment of order-4"
    assert [r["refund"] for r in _demo_module().bank_refunds(tmp_path)] == ["order-4"]


def test_the_scripted_support_agent_reports_a_refund_it_was_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    demo = _demo_module()
    monkeypatch.setattr(demo, "MODEL_DELAY", 0.0)
    machine = demo.orders.build()
    log = _log(machine, CANCELLED_BEFORE_PAID)
    result, _ = _refund_agent(tmp_path, monkeypatch, demo.scripted("support"), log)
    assert [(e.event, e.record) for e in log.read()][-2:] == [("cancel", "order-3"), ("cancel", "order-4")]
    assert [r["refund"] for r in demo.bank_refunds(tmp_path)] == ["order-4"]
    told = "support: done, 4 tool calls made; order-3 not refunded: " + REFUSED_UNPAID
    assert result.answer.startswith(told)
    assert result.answer.endswith("; order-4 refunded.")


def test_the_demo_counts_a_refused_refund_call_as_no_refund(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refund call the tool refused sent nothing to the bank: the halt's report holds the bank's refunds
    against the refund calls that succeeded, and passes."""
    demo = _demo_module()
    machine = demo.orders.build()
    log = _log(machine, [*CANCELLED_BEFORE_PAID, ("cancel", "order-4")])
    model = ScriptedModel(
        [call("refund_payment", record="order-3"), call("refund_payment", record="order-4"), reply("done")]
    )
    _refund_agent(tmp_path, monkeypatch, model, log, f"sqlite:///{tmp_path / 'journal.db'}")
    conductor = demo.Demo(tmp_path, Console(file=io.StringIO(), width=300))
    conductor.halts, conductor.resolutions = [{"call_id": "c1.0"}], ["bide resolve ... c1.0 --succeeded"]
    conductor.report_halt()
    assert conductor.failures == []
    assert "The bank holds 1 refund for 1 order, none twice" in conductor.console.file.getvalue()


@pytest.mark.slow
def test_the_support_agent_process_refunds_no_order_cancelled_before_its_payment(tmp_path: Path) -> None:
    """The demo's support agent, as `make demo` runs it (its own process, its scripted model), on a log
    where order-3's cancel came before its payment: it is told why order-3 is not refunded, and the bank
    refunds order-4 only."""
    machine = _demo_module().orders.build()
    machine.save(tmp_path / "orders.machine")
    _log(machine, CANCELLED_BEFORE_PAID, str(tmp_path / "events.db"))
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"}
    done = subprocess.run(
        [sys.executable, str(DEMO), "--workdir", str(tmp_path), "--agent", "support"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert [r["refund"] for r in _demo_module().bank_refunds(tmp_path)] == ["order-4"]
    assert "order-3 not refunded: " + REFUSED_UNPAID in done.stdout
    assert done.stdout.strip().endswith("; order-4 refunded.")


def _report_refunds(
    demo: Any, tmp_path: Path, machine: govern.Machine, log: govern.EventLog, refunds: list[dict[str, str]]
) -> Any:
    """The demo's final refund check, the bank holding `refunds`: the conductor, its failures and output."""
    (tmp_path / "bank.jsonl").write_text("".join(json.dumps(refund) + "\n" for refund in refunds))
    conductor = demo.Demo(tmp_path, Console(file=io.StringIO(), width=200))
    conductor.report_refunds(machine, log)
    return conductor


def test_the_demo_fails_when_the_bank_refunded_an_order_that_is_not_cancelled(tmp_path: Path) -> None:
    demo = _demo_module()
    machine = demo.orders.build()
    log = _shipped_order_4(machine)
    log.append(govern.Event(id="c3", machine=machine.digest, record="order-3", event="cancel", producer="s"))
    refunds = [{"refund": "order-3", "call_id": "c1.0"}, {"refund": "order-4", "call_id": "c3.0"}]
    assert _report_refunds(demo, tmp_path, machine, log, refunds).failures == [
        "the bank refunded orders that are not cancelled in the final state of the log: order-4 (shipped); "
        "a refund must follow an applied cancellation (the refund tool checks the order's state)"
    ]
    refunded = [{"refund": "order-3", "call_id": "c1.0", "key": "k"}]
    conductor = _report_refunds(demo, tmp_path, machine, log, refunded)
    assert conductor.failures == []
    assert "refunds match cancellations: the bank refunded order-3" in conductor.console.file.getvalue()


def test_the_demo_fails_when_the_bank_refunded_an_order_cancelled_before_its_payment(tmp_path: Path) -> None:
    demo = _demo_module()
    machine = demo.orders.build()
    log = _log(machine, CANCELLED_BEFORE_PAID)
    log.append(govern.Event(id="c4", machine=machine.digest, record="order-4", event="cancel", producer="s"))
    refunds = [{"refund": "order-3", "call_id": "c1.0"}, {"refund": "order-4", "call_id": "c3.0"}]
    assert _report_refunds(demo, tmp_path, machine, log, refunds).failures == [
        "the bank refunded orders that were not charged when their cancel applied: order-3 (cancelled "
        "while pending); a refund must follow the payment it sends back (the refund tool checks what the "
        "cancel found)"
    ]
    conductor = _report_refunds(demo, tmp_path, machine, log, refunds[1:])
    assert conductor.failures == []
    assert (
        "refunds match cancellations: the bank refunded order-4, each cancelled in the log after it was "
        "charged; not refunded: order-3 (cancelled before it was charged)"
    ) in conductor.console.file.getvalue()


def test_make_demo_runs_in_the_project_virtual_environment() -> None:
    root = DEMO.parents[1]
    plan = subprocess.run(["make", "-n", "demo"], cwd=root, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    assert "tests/infra/ensure-venv.sh .venv" in plan.stdout
    assert ".venv/bin/python examples/demo.py" in plan.stdout
    assert "break-system-packages" not in (root / "tests" / "infra" / "ensure-venv.sh").read_text()
    assert ".venv/" in (root / ".gitignore").read_text().splitlines()


class _FakeOpenAI(http.server.BaseHTTPRequestHandler):
    """A loopback OpenAI-compatible endpoint: pays order-1 ... order-4, one tool call per turn."""

    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        done = sum(1 for m in body["messages"] if m["role"] == "tool")
        if done < 4:
            call = {
                "id": f"call_{done}",
                "type": "function",
                "function": {"name": "pay", "arguments": json.dumps({"record": f"order-{done + 1}"})},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        else:
            message = {"role": "assistant", "content": "all four orders are paid"}
        _send_chat(self, body["model"], message)

    def log_message(self, *args: Any) -> None:
        pass


def test_an_openai_compatible_endpoint_drives_a_demo_agent(tmp_path: Path) -> None:
    """With OPENAI_API_KEY and OPENAI_BASE_URL set, a demo agent talks to that endpoint (here a loopback
    server) and its tool calls land in the shared log with their consequences."""
    machine = _demo_module().orders.build()
    machine.save(tmp_path / "orders.machine")
    done = _demo_against(_FakeOpenAI, tmp_path, "--agent", "payments")
    assert done.returncode == 0, done.stderr
    assert "all four orders are paid" in done.stdout
    assert _FakeOpenAI.requests and _FakeOpenAI.requests[0]["model"] == "loopback-model"
    offered = {t["function"]["name"] for t in _FakeOpenAI.requests[0]["tools"]}
    assert offered == {"pay", "order_state"}
    log = govern.EventLog(str(tmp_path / "events.db"))
    assert [(e.event, e.record) for e in log.read()] == [("pay", f"order-{i}") for i in range(1, 5)]
    last_tool_message = [m for m in _FakeOpenAI.requests[-1]["messages"] if m["role"] == "tool"][-1]
    assert '"outcome":"applied"' in last_tool_message["content"].replace(" ", "")
