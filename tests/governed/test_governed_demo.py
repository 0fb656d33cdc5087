"""`make demo` end to end: the demo runs offline in a subprocess and reports every result it promises."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

import govern

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
    assert "resolved call c1.0 of run demo-support as succeeded" in out
    assert "result: halt shown and resolved" in out
    assert "The bank holds 2 refunds for 2 orders, none twice" in out
    refunds = [json.loads(line) for line in (tmp_path / "bank.jsonl").read_text().splitlines()]
    assert sorted(r["refund"] for r in refunds) == ["order-3", "order-4"]  # each fired exactly once
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
    spec = importlib.util.spec_from_file_location("demo_module", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    machine = demo.orders.build()
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
