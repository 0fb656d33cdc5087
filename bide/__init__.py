"""bide: durable AI agents whose side effects fire at most once, on an append-only journal.

Layers: a store keeps append-only byte records per run (`open_store`); the journal gives them meaning
(canonical, salted, versioned records); the agent loop journals every model turn and tool call and resumes
from the journal after a crash. Everyday API is re-exported here; test doubles live in `bide.testing`.
"""

from __future__ import annotations

import contextlib as _contextlib

from ._agent import Agent, RunResult, Thread
from ._anthropic import AnthropicModel
from ._cancel import acancel_run, cancel_run
from ._canonical import canonical_json
from ._errors import (
    ApprovalPending,
    BideError,
    ConfigError,
    HaltAlreadyResolved,
    HaltInFlight,
    JournalFormatError,
    LeaseLost,
    ModelError,
    NoLiveAttempt,
    NotCalled,
    OutcomeUnknown,
    OutputInvalid,
    ResolveRefused,
    RunEnded,
    RunHalted,
    RunInFlight,
    RunLimitExceeded,
    RunMismatch,
    RunNotFound,
    RunSleeping,
    StoreError,
    StoreURLError,
    ToolError,
    ToolNotStarted,
    WriteRefused,
)
from ._gate import Approved, Denied, Gate, GateDecision, GateJournal, GateRequest, Pending
from ._journal import Journal
from ._memory import MemoryStore
from ._messages import (
    AssistantMessage,
    Message,
    Model,
    ModelRequest,
    StreamingModel,
    SystemMessage,
    TextDelta,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from ._open import open_store
from ._openai import OpenAIModel
from ._outcome import Outcome
from ._records import FORMAT as JOURNAL_FORMAT
from ._records import (
    Attempt,
    Cancel,
    End,
    GateRecord,
    Header,
    ModelTurn,
    NotStarted,
    OutputRetry,
    Pause,
    Record,
    Segment,
    Start,
    Timer,
    ToolResult,
    decode_record,
    encode_record,
)
from ._resolve import RunStatus, aresolve_halt, resolve_halt, run_status
from ._retry import RetryPolicy
from ._sql import SQLStore
from ._store import Entry, HookedStore, Lease, Store, WriteHook, WriteTransaction
from ._stream import (
    Finished,
    Halted,
    ModelTurnEvent,
    OutputRetried,
    StreamEvent,
    ToolCallFinished,
    ToolCallStarted,
)
from ._timers import TimerTool, timer
from ._tools import (
    AttemptInfo,
    CallContext,
    Idempotent,
    ReadOnly,
    Safety,
    SideEffect,
    Tool,
    current_call,
    idempotency_key_for,
    tool,
)
from ._worker import PassReport, Worker

__all__ = [
    "JOURNAL_FORMAT",
    "Agent",
    "AnthropicModel",
    "ApprovalPending",
    "Approved",
    "AssistantMessage",
    "Attempt",
    "AttemptInfo",
    "BideError",
    "CallContext",
    "Cancel",
    "ConfigError",
    "Denied",
    "End",
    "Entry",
    "Finished",
    "Gate",
    "GateDecision",
    "GateJournal",
    "GateRecord",
    "GateRequest",
    "HaltAlreadyResolved",
    "HaltInFlight",
    "Halted",
    "Header",
    "HookedStore",
    "Idempotent",
    "Journal",
    "JournalFormatError",
    "Lease",
    "LeaseLost",
    "MemoryStore",
    "Message",
    "Model",
    "ModelError",
    "ModelRequest",
    "ModelTurn",
    "ModelTurnEvent",
    "NoLiveAttempt",
    "NotCalled",
    "NotStarted",
    "OpenAIModel",
    "Outcome",
    "OutcomeUnknown",
    "OutputInvalid",
    "OutputRetried",
    "OutputRetry",
    "PassReport",
    "Pause",
    "Pending",
    "ReadOnly",
    "Record",
    "ResolveRefused",
    "RetryPolicy",
    "RunEnded",
    "RunHalted",
    "RunInFlight",
    "RunLimitExceeded",
    "RunMismatch",
    "RunNotFound",
    "RunResult",
    "RunSleeping",
    "RunStatus",
    "SQLStore",
    "Safety",
    "Segment",
    "SideEffect",
    "Start",
    "Store",
    "StoreError",
    "StoreURLError",
    "StreamEvent",
    "StreamingModel",
    "SystemMessage",
    "TextDelta",
    "Thread",
    "Timer",
    "TimerTool",
    "Tool",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolError",
    "ToolMessage",
    "ToolNotStarted",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "UserMessage",
    "Worker",
    "WriteHook",
    "WriteRefused",
    "WriteTransaction",
    "acancel_run",
    "aresolve_halt",
    "cancel_run",
    "canonical_json",
    "current_call",
    "decode_record",
    "encode_record",
    "idempotency_key_for",
    "open_store",
    "resolve_halt",
    "run_status",
    "timer",
    "tool",
]

# Public objects report their public path (bide.Agent, not bide._agent.Agent) in reprs and tracebacks.
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) and _obj.__module__.startswith("bide._"):
        with _contextlib.suppress(AttributeError, TypeError):
            _obj.__module__ = "bide"
del _name, _obj
