"""Test doubles and crash tooling for bide: a scripted model and a crash-point harness.

- `ScriptedModel`: an offline model that plays scripted turns (text, tool calls, errors). It picks the turn
  by counting the assistant messages it is shown, so a resumed run stays aligned with the script.
  `StreamingScriptedModel` also streams each turn's text in deltas (a `bide.StreamingModel`).
- `run_crash_schedules`: drives any `CrashSystem` through a crash at every store write, one by one, and
  through random multi-crash schedules, and reports per schedule how often the side effect fired.
- `BideCrashSystem`: bide's adapter for that harness (a one-tool run over a store that crashes on cue).
- `LoopbackServer`: a model API on 127.0.0.1 (OpenAI and Anthropic shapes, JSON or streamed) that records
  what it receives, for testing the HTTP adapters without network.
"""

from __future__ import annotations

from ._harness import (
    BideCrashSystem,
    CrashingStore,
    CrashReport,
    CrashRun,
    CrashSystem,
    ScheduleResult,
    SimulatedCrash,
    run_crash_schedules,
)
from ._loopback import (
    LoopbackServer,
    Received,
    Reply,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_stream,
)
from ._scripted import Call, Fail, ScriptedModel, StreamingScriptedModel, Turn, call, reply

__all__ = [
    "BideCrashSystem",
    "Call",
    "CrashReport",
    "CrashRun",
    "CrashSystem",
    "CrashingStore",
    "Fail",
    "LoopbackServer",
    "Received",
    "Reply",
    "ScheduleResult",
    "ScriptedModel",
    "SimulatedCrash",
    "StreamingScriptedModel",
    "Turn",
    "anthropic_message",
    "anthropic_stream",
    "call",
    "openai_completion",
    "openai_stream",
    "reply",
    "run_crash_schedules",
]
