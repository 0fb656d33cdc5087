"""Logging records (structured fields, levels) and OpenTelemetry spans (GenAI semantic conventions, parent
and child, errors), the spans read back through the SDK's in-memory exporter."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import bide
from bide.testing import Fail, LoopbackServer, Reply, ScriptedModel, call, openai_completion, reply


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # a provider can be set once per process
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


@bide.tool(safety=bide.ReadOnly)
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@bide.tool
def charge(cents: int) -> str:
    """Charge a card (a side effect)."""
    raise RuntimeError("card network timed out")


def named(finished: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


def test_spans_of_a_run_follow_the_genai_conventions(spans: InMemorySpanExporter) -> None:
    with LoopbackServer(
        lambda got: (
            openai_completion(calls=[("call_1", "weather", {"city": "Paris"})], usage=(10, 5))
            if got.n == 1
            else openai_completion("Sunny.", usage=(30, 7))
        )
    ) as server:
        model = bide.OpenAIModel("gpt-test", api_key="k", base_url=f"{server.url}/v1")
        agent = bide.Agent(model, store=bide.open_store("memory://"), tools=[weather], name="forecaster")
        assert agent.run_sync("run-1", "weather?").answer == "Sunny."
    finished = spans.get_finished_spans()
    [run] = named(finished, "invoke_agent forecaster")
    chats = named(finished, "chat gpt-test")
    [tool] = named(finished, "execute_tool weather")
    assert len(chats) == 2 and len(finished) == 4
    assert run.parent is None or run.parent.span_id != run.context.span_id
    for child in (*chats, tool):
        assert child.parent is not None and child.parent.span_id == run.context.span_id
        assert child.context.trace_id == run.context.trace_id
    a: dict[str, Any] = dict(run.attributes or {})
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "forecaster"
    assert a["gen_ai.conversation.id"] == "run-1" and a["gen_ai.request.model"] == "gpt-test"
    assert a["gen_ai.usage.input_tokens"] == 40 and a["gen_ai.usage.output_tokens"] == 12
    assert a["bide.run.status"] == "completed" and a["bide.run.resumed"] is False
    c = dict(chats[0].attributes or {})
    assert c["gen_ai.operation.name"] == "chat" and c["gen_ai.request.model"] == "gpt-test"
    assert c["gen_ai.provider.name"] == "openai" and c["server.address"] == "127.0.0.1"
    assert c["gen_ai.usage.input_tokens"] == 10 and c["gen_ai.usage.output_tokens"] == 5
    assert tuple(c["gen_ai.response.finish_reasons"]) == ("tool_calls",) and c["bide.turn"] == 0
    t = dict(tool.attributes or {})
    assert t["gen_ai.operation.name"] == "execute_tool" and t["gen_ai.tool.name"] == "weather"
    assert t["gen_ai.tool.call.id"] == "c0.0" and t["bide.tool.safety"] == "read_only"
    assert tool.status.status_code != StatusCode.ERROR


def test_a_halt_and_a_failed_tool_are_recorded_as_errors(spans: InMemorySpanExporter) -> None:
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=500), reply("done")]),
        store=bide.open_store("memory://"),
        tools=[charge],
    )
    with pytest.raises(bide.OutcomeUnknown):
        agent.run_sync("run-2", "charge")
    finished = spans.get_finished_spans()
    [tool] = named(finished, "execute_tool charge")
    assert tool.status.status_code == StatusCode.ERROR
    assert (tool.attributes or {})["error.type"] == "RuntimeError"
    assert any(e.name == "exception" for e in tool.events)
    [run] = named(finished, "invoke_agent agent")
    assert run.status.status_code == StatusCode.ERROR
    assert (run.attributes or {})["error.type"] == "OutcomeUnknown"
    assert (run.attributes or {})["bide.run.status"] == "halted"


def test_a_failed_model_call_is_an_error_span(spans: InMemorySpanExporter) -> None:
    agent = bide.Agent(
        ScriptedModel([Fail(RuntimeError("boom")), reply("ok")]), store=bide.open_store("memory://")
    )
    with pytest.raises(bide.ModelError):
        agent.run_sync("run-3", "hi")
    [chat] = named(spans.get_finished_spans(), "chat scripted")
    assert (
        chat.status.status_code == StatusCode.ERROR
        and (chat.attributes or {})["error.type"] == "RuntimeError"
    )
    spans.clear()
    assert agent.run_sync("run-3", "hi").answer == "ok"
    [run] = named(spans.get_finished_spans(), "invoke_agent agent")
    assert run.status.status_code != StatusCode.ERROR


def fields(record: logging.LogRecord, *names: str) -> dict[str, Any]:
    return {n: getattr(record, n, None) for n in names}


def test_logging_records_carry_run_call_and_tool(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bide")
    agent = bide.Agent(
        ScriptedModel([call("weather", city="Oslo"), Fail(RuntimeError("model down")), reply("Cold.")]),
        store=bide.open_store("memory://"),
        tools=[weather],
        name="forecaster",
    )
    with pytest.raises(bide.ModelError):
        agent.run_sync("run-4", "weather?")
    records = [r for r in caplog.records if r.name == "bide"]
    started = [r for r in records if r.getMessage() == "run run-4 started"]
    assert len(started) == 1 and started[0].levelno == logging.INFO
    assert fields(started[0], "run_id", "agent") == {"run_id": "run-4", "agent": "forecaster"}
    calls = [r for r in records if getattr(r, "call_id", None) == "c0.0"]
    assert [r.levelno for r in calls] == [logging.DEBUG, logging.DEBUG]
    assert all(fields(r, "run_id", "tool") == {"run_id": "run-4", "tool": "weather"} for r in calls)
    turns = [r for r in records if getattr(r, "model", None) == "scripted"]
    assert [getattr(r, "turn", None) for r in turns] == [0, 1] and all(
        r.levelno == logging.DEBUG for r in turns
    )
    [failed] = [r for r in records if r.levelno == logging.WARNING]
    assert fields(failed, "run_id", "status", "error_type") == {
        "run_id": "run-4",
        "status": "failed",
        "error_type": "ModelError",
    }
    caplog.clear()
    assert agent.run_sync("run-4", "weather?").answer == "Cold."
    records = [r for r in caplog.records if r.name == "bide" and r.levelno == logging.INFO]
    assert records[0].getMessage() == "run run-4 resumed (1 turns journaled)"
    assert fields(records[-1], "run_id", "status", "turn") == {
        "run_id": "run-4",
        "status": "completed",
        "turn": 2,
    }


def test_halts_are_warnings_and_quiet_runs_log_nothing_below(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="bide")
    agent = bide.Agent(
        ScriptedModel([call("charge", cents=1), reply("x")]),
        store=bide.open_store("memory://"),
        tools=[charge],
    )
    with pytest.raises(bide.OutcomeUnknown):
        agent.run_sync("run-5", "charge")
    [halt] = [r for r in caplog.records if r.name == "bide"]
    assert halt.levelno == logging.WARNING
    assert fields(halt, "run_id", "status", "error_type") == {
        "run_id": "run-5",
        "status": "halted",
        "error_type": "OutcomeUnknown",
    }


def test_model_retries_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bide")
    with LoopbackServer(
        lambda got: Reply(status=429, headers={"retry-after": "0"}) if got.n == 1 else openai_completion("ok")
    ) as server:
        model = bide.OpenAIModel("m", api_key="k", base_url=f"{server.url}/v1", backoff=0.001)
        assert bide.Agent(model, store=bide.open_store("memory://")).run_sync("r", "hi").answer == "ok"
    [retry] = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert retry.levelno == logging.INFO and fields(retry, "model", "http_status") == {
        "model": "m",
        "http_status": 429,
    }
