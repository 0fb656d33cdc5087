"""The `bide` command line: inspect runs, resolve halts, approve calls, resume crashed runs.

    bide runs    [--store URL] [--status S] [--prefix P] [--limit N] [--json]
    bide show    [--store URL] RUN [--json]
    bide pending [--store URL] [--prefix P] [--json]
    bide resolve [--store URL] RUN CALL (--succeeded JSON | --failed MESSAGE | --not-started) [--attempt N]
                 [--evidence JSON] [--json]
    bide approve | deny [--store URL] RUN CALL --key FILE
    bide keygen  FILE [--force]
    bide worker  [--store URL] --app module:attribute [--concurrency N] [--poll S] [--once [--json]]
    bide cancel  [--store URL] RUN [--reason TEXT]

`--store` defaults to $BIDE_STORE, else sqlite:///bide.db. Exit codes are the table shared with `govern`
and `bide-audit` (`bide._cli_common`, printed by `bide --help`): 0 done; 2 bad usage; 3 a bug; 4 no such
store, run or call; 5 refused (the message says why and what to do); 6 the store failed; 7 not yet (another
driver holds the run, or the call may still be running: retry after the time given). `bide resolve`
interrupted (SIGINT) before its resolution is sent says none was recorded (130); after, it waits for the
store's answer and reports it, unless interrupted again (130, "may or may not have been recorded"): see
`interrupts_around_a_write`.

Run ids, inputs, answers, record keys and every other string from the store are printed through
`printable` (control characters shown as escapes); `--json` output is ASCII-escaped JSON.

Extending: a module may add subcommands with `register(subparsers)`; each subcommand sets
`handler=fn(args) -> int` with `set_defaults`. `bide.approvals._cli.register` is picked up when present.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

from ._cli_common import (
    EXIT_FAILED,
    EXIT_INTERNAL,
    EXIT_NOT_FOUND,
    EXIT_NOT_YET,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORE,
    EXIT_USAGE,
    Parser,
    add_standard_options,
    close_store,
    give_up_on,
    internal_error,
    parse_arguments,
    print_json,
    run_id_argument,
    store_failure,
    table,
    text_argument,
    unreachable_store,
    unreadable_store,
)
from ._errors import (
    BideError,
    ConfigError,
    HaltInFlight,
    JournalFormatError,
    NoLiveAttempt,
    RecordDamaged,
    ResolveRefused,
    RunInFlight,
    StoreError,
    StoreNotFound,
)
from ._stdout import GuardedStdout, closed_stdout_fails, ended
from ._terminal import printable
from ._when import iso, seconds, when

# The journal, the stores and their drivers (pydantic, SQLAlchemy) are imported by the commands that use
# them, not here: `bide --help` and a usage error never pay for them.
if TYPE_CHECKING:
    import asyncio
    from concurrent.futures import Future

    from ._journal import Journal
    from ._outcome import Outcome
    from ._resolve import Resolved, RunStatus
    from ._store import Entry, Lease, Store

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_REFUSED",
    "EXIT_STORE",
    "StoppedWaiting",
    "add_store_argument",
    "build_parser",
    "close_after_answer",
    "interrupts_around_a_write",
    "json_failure",
    "main",
    "open_cli_store",
    "open_store_or_exit_code",
    "say",
]

EXTENSIONS = ("bide.approvals._cli", "bide._worker_cli")
STATUSES = (
    "running", "halted", "awaiting_approval", "sleeping", "idle", "completed", "cancelled", "failed",
    "not_started",
)  # fmt: skip
ENDED_STATUSES = ("completed", "cancelled", "failed")  # a run with one of these holds run:end
# Commands people try that `bide` names otherwise (not close by spelling, so no typo suggestion finds them).
SYNONYMS = {
    "status": "show",
    "inspect": "show",
    "list": "runs",
    "ls": "runs",
    "resume": "worker",
    "stop": "cancel",
}
EXIT_INTERRUPTED = 130  # what shells report for a command that SIGINT (Ctrl-C) ended
_T = TypeVar("_T")


class CLIError(Exception):
    """A command's failure: its exit `code`, and the `reason` its --json document gives (by default the
    code's word, as in the table of `--help`)."""

    def __init__(self, message: str, code: int, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class _StoreOption(argparse.Action):
    """--store, remembering that it was given (an error about the URL then does not blame $BIDE_STORE)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.store_given = True


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the shared --store option to a subcommand."""
    parser.add_argument(
        "--store",
        action=_StoreOption,
        default=os.environ.get("BIDE_STORE", "sqlite:///bide.db"),
        help="store URL (default: $BIDE_STORE or sqlite:///bide.db)",
    )
    parser.add_argument("--table-prefix", default="bide_", help="SQL table prefix (default: bide_)")


def open_store_or_exit_code(
    args: argparse.Namespace, *, create: bool = False, before_opening: Callable[[], None] | None = None
) -> Store | int:
    """`open_cli_store` for subcommands defined in other modules: the store, or the exit code of the error
    it printed. (`CLIError` is caught here, in its own module: when bide._cli runs as __main__ the class
    exists twice and an extension could not catch it by class.)"""
    try:
        return open_cli_store(args, create=create, before_opening=before_opening)
    except CLIError as exc:
        print(f"bide: {printable(str(exc))}", file=sys.stderr)
        json_failure(args, exc.code, str(exc))
        return exc.code


def open_cli_store(
    args: argparse.Namespace, *, create: bool = False, before_opening: Callable[[], None] | None = None
) -> Store:
    """Open the store named by --store and --table-prefix. A store that is not there is exit 4 and is left
    as it was: no SQLite file or PostgreSQL database is ever created, and bide's tables are created in an
    existing database only with `create` (`bide worker`, which serves a store rather than reading one).
    `before_opening` runs once the URL and the file passed their checks, before anything touches the store
    (an error it raises leaves the store as it was)."""
    from ._dbfile import not_a_database
    from ._open import open_store
    from ._url import StoreURLError, parse_store_url

    url: str = args.store
    # Without --store the URL is $BIDE_STORE's when it is set: an error about it says where it came from.
    env = not getattr(args, "store_given", False) and "BIDE_STORE" in os.environ
    came = " (the store URL came from $BIDE_STORE; --store overrides it)" if env else ""
    try:
        where = parse_store_url(url)
    except StoreURLError as exc:
        raise CLIError(f"{exc}{came}", EXIT_USAGE) from exc
    blocked = unreachable_store(where.path) if where.kind == "sqlite" else None
    if blocked is not None:  # not 6: the place stays as it is on every try, and a script retries 6
        raise CLIError(f"cannot use the store: {blocked}{came}", EXIT_NOT_FOUND, "unreadable")
    if env:
        fix = "$BIDE_STORE names it: fix $BIDE_STORE, or pass --store sqlite:///path/to/bide.db"
    elif getattr(args, "store_given", False):
        fix = "check the path in --store (sqlite:///relative/bide.db, or four slashes: sqlite:////abs/bide.db)"
    else:
        fix = "pass --store sqlite:///path/to/bide.db (or set $BIDE_STORE)"
    if where.kind == "sqlite" and not os.path.exists(where.path):
        # The worker too: a mistyped path would have it serve an empty store that no agent writes to.
        missing = "the file does not exist" + (
            " (bide worker never creates one: your app's bide.open_store(...) does, on its first run)"
            if create
            else ""
        )
        raise CLIError(f"no bide store at {where.path!r}: {missing}; {fix}", EXIT_NOT_FOUND)
    wrong = not_a_database(where.path) if where.kind == "sqlite" else None
    if wrong is not None:  # before anything opens it: `bide worker` would write there (and exit 6)
        raise CLIError(f"no bide store at {where.path!r}: {wrong}; {fix}", EXIT_NOT_FOUND)
    if where.kind == "memory":
        raise CLIError(
            f"a memory:// store lives inside one process; the CLI needs sqlite:/// or postgresql://{came}",
            EXIT_USAGE,
        )
    if before_opening is not None:
        before_opening()
    try:
        return open_store(url, table_prefix=args.table_prefix, create=create)
    except StoreNotFound as exc:
        check = (
            "$BIDE_STORE (the store URL came from it; or pass --store)" if env else "--store (or $BIDE_STORE)"
        )
        check += " and --table-prefix" if exc.missing == "tables" else ""
        raise CLIError(f"{exc}; check {check}", EXIT_NOT_FOUND) from exc
    except ConfigError as exc:
        raise CLIError(f"{exc}{came}", EXIT_USAGE) from exc
    except StoreError as exc:  # anything else is a bug (exit 3), not the store's failure
        damaged = unreadable_store(exc, url)
        if damaged is not None:
            raise CLIError(f"cannot use the store: {damaged}{came}", EXIT_NOT_FOUND, "unreadable") from exc
        raise CLIError(f"the store failed: {store_failure(exc, url)}{came}", EXIT_STORE) from exc


class StoppedWaiting(BaseException):
    """A second SIGINT came while a write was with the store: the command stops waiting for the store's
    answer (a BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it)."""


@contextlib.contextmanager
def interrupts_around_a_write(what: str) -> Iterator[Callable[[], None]]:
    """SIGINT handling for a command that writes through a store, so that what it says is what was recorded.

    The block gets `sending`, to call just before the write goes to the store (from any thread). Until then
    a SIGINT interrupts as usual (KeyboardInterrupt: nothing was sent), and `sending` called after it raises
    KeyboardInterrupt too: a write made in another thread is never sent once the command took the interrupt.
    Once `sending` was called the write commits or fails whatever this process does (the store's thread
    carries it out, and closing the store waits for it), so the first SIGINT only says that bide waits for
    the store's answer, which the command then reports as usual. A second raises `StoppedWaiting`: the
    command must then say that `what` may or may not have been recorded, and exit without closing the store
    (closing would wait for the answer too).
    """
    sent = stopped = interrupted = False
    # Reentrant: the handler runs in the main thread, which may be inside `sending` when the signal comes.
    decided = threading.RLock()

    def sending() -> None:
        nonlocal sent
        with decided:
            if stopped:
                raise KeyboardInterrupt
            sent = True

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped, interrupted
        with decided:
            if not sent:
                stopped = True
                raise KeyboardInterrupt
        if interrupted:
            raise StoppedWaiting
        interrupted = True
        say(
            f"bide: interrupted while {what} is with the store: waiting for its answer, so that what bide "
            "says next is what was recorded (interrupt again to stop waiting without knowing)",
            file=sys.stderr,
        )

    if threading.current_thread() is not threading.main_thread():  # only the main thread gets signals
        yield sending
        return
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield sending
    finally:
        signal.signal(signal.SIGINT, previous)


def say(text: str, *, file: Any = None) -> None:
    """Print one line built from store data, with control characters shown as escapes."""
    print(printable(text), file=file)


def _leases(store: Store) -> dict[str, Lease]:
    """Every lease of an unfinished run, by run id (read only: nothing is granted or renewed)."""
    from ._store import EVERY_LEASE_MS

    out: dict[str, Lease] = {}
    after = ""
    while batch := store.expired_leases(now_ms=EVERY_LEASE_MS, after=after, limit=500):
        out.update((lease.run_id, lease) for lease in batch)
        after = batch[-1].run_id
    return out


class _Unreadable(Exception):
    """One run's records cannot be decoded; the other runs can still be listed. The message is one line:
    the run, the damaged record and what is wrong with it."""


def _read(store: Store, run_id: str, entries: list[Entry] | None = None) -> Journal:
    """The run's journal (from `entries` when they were read already); `_Unreadable` when its records
    cannot be decoded (a store that fails raises `StoreError`: the reading goes through the store, the
    decoding does not)."""
    from ._journal import Journal
    from ._records import damage_in_words

    if entries is None:
        entries = store.load(run_id, 0)
    try:
        journal = Journal(store, run_id)
    except ConfigError as exc:  # a row edited in the database: bide never writes such a run id
        raise _Unreadable(f"run {run_id!r} cannot be read: {exc}") from exc
    for entry in entries:  # one at a time, to name the record that cannot be decoded
        try:
            journal.absorb([entry])
        except StoreError as exc:
            raise _Unreadable(
                f"run {run_id!r} cannot be read: its record {entry.key!r} (seq {entry.seq}) is damaged "
                f"({damage_in_words(exc)})"
            ) from exc
    return journal


def _load_many(
    store: Store, run_ids: list[str], runner: asyncio.Runner
) -> Iterator[tuple[str, list[Entry]]]:
    """Each of `run_ids` with its entries, read _LOADED_TOGETHER runs at a time on `runner`'s event loop
    (one for the whole listing): a SQL store answers them in one transaction, where a load per run costs a
    round trip through the store's thread (a listing of 50,000 runs took 9 s), while only that many
    journals are held at once (long threads can be megabytes each)."""
    import asyncio

    async def load(some: list[str]) -> list[list[Entry]]:
        return list(await asyncio.gather(*(store.aload(run_id, 0) for run_id in some)))

    for start in range(0, len(run_ids), _LOADED_TOGETHER):
        some = run_ids[start : start + _LOADED_TOGETHER]
        yield from zip(some, runner.run(load(some)), strict=True)


_LOADED_TOGETHER = 32


def _print_listing(rows: list[dict[str, Any]], unreadable: dict[str, str]) -> None:
    """The --json document of a listing (`bide runs`, `bide pending`): the rows; or, when a run could not
    be read (exit 4), the failure document every command prints, with the rows as `listed` and each
    unreadable run as `{"run_id", "problem"}` in `unreadable` (a program reading only the rows would take
    the listing for whole)."""
    if not unreadable:
        print_json(rows)
        return
    print_json(
        {
            "exit_code": EXIT_NOT_FOUND,
            "reason": "unreadable",
            "message": f"{len(unreadable)} run(s) could not be read and are not listed",
            "listed": rows,
            "unreadable": [{"run_id": run, "problem": why} for run, why in unreadable.items()],
        }
    )


def _report_unreadable(unreadable: dict[str, str]) -> int:
    """Name each run that could not be read, after the listing; exit 4 when there was one."""
    for why in unreadable.values():
        say(f"bide: {why}; it is not listed", file=sys.stderr)
    return EXIT_NOT_FOUND if unreadable else EXIT_OK


def _live(lease: Lease | None, now_ms: int) -> bool:
    return lease is not None and lease.holder != "" and lease.expires_ms > now_ms


def _shown(st: RunStatus, lease: Lease | None, now_ms: int) -> RunStatus:
    """`st` as the CLI shows it: a call with no outcome under a live driver is running, not halted (halted
    runs need a person; this one's driver is still executing the call and records its outcome)."""
    from dataclasses import replace

    if st.status == "halted" and _live(lease, now_ms):
        return replace(st, status="running")
    return st


def _row(journal: Journal, st: RunStatus, lease: Lease | None, now_ms: int) -> dict[str, Any]:
    from ._records import Attempt

    entries = journal.entries()
    attempts = [r.attempted_at_ms for r in journal.records() if isinstance(r, Attempt)]
    live = _live(lease, now_ms)
    # Records carry no wall clock but attempts; a driver renews its lease while it works, so the later of
    # the last attempt and the lease's expiry is the last sign of life the store holds.
    moments = [*attempts, *([lease.expires_ms] if lease is not None and lease.expires_ms > 0 else [])]
    return {
        "run_id": st.run_id,
        "status": st.status,
        "records": st.records,
        "last_record": entries[-1].key if entries else None,
        "call_id": st.call_id,
        "tool": st.tool,
        "lease_holder": lease.holder if lease is not None and lease.holder else None,
        "lease_live": live,
        "lease_expires": iso(lease.expires_ms / 1000) if lease is not None and lease.expires_ms > 0 else None,
        "last_activity": iso(max(moments) / 1000) if moments else None,
        "_activity_ms": max(moments) if moments else 0,
        "_expires_ms": lease.expires_ms if lease is not None else 0,
    }


def _cmd_runs(args: argparse.Namespace) -> int:
    from ._resolve import status_of

    if args.limit < 1:
        raise CLIError(f"--limit must be 1 or more, got {args.limit}", EXIT_USAGE)
    import asyncio

    store = open_cli_store(args)
    now_ms = int(time.time() * 1000)
    unreadable: dict[str, str] = {}
    runner = asyncio.Runner()  # one event loop for every page's loads
    try:
        leases = _leases(store)
        # Every matching run is read: the N most recently active are known only once all are seen. Asked
        # only for statuses of runs that have not ended, the store leaves the ended ones out unread.
        open_only = bool(args.status) and not set(args.status) & set(ENDED_STATUSES)
        rows: list[dict[str, Any]] = []
        total = 0
        after = ""
        while batch := store.runs(prefix=args.prefix, after=after, limit=500, open_only=open_only):
            for run_id, entries in _load_many(store, batch, runner):
                try:
                    journal = _read(store, run_id, entries)
                except _Unreadable as exc:
                    unreadable[run_id] = str(exc)
                    continue
                st = _shown(status_of(journal), leases.get(run_id), now_ms)
                if args.status and st.status not in args.status:
                    continue
                rows.append(_row(journal, st, leases.get(run_id), now_ms))
                total += 1
            if len(rows) > 2 * args.limit + 1000:  # only the `limit` most recent are kept: bounded memory
                rows = _most_recent(rows, args.limit)
            after = batch[-1]
    finally:
        runner.close()
        close_store(store)
    rows = _most_recent(rows, args.limit)
    if args.json:
        _print_listing([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], unreadable)
        return _cut(total, args.limit, unreadable)
    if not rows:
        none = "No readable runs" if unreadable else "No runs"
        print(none + (f" with status {', '.join(args.status)}." if args.status else "."))
        return _cut(total, args.limit, unreadable)
    now = now_ms / 1000
    table(
        ("RUN", "STATUS", "LAST ACTIVITY", "LEASE", "RECORDS", "LAST RECORD"),
        [
            (
                r["run_id"],
                r["status"] + (f" at {r['call_id']} ({r['tool']})" if r["call_id"] else ""),
                when(r["_activity_ms"] / 1000, now) if r["_activity_ms"] else "-",
                _lease_text(r, now),
                str(r["records"]),
                r["last_record"] or "-",
            )
            for r in rows
        ],
    )
    return _cut(total, args.limit, unreadable)


def _most_recent(rows: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The `limit` rows most recently active, most recent first (ties by run id)."""
    rows.sort(key=lambda r: (-r["_activity_ms"], r["run_id"]))
    return rows[:limit]


def _cut(total: int, limit: int, unreadable: dict[str, str]) -> int:
    if total > limit:
        print(
            f"bide: showing the {limit} most recently active of {total} runs (--limit {limit}); "
            "raise --limit or narrow with --status/--prefix to see the rest",
            file=sys.stderr,
        )
    return _report_unreadable(unreadable)


def _lease_text(row: dict[str, Any], now: float) -> str:
    if row["lease_holder"] is None:
        return "-"
    if row["_expires_ms"] <= 0:
        return f"{row['lease_holder']}, released"
    expires = when(row["_expires_ms"] / 1000, now)
    return f"{row['lease_holder']}, {'expires' if row['lease_live'] else 'expired'} {expires}"


def _cmd_show(args: argparse.Namespace) -> int:
    from ._resolve import live_attempt, status_of

    store = open_cli_store(args)
    try:
        try:
            journal = _read(store, args.run)
        except _Unreadable as exc:
            raise CLIError(str(exc), EXIT_NOT_FOUND, "unreadable") from exc
        if not journal.exists:
            raise CLIError(
                f"run {args.run!r} does not exist in {args.store} (`bide runs` lists the runs)",
                EXIT_NOT_FOUND,
            )
        lease = _leases(store).get(args.run)
        st = _shown(status_of(journal), lease, int(time.time() * 1000))
        records = [{"seq": e.seq, "key": e.key, "record": json.loads(e.data)} for e in journal.entries()]
    finally:
        close_store(store)
    now_ms = int(time.time() * 1000)
    row = _row(journal, st, lease, now_ms)
    info = {
        "run_id": st.run_id,
        "status": st.status,
        "input": st.input,
        "answer": st.answer,
        "call_id": st.call_id,
        "tool": st.tool,
        "arguments": st.arguments,
        "attempt": st.attempt,
        "lease_holder": row["lease_holder"],
        "lease_live": row["lease_live"],
        "lease_expires": row["lease_expires"],
        "last_activity": row["last_activity"],
    }
    if args.json:
        print_json({"run": info, "records": records})
        return EXIT_OK
    say(f"run {st.run_id}: {st.status}")
    if st.input is not None:
        say(f"  input:  {st.input}")
    if st.answer is not None:
        say(f"  answer: {st.answer}")
    if st.call_id:
        say(f"  blocked on call {st.call_id}: {st.tool} {json.dumps(st.arguments, sort_keys=True)}")
        # The attempt it is blocked on: not the journal's last marker (another call's, or a decider's claim).
        live = live_attempt(journal, st.call_id) if st.status == "halted" else None
        if live is not None:
            deadline, margin = live.deadline_ms / 1000, live.settle_margin(args.clock_skew)
            said = f"--clock-skew {args.clock_skew:g}"
            if margin > args.clock_skew:
                said += f", raised to the {margin:g} s its driver was given"
            say(
                f"  attempt {st.attempt}, attempted {when(live.attempted_at_ms / 1000)}; deadline "
                f"{when(deadline)}; bide resolve accepts an outcome from {when(deadline + margin)} "
                f"on ({said}; --attempt {st.attempt})"
            )
    if row["lease_holder"] is not None:
        say(f"  lease:  {_lease_text(row, now_ms / 1000)}")
    texts = [_record_text(r["record"]) for r in records]
    # A record too large for a table cell (a tool's result of megabytes) is printed whole after the table:
    # wrapped in a cell, its text took time quadratic in its size (minutes for 32 MiB, hours for 100).
    large = {i for i, text in enumerate(texts) if len(text) > _CELL_MAX}
    table(
        ("SEQ", "KEY", "KIND", "RECORD"),
        [
            (
                str(r["seq"]),
                r["key"],
                str(r["record"].get("kind")),
                f"({len(texts[i]):,} characters: below the table)" if i in large else texts[i],
            )
            for i, r in enumerate(records)
        ],
    )
    for i in sorted(large):
        say(f"record {records[i]['seq']} ({records[i]['key']}): {texts[i]}")
    return EXIT_OK


_CELL_MAX = 1 << 16  # characters of a record shown in `bide show`'s table; a longer one is shown after it


def _record_text(record: dict[str, Any]) -> str:
    """A record's fields for people: times readable (--json keeps the stored numbers), nothing cut off."""
    detail = {k: v for k, v in record.items() if k not in ("key", "kind", "salt")}
    for name in ("attempted_at_ms", "deadline_ms", "wake_at_ms", "requested_at_ms"):
        if isinstance(detail.get(name), int):
            detail[name.removesuffix("_ms")] = iso(detail.pop(name) / 1000)
    return json.dumps(detail, sort_keys=True, ensure_ascii=False)


def _cmd_pending(args: argparse.Namespace) -> int:
    import asyncio

    from ._resolve import gated_calls, status_of
    from .approvals._submit import PendingApproval, pending_in

    store = open_cli_store(args)
    unreadable: dict[str, str] = {}
    found: list[PendingApproval] = []
    runner = asyncio.Runner()  # one event loop for every page's loads
    try:
        waiting: list[dict[str, Any]] = []
        after = ""
        while batch := store.runs(prefix=args.prefix, after=after, limit=500, open_only=True):
            for run_id, entries in _load_many(store, batch, runner):
                try:
                    journal = _read(store, run_id, entries)
                except _Unreadable as exc:
                    unreadable[run_id] = str(exc)
                    continue
                # Not `pending_approvals(store)`: it would stop at the first unreadable run of the store.
                try:
                    run_open = pending_in(journal)
                except StoreError as exc:
                    unreadable[run_id] = f"run {run_id!r} cannot be read: {str(exc).splitlines()[0]}"
                    continue
                found.extend(run_open)
                st = status_of(journal)
                if st.status == "awaiting_approval":
                    # Every call of the turn that waits at a gate, not only the one the run is blocked on
                    # (calls of one turn pause together: a person must see each of them).
                    waiting.extend(
                        _gate_row(journal, c.call_id, c.name, c.arguments) for c in gated_calls(journal)
                    )
            after = batch[-1]
        approvals = {(p.run_id, p.call_id): p for p in found}
    finally:
        runner.close()
        close_store(store)
    for w in waiting:
        p = approvals.get((w["run_id"], w["call_id"]))
        if p is not None:
            w["approval"] = {
                "need": p.need,
                "approvers": list(p.approvers),
                "approved_by": list(p.approved_by),
                "denied_by": list(p.denied_by),
                "waiting_for": list(p.waiting_for),
                "notes": list(p.notes),
                "outcome": p.outcome,
            }
    if args.json:
        _print_listing(waiting, unreadable)
        return _report_unreadable(unreadable)
    if not waiting:
        # An unreadable run may be waiting at a gate: only the readable ones are known not to.
        print("No readable run is waiting at a gate." if unreadable else "No run is waiting at a gate.")
        return _report_unreadable(unreadable)
    table(
        ("RUN", "CALL", "TOOL", "WAITING FOR"),
        [
            (
                w["run_id"],
                w["call_id"],
                f"{w['tool']}({json.dumps(w['arguments'], sort_keys=True, ensure_ascii=False)})",
                _waiting_text(w),
            )
            for w in waiting
        ],
    )
    for w in waiting:
        for note in (w["approval"] or {}).get("notes", ()):
            print(printable(f"Note on {w['run_id']} {w['call_id']}: {note}."))
    if any(w["gate"] == "approval" and w["decided"] is None and not _enough(w) for w in waiting):
        print(
            "Approve or deny a call at an approval gate with `bide approve|deny RUN CALL --key FILE`, then "
            "run the agent again."
        )
    if any(w["decided"] is not None for w in waiting):
        print(_CLOSED_GATE)
    if any(w["decided"] is None and _enough(w) for w in waiting):
        print(_ENOUGH)
    if any(w["gate"] == "custom" for w in waiting):
        print(_CUSTOM_GATE)
    return _report_unreadable(unreadable)


_CUSTOM_GATE = (
    "A call at a custom gate waits for what that gate's code checks, not for `bide approve`: once the gate "
    "would answer Approved or Denied, run the agent again (same run id and input) and it asks the gate again."
)


def _gate_row(journal: Journal, call_id: str, tool: str | None, arguments: Any) -> dict[str, Any]:
    """`bide pending`'s row for call `call_id` of a run waiting at a gate (the tally is added later)."""
    from ._records import pause_key

    pause = journal.get(pause_key(call_id))
    decided = _decided(journal, call_id)
    # The pause's reason was the gate's words when it paused: a closed gate's (its tally is recorded)
    # would send approvers to decide what it no longer takes.
    reason = getattr(pause, "reason", None) if decided is None else _closed_text(decided)
    return {
        "run_id": journal.run_id,
        "call_id": call_id,
        "tool": tool,
        "arguments": arguments,
        "reason": reason,
        "approval": None,
        "gate": "approval" if _at_approval_gate(journal, call_id) else "custom",
        "decided": decided,
    }


_CLOSED_GATE = (
    "A call whose approval gate has closed (its tally is recorded) takes no more decisions: run the agent "
    "again (same run id and input) and it recounts the tally's signed decisions under its policy, then calls "
    "the tool or records the denial (a recount that differs raises ApprovalRecordsInvalid, and nothing runs)."
)


_ENOUGH = (
    "A call whose approvers have said enough (no one else need speak) waits for its gate to count them: run "
    "the agent again (same run id and input) and it records the tally, then calls the tool or records the "
    "denial."
)


def _enough(w: dict[str, Any]) -> bool:
    """The approvers of `bide pending`'s row `w` said enough for its gate to decide, and no tally counted
    it yet: the call waits for a drive, not for anyone's decision."""
    return w["approval"] is not None and w["approval"]["outcome"] != "pending"


def _decided(journal: Journal, call_id: str) -> dict[str, Any] | None:
    """The recorded tally of the approval gate `call_id` waited at ({outcome, approved_by, denied_by}): the
    gate closed, and the run waits for a drive to act on it (its driver stopped between the tally and the
    call, say), not for approvers. None while no tally is recorded (or one that is not a tally's shape: the
    drive that reads it says what is wrong)."""
    from ._records import GateRecord
    from .approvals._tally import tally_key

    if not journal.has(tally_key(call_id)):
        return None
    tally = journal.get(tally_key(call_id))
    data = tally.data if isinstance(tally, GateRecord) else None
    names = {k: data.get(k) for k in ("approved_by", "denied_by")} if isinstance(data, dict) else {}
    if (
        not isinstance(data, dict)
        or data.get("outcome") not in ("approved", "denied")
        or not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in names.values())
    ):
        # The gate counts the call closed all the same (a record is at its tally's key): it was edited.
        return {"outcome": "unreadable", "approved_by": [], "denied_by": []}
    return {"outcome": data["outcome"], **names}


def _closed_text(decided: dict[str, Any]) -> str:
    if decided["outcome"] == "unreadable":
        return "approval gate closed, but its tally record is damaged (edited): the gate will refuse it"
    who = ", ".join(decided[f"{decided['outcome']}_by"]) or "nobody"
    return f"approval gate closed (its tally is recorded): {decided['outcome']} by {who}, as the tally says"


def _at_approval_gate(journal: Journal, call_id: str) -> bool:
    """The call waits at a `bide.approvals.ApprovalGate` (the gate journaled its approval request), not at a
    gate of the application's own."""
    from ._records import GateRecord

    return any(
        isinstance(r, GateRecord)
        and r.key.startswith("approval:request:")
        and isinstance(r.data, dict)
        and r.data.get("call_id") == call_id
        for r in journal.records()
    )


def _waiting_text(w: dict[str, Any]) -> str:
    a = w["approval"]
    if w["decided"] is not None:
        then = "see `bide show`" if w["decided"]["outcome"] == "unreadable" else "run the agent again"
        return f"nobody: {w['reason']}; {then}"
    if a is None:
        gate = "approval gate" if w["gate"] == "approval" else "custom gate"
        return f"{gate}: {w['reason'] or 'no reason given'}"
    count = (
        f"{len(a['approved_by'])}/{a['need']} approvals of {len(a['approvers'])}; "
        f"denied by {', '.join(a['denied_by']) or 'nobody'}"
    )
    if _enough(w):
        return f"nobody: {count}; enough to be {a['outcome']} when the agent runs again"
    return f"{count}; waiting for {', '.join(a['waiting_for'])}"


def _skew(text: str) -> float:
    """A --clock-skew value: seconds, finite and 0 or more (a NaN margin would let every deadline pass)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return seconds("--clock-skew", value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_arg(text: str, what: str) -> Any:
    try:
        value = json.loads(text)
        # A "\ud800" escape decodes to a lone surrogate, which no store can keep (as UTF-8).
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise CLIError(f"{what} is JSON nested too deeply to journal", EXIT_USAGE) from None
    except UnicodeEncodeError as exc:
        raise CLIError(
            f"{what} holds a lone surrogate (a \\ud800-\\udfff escape that is not half of a pair), which "
            f"no store can keep: {exc.reason}", EXIT_USAGE,
        ) from None
    except ValueError as exc:
        raise CLIError(f"{what} must be JSON (quote strings: '\"ok\"'): {exc}", EXIT_USAGE) from exc
    return value


def _attempt_number(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"attempts are numbered 0, 1, 2, ... (see bide show), not {text!r}")
    return int(text)


def _cmd_resolve(args: argparse.Namespace) -> int:
    from ._outcome import Outcome
    from ._resolve import aresolve

    evidence = _json_arg(args.evidence, "--evidence") if args.evidence is not None else None
    if args.succeeded is not None:
        outcome = Outcome.succeeded(_json_arg(args.succeeded, "--succeeded"), evidence=evidence)
    elif args.failed is not None:
        outcome = Outcome.failed(args.failed, evidence=evidence)
    else:
        outcome = Outcome.not_started(evidence=evidence)
    run, call = args.run, args.call
    try:
        store = open_cli_store(args)
    except KeyboardInterrupt:  # (opening may wait for the store's lock too)
        said = f"interrupted; no resolution was recorded for call {call} of run {run}"
        say(f"bide: {said}", file=sys.stderr)
        json_failure(args, EXIT_INTERRUPTED, said)
        return EXIT_INTERRUPTED
    with interrupts_around_a_write(f"the resolution of call {call} in run {run}") as sending:
        abandoned = False
        resolving: Future[Resolved] | None = None
        try:
            # Started inside the `try`: a Ctrl-C landing as the thread starts, before the main thread waits
            # on it (the thread may already be holding the lease), is answered as any other before sending.
            resolving = _in_a_thread(
                aresolve(
                    store,
                    run,
                    call,
                    outcome=outcome,
                    clock_skew=args.clock_skew,
                    sending=sending,
                    attempt=args.attempt,
                )
            )
            resolved = resolving.result()
        except KeyboardInterrupt:  # before the resolution was sent: `sending` now refuses to send it
            give_up_on(store)
            said = f"interrupted; no resolution was recorded for call {call} of run {run}"
            say(f"bide: {said}", file=sys.stderr)
            json_failure(args, EXIT_INTERRUPTED, said)
            try:
                if resolving is not None:
                    resolving.exception()  # it gives back the run's lease, if it took it
            except KeyboardInterrupt:
                # Interrupted again: a lease it holds is left to expire (RESOLVE_LEASE_MS); nothing was sent.
                abandoned = True
            return EXIT_INTERRUPTED
        except StoppedWaiting:
            abandoned = True
            said = (
                f"stopped waiting: the resolution of call {call} in run {run} may or may not have been "
                f"recorded; `bide show {shlex.quote(run)}` tells"
            )
            say(f"bide: {said}", file=sys.stderr)
            json_failure(args, EXIT_INTERRUPTED, said)
            return EXIT_INTERRUPTED
        finally:
            if not abandoned:
                close_after_answer(store)
    if resolved.written:
        said = f"resolved call {call} of run {run} as {outcome.kind}; run the agent again to go on"
        _say_resolved(args, said, written=True, outcome=outcome.kind)
        return EXIT_OK
    return _already_resolved(args, outcome, resolved)


def _say_resolved(args: argparse.Namespace, said: str, *, written: bool, outcome: str) -> None:
    """What `bide resolve` says when the call has the outcome offered: `said` for people, or with --json
    the document ``{"result": "resolved", "written", "run", "call", "outcome"}``."""
    if args.json:
        fields = {"written": written, "run": args.run, "call": args.call, "outcome": outcome}
        print_json({"result": "resolved", **fields, "message": said})
    else:
        say(said)


def _already_resolved(args: argparse.Namespace, outcome: Outcome, resolved: Resolved) -> int:
    """`bide resolve` of a call that already had the offered outcome: nothing was written. The same
    evidence is exit 0; other evidence contradicts the record (exit 5, as another outcome is)."""
    from ._canonical import canonical_json

    run, call = args.run, args.call
    rec = resolved.result
    then = "the run has ended" if resolved.ended else "run the agent again to go on"
    if rec is None:  # resolved as not started (its evidence is in the record's reason; not compared)
        said = f"call {call} of run {run} was already resolved as not_started; nothing was written; {then}"
        _say_resolved(args, said, written=False, outcome="not_started")
        return EXIT_OK
    kind = "failed" if rec.is_error else "succeeded"
    how = "resolved" if rec.reconciled else "recorded by its tool"
    recorded = canonical_json(rec.evidence).decode()
    if canonical_json(rec.evidence) != canonical_json(outcome.evidence):
        return _failed(
            args,
            EXIT_REFUSED,
            f"refused: call {call} of run {run} was already {how} as {kind} with evidence {recorded}, not "
            f"{canonical_json(outcome.evidence).decode()}; nothing was written (a recorded outcome and its "
            "evidence cannot be changed)",
        )
    _say_resolved(
        args,
        f"call {call} of run {run} was already {how} as {kind} (evidence {recorded}); nothing was written; "
        f"{then}",
        written=False,
        outcome=kind,
    )
    return EXIT_OK


def close_after_answer(store: Store) -> None:
    """Close `store` in a command of `interrupts_around_a_write` once the store has answered its write. A
    second SIGINT while it closes stops that wait and is not reported: what the command says next is the
    store's answer, already in hand, and nothing of the write waits on the close."""
    with contextlib.suppress(StoppedWaiting):
        store.close()


def _in_a_thread(coroutine: Coroutine[Any, Any, _T]) -> Future[_T]:
    """Run `coroutine` to its end on an event loop of its own, in a daemon thread.

    The main thread waits on the future, so a SIGINT reaches it at once and it may stop waiting: in an
    event loop the exception a signal handler raises lands anywhere, and asyncio swallows `StoppedWaiting`
    raised in a callback. A daemon thread does not keep the process alive once the command gave up on it.
    """
    import asyncio
    from concurrent.futures import Future

    done: Future[_T] = Future()

    def run() -> None:
        try:
            done.set_result(asyncio.run(coroutine))
        except BaseException as exc:  # the main thread reports it (KeyboardInterrupt from `sending` too)
            done.set_exception(exc)

    threading.Thread(target=run, name="bide-resolve", daemon=True).start()
    return done


def _cmd_keygen(args: argparse.Namespace) -> int:
    from .audit._keys import KeyFileExists, generate_key

    try:
        key = generate_key(args.path, overwrite=args.force)
    except KeyFileExists as exc:
        raise CLIError(f"{exc} (pass --force to replace it)", EXIT_USAGE) from exc
    say(f"private key: {args.path} (mode 0600; keep it secret, never commit it)")
    say(f"public key:  {args.path}.pub (give it to whoever pins approvers or verifies heads)")
    say(f"key id:      {key.key_id}")
    return EXIT_OK


def build_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser and its subparsers object (extensions add subcommands to the latter)."""
    parser = Parser(
        prog="bide",
        description="Inspect durable bide runs, resolve halts, approve calls.",
        synonyms=SYNONYMS,
    )
    add_standard_options(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("runs", help="list runs, most recently active first")
    add_store_argument(p)
    p.add_argument(
        "--status", action="append", choices=STATUSES, help="only runs with this status (repeatable)"
    )
    p.add_argument("--prefix", default="", type=text_argument, help="only run ids starting with this")
    p.add_argument("--limit", type=int, default=1000, help="at most this many runs (default 1000)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_cmd_runs)

    p = sub.add_parser("show", help="show a run's status, lease and whole journal")
    add_store_argument(p)
    p.add_argument("run", type=run_id_argument, help="run id")
    p.add_argument("--json", action="store_true", help="print JSON (records decoded)")
    p.add_argument(
        "--clock-skew", type=_skew, default=1.0, help="the margin bide resolve will use (for the times shown)"
    )
    p.set_defaults(handler=_cmd_show)

    p = sub.add_parser("pending", help="list every run waiting at a gate (approvals and any other gate)")
    add_store_argument(p)
    p.add_argument("--prefix", default="", type=text_argument, help="only runs whose id starts with this")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_cmd_pending)

    p = sub.add_parser("resolve", help="record the outcome of a halted side-effect call")
    add_store_argument(p)
    p.add_argument("run", type=run_id_argument, help="run id")
    p.add_argument("call", type=text_argument, help="call id named by the halt (e.g. c0.0)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--succeeded", metavar="JSON", type=text_argument,
        help="the effect happened; JSON result for the model",
    )
    what.add_argument(
        "--failed", metavar="MESSAGE", type=text_argument, help="the effect did not happen; do not retry"
    )
    what.add_argument("--not-started", action="store_true", help="the effect did not happen; retry it")
    p.add_argument(
        "--evidence", metavar="JSON", type=text_argument, help="JSON evidence journaled with the resolution"
    )
    p.add_argument(
        "--attempt",
        type=_attempt_number,
        metavar="N",
        help="the attempt the outcome is for (bide show names it); needed once the call was tried more than "
        "once, and refused if the call was tried again since",
    )
    p.add_argument(
        "--clock-skew",
        type=_skew,
        default=1.0,
        help="seconds to wait past the deadline (at least the clock_skew the call's driver was given)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_cmd_resolve)

    p = sub.add_parser("keygen", help="create an Ed25519 signing key FILE (and FILE.pub), as govern keygen")
    p.add_argument("path", metavar="FILE")
    p.add_argument("--force", action="store_true", help="replace existing key files")
    p.set_defaults(handler=_cmd_keygen)

    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and name.startswith(exc.name):
                continue
            raise
        register = getattr(module, "register", None)
        if callable(register):
            register(sub)
    for command in sub.choices.values():
        # Every error says "rerun with --debug": it is accepted after the subcommand too. SUPPRESS keeps
        # the subcommand from resetting a --debug given before it.
        if "--debug" not in command._option_string_actions:
            command.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors"
            )
    return parser, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bide` console script; returns the exit code."""
    closed_stdout_fails()
    parser, _ = build_parser()
    args = parse_arguments(
        parser, argv, lambda message: json_failure(argparse.Namespace(json=True), EXIT_USAGE, message)
    )
    # A reader that goes away (`bide runs | head`) drops the rest of the output, and the command ends with
    # its own exit code; a full disk behind `> file` drops it too, and the command, once done, ends with
    # OUTPUT_LOST, saying its own code (see bide._stdout).
    stdout, sys.stdout = sys.stdout, GuardedStdout(sys.stdout)
    try:
        code = _run_command(args)
    finally:
        sys.stdout = stdout
    return ended(code, "bide: error: ")


def _run_command(args: argparse.Namespace) -> int:
    """Run the command `args` names; its exit code (its failures said on stderr, and in JSON with --json)."""
    try:
        code: int = args.handler(args)
        return code
    except CLIError as exc:
        return _failed(args, exc.code, str(exc), exc.reason)
    except NoLiveAttempt as exc:
        return _failed(args, EXIT_NOT_FOUND, str(exc))
    except (HaltInFlight, RunInFlight) as exc:
        # Not a contradiction of what is recorded (5): the same request can succeed later.
        return _failed(args, EXIT_NOT_YET, f"not yet: {exc}", retry_after=exc.retry_after)
    except ResolveRefused as exc:
        return _failed(args, EXIT_REFUSED, f"refused: {exc}")
    except ConfigError as exc:
        return _failed(args, EXIT_USAGE, str(exc))
    except RecordDamaged as exc:
        # Not the store failing (6, which a script retries): a record that reads the same way every time.
        from ._records import damage_in_words

        run = getattr(args, "run", None)
        where = f"run {run!r} cannot be read: " if isinstance(run, str) else ""
        return _failed(
            args,
            EXIT_NOT_FOUND,
            f"{where}its record {exc.key!r} is damaged ({damage_in_words(exc)}); it was edited or damaged in "
            "the database (bide never writes such a record): restore the store from a backup",
            "unreadable",
        )
    except JournalFormatError as exc:  # a run this bide does not read: as unreadable as a damaged one
        return _failed(args, EXIT_NOT_FOUND, str(exc), "unreadable")
    except StoreError as exc:
        damaged = unreadable_store(exc, getattr(args, "store", None))
        if damaged is not None:  # not 6: reading it again fails the same way, and a script retries 6
            return _failed(args, EXIT_NOT_FOUND, f"cannot use the store: {damaged}", "unreadable")
        return _failed(args, EXIT_STORE, f"store error: {store_failure(exc, getattr(args, 'store', None))}")
    except BideError as exc:
        return _failed(args, EXIT_REFUSED, str(exc))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        json_failure(args, EXIT_INTERRUPTED, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        code = internal_error("bide", exc, debug=args.debug)
        json_failure(args, code, f"internal error: {type(exc).__name__}: {exc}")
        return code


_REASONS = {
    EXIT_FAILED: "failed",
    EXIT_USAGE: "usage error",
    EXIT_INTERNAL: "internal error",
    EXIT_NOT_FOUND: "not found",
    EXIT_REFUSED: "refused",
    EXIT_STORE: "store failed",
    EXIT_NOT_YET: "not yet",
    EXIT_INTERRUPTED: "interrupted",
}


def _failed(
    args: argparse.Namespace, code: int, message: str, reason: str | None = None, **facts: Any
) -> int:
    """Report a command's failure (`code`, and `message` for people on stderr); returns `code`."""
    say(f"bide: {message}", file=sys.stderr)
    json_failure(args, code, message, reason, **facts)
    return code


def json_failure(
    args: argparse.Namespace, code: int, message: str, reason: str | None = None, **facts: Any
) -> None:
    """With --json, the one JSON document a failed command prints (on stdout, as its data would have been):
    `exit_code`, `reason` (a word for the code, as in the table of `--help`, unless `reason` is more
    precise), `message`, and `facts` a script needs (`retry_after`, Unix seconds, for exit 7)."""
    if getattr(args, "json", False):
        said = reason or _REASONS.get(code, "failed")
        print_json({"exit_code": code, "reason": said, "message": message, **facts})


if __name__ == "__main__":
    raise SystemExit(main())
