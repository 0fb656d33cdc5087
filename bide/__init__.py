"""bide: durable AI agents whose side effects fire at most once, on an append-only journal.

Layers: a store keeps append-only byte records per run (`open_store`); the journal gives them meaning
(canonical, salted, versioned records); the agent loop journals every model turn and tool call and resumes
from the journal after a crash. Everyday API is re-exported here; test doubles live in `bide.testing`.

The re-exports are lazy: `import bide` (or of any submodule) loads only the exceptions, and the first use
of a name imports the submodule that defines it, so a user of one part (govern needs `bide._canonical`)
does not pay for the agent, the stores and their dependencies.
"""

from __future__ import annotations

import typing as _typing

from ._lazy import LazyExports as _LazyExports

if _typing.TYPE_CHECKING:  # type checkers and IDEs see the real objects; at run time `__getattr__` loads them
    from ._agent import Agent, RunResult, Thread
    from ._anthropic import AnthropicModel
    from ._cancel import acancel_run, cancel_run
    from ._canonical import canonical_json
    from ._errors import (
        ApprovalPending,
        AttemptChanged,
        BideError,
        CallInDoubt,
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
        RecordDamaged,
        ResolveRefused,
        ResultNotJournaled,
        RunEnded,
        RunHalted,
        RunInFlight,
        RunLimitExceeded,
        RunMismatch,
        RunNotFound,
        RunSleeping,
        StoreError,
        StoreNotFound,
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
    "AttemptChanged",
    "AttemptInfo",
    "BideError",
    "CallContext",
    "CallInDoubt",
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
    "RecordDamaged",
    "ResolveRefused",
    "ResultNotJournaled",
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
    "StoreNotFound",
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

# Where each public name is defined, submodule -> names (a test checks this against the imports above).
# fmt: off
_SUBMODULE_NAMES: dict[str, tuple[str, ...]] = {
    "_agent": ("Agent", "RunResult", "Thread"),
    "_anthropic": ("AnthropicModel",),
    "_cancel": ("acancel_run", "cancel_run"),
    "_canonical": ("canonical_json",),
    "_errors": (
        "ApprovalPending", "AttemptChanged", "BideError", "CallInDoubt", "ConfigError", "HaltAlreadyResolved",
        "HaltInFlight",
        "JournalFormatError", "LeaseLost", "ModelError", "NoLiveAttempt", "NotCalled", "OutcomeUnknown",
        "OutputInvalid", "RecordDamaged", "ResolveRefused", "ResultNotJournaled", "RunEnded", "RunHalted",
        "RunInFlight", "RunLimitExceeded", "RunMismatch", "RunNotFound", "RunSleeping", "StoreError",
        "StoreNotFound", "StoreURLError", "ToolError", "ToolNotStarted", "WriteRefused",
    ),
    "_gate": ("Approved", "Denied", "Gate", "GateDecision", "GateJournal", "GateRequest", "Pending"),
    "_journal": ("Journal",),
    "_memory": ("MemoryStore",),
    "_messages": (
        "AssistantMessage", "Message", "Model", "ModelRequest", "StreamingModel", "SystemMessage",
        "TextDelta", "ToolCall", "ToolMessage", "ToolSpec", "Usage", "UserMessage",
    ),
    "_open": ("open_store",),
    "_openai": ("OpenAIModel",),
    "_outcome": ("Outcome",),
    "_records": (
        "JOURNAL_FORMAT", "Attempt", "Cancel", "End", "GateRecord", "Header", "ModelTurn", "NotStarted",
        "OutputRetry", "Pause", "Record", "Segment", "Start", "Timer", "ToolResult", "decode_record",
        "encode_record",
    ),
    "_resolve": ("RunStatus", "aresolve_halt", "resolve_halt", "run_status"),
    "_retry": ("RetryPolicy",),
    "_sql": ("SQLStore",),
    "_store": ("Entry", "HookedStore", "Lease", "Store", "WriteHook", "WriteTransaction"),
    "_stream": (
        "Finished", "Halted", "ModelTurnEvent", "OutputRetried", "StreamEvent", "ToolCallFinished",
        "ToolCallStarted",
    ),
    "_timers": ("TimerTool", "timer"),
    "_tools": (
        "AttemptInfo", "CallContext", "Idempotent", "ReadOnly", "Safety", "SideEffect", "Tool",
        "current_call", "idempotency_key_for", "tool",
    ),
    "_worker": ("PassReport", "Worker"),
}
# fmt: on
_RENAMED = {"JOURNAL_FORMAT": "FORMAT"}  # public name -> its name in the defining submodule
# Submodule -> one to import before it is published. `_records` builds the pydantic schema of journal records
# at import, resolving the message classes' annotations in the module those classes name: they must still
# say bide._messages then, not bide (whose namespace lacks `Literal`, `Any`, ...).
_IMPORT_FIRST = {"_messages": "_records"}


_EXPORTS = _LazyExports(
    __name__, globals(), __all__, _SUBMODULE_NAMES, renamed=_RENAMED, import_first=_IMPORT_FIRST
)

# Hidden from type checkers: with a visible module `__getattr__`, mypy would accept any `bide.<typo>`.
if not _typing.TYPE_CHECKING:
    __getattr__ = _EXPORTS.load
__dir__ = _EXPORTS.names  # the loaded names and every public one, loaded or not


# The exceptions are published now (one small module): a traceback names bide.RunHalted, not
# bide._errors.RunHalted, even when the program never spelled the class's name.
_EXPORTS.publish("_errors")
