"""For the worker tests: a run left halted for a person (its one tool's outcome is unknown: a wire whose
deadline has passed on the wall clock, the drive's clock a minute behind), the lines the worker logs (the
`said` fixture of conftest.py), and waiting on the event loop or on a thread for a condition."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import bide
from bide.testing import ScriptedModel, call, reply


@bide.tool(timeout=30)
async def wire() -> str:
    """Send a wire (its outcome is lost)."""
    raise ConnectionResetError("lost after sending")


def agent(store: bide.Store, script: list[Any], **options: Any) -> bide.Agent:
    return bide.Agent(ScriptedModel(script), store=store, tools=[wire], name="a", lease_ttl=5.0, **options)


def halted(store: bide.Store, run_id: str) -> None:
    """Leave `run_id` halted for a person: its wire's deadline has passed on the wall clock (the drive's
    clock was a minute behind), and its outcome is unknown."""
    with pytest.raises(bide.OutcomeUnknown):
        agent(store, [call("wire"), reply("sent")], clock=lambda: time.time() - 60).run_sync(run_id, "pay")
    assert bide.run_status(store, run_id).status == "halted"


class Said(logging.Handler):
    """The lines logged to it (add it to the "bide.worker" logger)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def halts(self, run_id: str) -> list[str]:
        """The lines that say `run_id` halted."""
        return [line for line in self.lines if line.startswith(f"run {run_id} halted")]


def wait_in_thread(event: threading.Event, what: str) -> None:
    """Wait for `event` on a thread (at most 30 s: then the test fails, naming `what`)."""
    assert event.wait(30), f"timed out waiting for {what}"


async def until(condition: Any, what: str) -> None:
    """Wait until `condition()` (at most 30 s: then the test fails, naming `what`)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)
