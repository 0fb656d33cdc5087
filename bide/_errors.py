"""The root of every error the `bide` package raises.

Each subclass says whose fault it is and what to do next; catch `BideError` to catch them all::

    BideError
    ├── ConfigError (also ValueError)     your definition or argument is wrong; fix the code
    │   └── RunMismatch                   the run exists with another input or entry point
    ├── StoreError                        the store failed or holds something unexpected
    │   ├── JournalFormatError            the run was written in another journal format
    │   └── RecordDamaged                 a journal record was edited or damaged in the database
    ├── StoreNotFound                     no store at that URL (create=False), no such PostgreSQL database
    ├── ModelError                        the model call failed (after retries)
    ├── RunLimitExceeded                  the run used up max_turns
    ├── OutputInvalid                     the final answer never validated against output_type
    ├── ToolNotStarted                    a side effect provably did not start; run again to retry
    ├── RunInFlight                       another driver holds the run's lease; run again later
    │   └── ResultNotJournaled            ... taken over after a side effect of this drive returned
    ├── WriteRefused                      the store refused a journal write; nothing was written
    │   ├── LeaseLost                     another driver took over the run's lease
    │   └── RunEnded                      the run has ended: nothing is appended after run:end
    ├── ToolError                         raised BY a tool: a known failure the model should see
    ├── NotCalled                         raised BY a tool: the effect was provably not performed
    ├── CallInDoubt                       raised BY a retry-safe tool: its outcome is unknown; run again
    ├── RunNotFound                       no run with that id in the store
    ├── ResolveRefused                    resolve_halt refused to record an outcome
    │   ├── HaltInFlight                  another driver may still be running the call; wait
    │   ├── HaltAlreadyResolved           a different outcome is already recorded
    │   └── NoLiveAttempt                 nothing to resolve for that call
    └── RunHalted                         the run stopped and needs a decision; never a success
        ├── OutcomeUnknown                a side effect may or may not have happened
        ├── RunSleeping                   the run waits on a durable timer until its wake-up time
        └── ApprovalPending               a gate has not approved a call yet

Halts are exceptions on purpose: a halted run can never be mistaken for a finished one.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = [
    "ApprovalPending",
    "AttemptChanged",
    "BideError",
    "CallInDoubt",
    "ConfigError",
    "HaltAlreadyResolved",
    "HaltInFlight",
    "JournalFormatError",
    "LeaseLost",
    "ModelError",
    "NoLiveAttempt",
    "NotCalled",
    "OutcomeUnknown",
    "OutputInvalid",
    "RecordDamaged",
    "ResolveRefused",
    "ResultNotJournaled",
    "RunEnded",
    "RunHalted",
    "RunInFlight",
    "RunLimitExceeded",
    "RunMismatch",
    "RunNotFound",
    "RunSleeping",
    "StoreError",
    "StoreNotFound",
    "StoreURLError",
    "ToolError",
    "ToolNotStarted",
    "WriteRefused",
]


class BideError(Exception):
    """Base class of every error raised by `bide`.

    `also` holds the other failures of the same step: when several calls of one parallel turn halt or
    fail, the worst is raised and the others are here (and in its notes).
    """

    also: tuple[BaseException, ...] = ()


class ConfigError(BideError, ValueError):
    """A definition or argument is wrong (bad tool, bad store URL, bad run id); fix the calling code."""


class StoreURLError(ConfigError):
    """A store URL (for `open_store`, or `govern.EventLog`) names no place to keep records; the message says
    what to write instead (``sqlite:///bide.db``, ``memory://``, ``pip install 'bide[postgres]'``)."""


class RunMismatch(ConfigError):
    """The run id already holds a run started with a different input or entry point.

    A run id names one run forever: pick a new run id for new work, or pass the original input to resume.
    """


class StoreError(BideError):
    """The store failed, or returned something the journal cannot trust.

    A write that raised may or may not have committed; the journal treats it that way (see docs/guarantee.md).
    `lasting` is True when this store object fails every later request the same way (its SQLite file was
    deleted, moved or replaced while open): waiting does not help, opening the store again after the
    file is put back does.
    """

    def __init__(self, message: str = "", *, lasting: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting


class StoreNotFound(BideError):
    """`open_store(url, create=False)` found no store there: no SQLite file, or a database without bide's
    tables under that table prefix. Nothing was created; check the URL and the table prefix. Raised with
    `create=True` too for a PostgreSQL database that does not exist: bide creates tables, never databases.
    `missing` says which: ``"file"``, ``"database"`` or ``"tables"`` (only then can the table prefix be
    the cause).
    """

    def __init__(self, message: str, *, missing: Literal["file", "database", "tables"] = "tables") -> None:
        super().__init__(message)
        self.missing = missing


class JournalFormatError(StoreError):
    """The run was written in a journal format this version of bide does not read.

    Finish or resolve runs with the bide version that started them before upgrading.
    """


class RecordDamaged(StoreError):
    """A journal record in the store cannot be decoded, or says it is another record: it was edited or
    damaged in the database (bide never writes such a record). Reading the run again fails the same way;
    retrying does not help. `bide show RUN` names the record; restore the store from a backup. `key` is the
    record's key in the store.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class ModelError(BideError):
    """The model could not produce a turn (a 4xx answer, or transient failures that outlasted the retries).

    Nothing is journaled for a failed model call, so running the same run id again retries it.
    """

    def __init__(self, message: str, *, status: int | None = None, body: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class RunLimitExceeded(BideError):
    """The run reached its max_turns limit without a final answer; raise the limit and run it again."""


class OutputInvalid(BideError):
    """The model's final answer failed validation against the agent's `output_type` on every try (the first
    and `output_retries` more); the run (or the thread's message) has ended with status "failed". Make the
    model or the prompt produce the schema, raise output_retries, and use a new run id (or send the thread
    a new message)."""


class ToolNotStarted(BideError):
    """A side-effect call provably did not start (the tool raised NotCalled, or the store failed before it).

    This is recorded in the journal, so running the same run id again claims a new attempt and calls the tool
    again; it is not a halt.
    """


class RunInFlight(BideError):
    """Another driver holds the run's lease (it is driving the run now), or a call of the run is still
    running in this process. Nothing was done; run it again after `retry_after` (Unix seconds).

    `holder` is the lease holder's id and `expires_at` when its lease runs out unless it is renewed (None
    when the call runs in this process).
    """

    def __init__(
        self, message: str, *, run_id: str, holder: str | None, expires_at: float | None, retry_after: float
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.holder = holder
        self.expires_at = expires_at
        self.retry_after = retry_after


class ResultNotJournaled(RunInFlight):
    """A side-effect call of this drive ran and returned, but another driver took over the run's lease
    before its result was journaled (this driver was paused past its lease, or its write waited too long
    for the store): nothing was written. The other driver cannot know the call ran, so it halts the run on
    the call with `OutcomeUnknown`, for a person to resolve with what the call returned, which is here:
    `returned` (the value the model would have seen; `is_error`: a failure the tool reported with
    ToolError). `call_id`, `tool` and `attempt` name the call and its attempt (pass it to `resolve_halt`).

    This process keeps the result: once the other driver's lease is gone, running the run again here
    journals it without calling the tool again.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        retry_after: float,
        call_id: str,
        tool: str,
        attempt: int,
        returned: Any,
        is_error: bool,
    ) -> None:
        super().__init__(message, run_id=run_id, holder=None, expires_at=None, retry_after=retry_after)
        self.call_id = call_id
        self.tool = tool
        self.attempt = attempt
        self.returned = returned
        self.is_error = is_error


class WriteRefused(BideError):
    """The store refused a journal write and wrote none of it (unlike `StoreError`, nothing may have
    committed). Load the run again to see why."""


class LeaseLost(WriteRefused):
    """The writer's lease on the run was taken over by another driver (its fencing token is stale): a
    paused or slow driver cannot write once someone else drives the run."""


class RunEnded(WriteRefused):
    """The run has its `run:end` record: nothing more is appended to it."""


class ToolError(BideError):
    """Raise from a tool for a failure whose outcome is known; the message goes back to the model.

    From a side-effect tool, raising ToolError declares that the failure is certain (for example, the provider
    answered "card declined"). Any other exception from a side-effect tool leaves the outcome unknown.
    """


class NotCalled(BideError):
    """Raise from a tool to prove that its effect was not performed (for example, refused before sending).

    bide records the attempt as not started, so the next run of the same run id retries the call.
    """


class CallInDoubt(BideError):
    """Raise from a retry-safe tool (Idempotent or ReadOnly) that cannot tell whether its effect happened
    (the system it called went away after the request was sent, and stayed away).

    Nothing is journaled for the call and the drive stops with this error: the model is not told the call
    failed (it would call again, as a new call). The next drive of the run calls the tool again for the
    same call, with the same idempotency key, which settles it. From a side-effect tool it is an unknown
    outcome like any other exception: the run halts.
    """


class ResolveRefused(BideError):
    """`resolve_halt` refused to record an outcome; the message says why and what to do."""


class HaltInFlight(ResolveRefused):
    """Another driver may still be running the call (its deadline has not passed, or it holds the call now).

    Wait until `retry_after` (Unix seconds) and try again.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class HaltAlreadyResolved(ResolveRefused):
    """The call already has a recorded outcome that differs from the one offered."""


class AttemptChanged(ResolveRefused):
    """The outcome offered is not for the call's live attempt: the call was tried again since the attempt
    it names, or it names none and the call was tried more than once (so what the system of record showed
    its decider may predate the live attempt). Check the system of record for attempt `attempt`, then
    resolve that one (`attempt=`, `bide resolve --attempt`)."""

    def __init__(self, message: str, *, attempt: int) -> None:
        super().__init__(message)
        self.attempt = attempt


class RunNotFound(BideError):
    """No run with that id exists in the store (it has no records): check the run id and the store."""


class NoLiveAttempt(ResolveRefused):
    """The call has no attempt waiting for an outcome (it never started, or it was voided)."""


class RunHalted(BideError):
    """A run stopped and needs a decision before it can go on. Never a success.

    Attributes: `run_id`, `status` (a short machine-readable word), `call_id`, `tool`, `arguments`.
    """

    status: str = "halted"

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        call_id: str,
        tool: str,
        arguments: Any,
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.call_id = call_id
        self.tool = tool
        self.arguments = arguments


class OutcomeUnknown(RunHalted):
    """A side-effect call was attempted but its outcome was never recorded: it fired zero times or once.

    bide will not call it again on its own. Look the outcome up in the system of record and call
    `bide.resolve_halt(store, run_id, call_id, outcome=..., attempt=attempt)`, or give the tool a
    reconciler; then run again.
    `cause` is "crashed" (no result after the attempt) or "contended" (another driver claimed the call).
    `attempt` is the attempt's number (0 for the call's first; pass it to `resolve_halt`), `attempted_at`
    and `deadline` are Unix seconds taken from its marker. `running_here` is True when the call still runs
    in this process (a synchronous tool past its timeout), which journals its outcome when it returns: run
    again then, no person needed (unless this process ends first).
    """

    status = "halted"

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        call_id: str,
        tool: str,
        arguments: Any,
        cause: str,
        attempted_at: float,
        deadline: float,
        attempt: int = 0,
        running_here: bool = False,
    ) -> None:
        super().__init__(message, run_id=run_id, call_id=call_id, tool=tool, arguments=arguments)
        self.cause = cause
        self.running_here = running_here
        self.attempt = attempt
        self.attempted_at = attempted_at
        self.deadline = deadline


class RunSleeping(RunHalted):
    """The run waits on a durable timer (a `bide.timer` tool's call) until `wake_at` (Unix seconds).

    Nothing is wrong: drive it again after `wake_at` (a `bide.Worker` does), and it goes on from the journal
    without waiting again from zero.
    """

    status = "sleeping"

    def __init__(
        self, message: str, *, run_id: str, call_id: str, tool: str, arguments: Any, wake_at: float
    ) -> None:
        super().__init__(message, run_id=run_id, call_id=call_id, tool=tool, arguments=arguments)
        self.wake_at = wake_at


class ApprovalPending(RunHalted):
    """A gated call waits for approval; the run is paused with status "awaiting_approval".

    Running the same run id again consults the gate again; nothing has been called. `records` is how many
    journal records the gate was consulted on (-1: not known): a journal that has more since may hold a
    decision.
    """

    status = "awaiting_approval"

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        call_id: str,
        tool: str,
        arguments: Any,
        reason: str,
        records: int = -1,
    ) -> None:
        super().__init__(message, run_id=run_id, call_id=call_id, tool=tool, arguments=arguments)
        self.reason = reason
        self.records = records
