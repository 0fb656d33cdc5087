"""Operating running runs from the command line: `bide worker` resumes crashed runs (a `bide.Worker` over
a store), `bide cancel` asks a run to stop.

    bide worker --store URL --app module:attribute [--concurrency N] [--poll SECONDS] [--once [--json]]
    bide cancel --store URL RUN [--reason TEXT]

`module:attribute` names your agents: an `Agent`, a list of agents, or a function that takes the opened
store and returns either (so the agents use the worker's store). Agents made when the module was imported
opened their own store: the worker drives them on it if it holds the same tables as --store (the same
SQLite file or PostgreSQL database, and table prefix), and refuses otherwise. The current directory is
importable.
Without `--once` it runs until SIGINT, SIGTERM or SIGHUP, waits for the drives in flight to finish however
long they take (a second signal cancels them), then hands back its leases; with `--once` any of them ends the
pass once the drives in flight finished (an interrupt never drops a side effect's result; a second signal
cancels them too, exit 130). One that comes before the store answered the pass's listing of the runs ends it
at once with a report that says so (`listed: false` in --json), exit 130: the store was not read. Once the
pass is over and the store released, its journal is committed: a signal then, or one taken before, ends the
process (128 plus its number) unless it exits by itself within `_DONE_EXITS_WITHIN_S`, with the pass's code
(see `_counted`), and a third in all exits at once. With `--json` the report is all that goes to standard
output (closed once it is written: see `_Report`).
`bide cancel` journals a cancel request that the run's drive honours at its next turn boundary (see
`bide.cancel_run`). Exit codes are the shared table (`bide._cli_common`): 0 done; 2 bad usage (the app
cannot be imported, raises while building, or is not agents); 4 no such store or run; 5 refused (the run
has already ended); 6 the store failed. `bide worker --once` exits 6 when the store failed listing the runs
or in any drive, else 4 when it met a run it cannot drive (`unresumable`: a damaged record, another journal
format; a person must act), else 1 when a drive failed otherwise (the model down, a tool that did not run:
retried at the next pass), else 0: a run completed, halted for a person, waiting, or ended as failed by its
drive (`OutputInvalid`) is a run's outcome, not the worker's failure, and a run started by an agent the app
does not define (`other_agents`: on a store several apps share, another app's) is not this worker's.
`bide cancel` interrupted (SIGINT) before its request is sent says nothing was sent (130); after, it waits
for the store's answer and reports it, unless interrupted again (130, "may or may not have been
recorded"): see `bide._cli.interrupts_around_a_write`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import fcntl
import importlib
import io
import json
import logging
import os
import select
import shlex
import signal
import socket
import sys
import threading
import weakref
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ._cli_common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STORE,
    EXIT_USAGE,
    give_up_on,
    run_id_argument,
    text_argument,
)
from ._errors import ConfigError, RunEnded, RunNotFound, StoreError
from ._stdout import GuardedStdout
from ._terminal import printable

# The agent loop, the worker and the stores are imported by the commands, not here: `bide` imports this
# module to list its subcommands, and `bide --help` should not pay for them.
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from ._agent import Agent
    from ._store import Store
    from ._worker import PassReport, Worker

__all__ = ["register"]


class _AppError(Exception):
    pass


def app_attribute(spec: str) -> Any:
    """What `module:attribute` names: an agent, a list of them, or a function of the store giving them.
    Imported before the store is opened, so that a mistyped --app leaves the store as it was."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise _AppError(f"--app must be module:attribute (for example myapp.agents:build), got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # the app's own code runs on import: any error in it is the app's
        # (SystemExit too: argparse or sys.exit() at import would end the worker without a word)
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and f"{module_name}.".startswith(f"{exc.name}."):
            # The app's own module (or its package) is not found, not a module the app imports.
            hint = (
                f"; the worker imports it from the directory it starts in ({os.getcwd()}) and PYTHONPATH: "
                "start it where the module's package is, or add that directory to PYTHONPATH"
            )
        raise _AppError(f"cannot import {module_name!r} for --app: {_raised(exc)}{hint}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise _AppError(f"module {module_name!r} has no attribute {attribute!r} (--app {spec})") from None


def agents_of(value: Any, spec: str, store: Store) -> tuple[list[Agent[Any]], Store]:
    """The agents of the --app `spec` whose attribute is `value` (a function is called with the store), and
    the store object the worker drives them on: `store`, or the one the app's agents opened themselves
    when it holds the same tables (the same SQLite file or PostgreSQL database, and table prefix)."""
    from ._agent import Agent

    built = callable(value) and not isinstance(value, Agent)
    if built:
        try:
            value = value(store)
        except (Exception, SystemExit) as exc:
            raise _AppError(f"--app {spec}: building the agents raised {_raised(exc)}") from exc
    agents = [value] if isinstance(value, Agent) else list(value) if isinstance(value, list | tuple) else None
    if not agents or not all(isinstance(a, Agent) for a in agents):
        raise _AppError(f"--app {spec} must give a bide.Agent or a list of them, got {type(value).__name__}")
    if built or all(a.store is store for a in agents):
        return agents, store  # (a builder's agents on another store are refused by the Worker)
    # Agents made when their module was imported opened their own store object, before the worker's.
    own = agents[0].store
    if all(a.store is own for a in agents) and _same_tables(own, store):
        return agents, own
    other = next(a for a in agents if a.store is not store)
    raise _AppError(
        f"--app {spec}: agent {other.name!r} uses the store {_where(other.store)}, not the worker's "
        f"{_where(store)}: pass --store and --table-prefix for the agents' store, or name a function that "
        "builds the agents on the store it is given (--app module:build, with def build(store): ...)"
    )


def _raised(exc: BaseException) -> str:
    """What the app's code raised, in a few words (SystemExit named with its code: its text is the code)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (it called sys.exit(), or argparse did)"
    return f"{type(exc).__name__}: {exc}"


def _where(store: Store) -> str:
    from ._url import without_password

    prefix = getattr(store, "table_prefix", None)
    return without_password(store.url) + (f" (table prefix {prefix})" if prefix and prefix != "bide_" else "")


def _same_tables(a: Store, b: Store) -> bool:
    """Whether two store objects read and write the same tables: the same SQLite file or PostgreSQL
    database (and user and query options), with the same table prefix; or the same named memory space."""
    from ._url import StoreURLError, parse_store_url

    if getattr(a, "table_prefix", None) != getattr(b, "table_prefix", None):
        return False
    try:
        x, y = parse_store_url(a.url), parse_store_url(b.url)
    except StoreURLError:
        return False
    if x.kind != y.kind:
        return False
    if x.kind == "sqlite":
        return os.path.realpath(x.path) == os.path.realpath(y.path)
    if x.kind == "memory":
        return bool(x.name) and x.name == y.name
    import sqlalchemy as sa

    # Query options count too: one (options=-csearch_path=..., host=/a/socket) can name other tables.
    u, v = sa.engine.make_url(x.sqlalchemy_url), sa.engine.make_url(y.sqlalchemy_url)
    return (u.host or "", u.port or 5432, u.database, u.username, dict(u.query)) == (
        v.host or "",
        v.port or 5432,
        v.database,
        v.username,
        dict(v.query),
    )


def _open(
    args: argparse.Namespace, *, create: bool = False, before_opening: Callable[[], None] | None = None
) -> Store | int:
    from ._cli import open_store_or_exit_code

    return open_store_or_exit_code(args, create=create, before_opening=before_opening)


def _cmd_cancel(args: argparse.Namespace) -> int:
    from ._cancel import cancel_request
    from ._cli import EXIT_INTERRUPTED, StoppedWaiting, close_after_answer, interrupts_around_a_write, say
    from ._journal import Journal
    from ._store import announce

    store = _open(args)
    if isinstance(store, int):
        return store
    run = args.run
    with interrupts_around_a_write(f"the cancel request for run {run}") as sending:
        abandoned = False
        try:
            journal = Journal(store, run).load()
            request = cancel_request(journal, reason=args.reason)
            sending()
            [(_, recorded)] = journal.write([request])
            if recorded:  # tell a worker that left the run waiting (see bide.cancel_run)
                announce(store, run)
        except KeyboardInterrupt:  # before the request was sent
            give_up_on(store)
            say(f"bide: interrupted; no cancel request was sent for run {run}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except StoppedWaiting:
            abandoned = True
            say(
                f"bide: stopped waiting: the cancel request for run {run} may or may not have been recorded; "
                f"`bide show {shlex.quote(run)}` tells",
                file=sys.stderr,
            )
            return EXIT_INTERRUPTED
        except RunNotFound as exc:
            say(f"bide: {exc}", file=sys.stderr)
            return EXIT_NOT_FOUND
        except RunEnded as exc:
            say(f"bide: refused: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        finally:
            if not abandoned:
                close_after_answer(store)
        if recorded:
            say(f"cancel requested for run {run}: it ends at its next turn boundary")
        else:
            say(f"run {run} already has a cancel request (the first reason stands)")
        return EXIT_OK


def _cmd_worker(args: argparse.Namespace) -> int:
    if not args.json:
        return _serve(args, sys.stdout)
    # The report is all that --json prints on standard output: what the app prints (when it is imported,
    # in its build function, in its tools) goes to standard error, and so does what native code and
    # subprocesses write to file descriptor 1, when standard output is that descriptor.
    report_to = sys.stdout
    try:
        on_descriptor_1 = report_to.fileno() == 1
    except (OSError, ValueError):  # captured in the process (a StringIO), or closed: no descriptor
        on_descriptor_1 = False
    if not on_descriptor_1:
        with contextlib.redirect_stdout(sys.stderr):
            return _serve(args, report_to)
    report_to.flush()
    saved = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, 3)  # above 0-2, even when one of them is closed
    # In the bide command the process ends with the command: file descriptor 1 stays on standard error to
    # the end, and the report's descriptor is closed once the report is written (see _Report).
    for_good = _ends_with_the_process()
    report = _Report(saved, closed_once_written=for_good)
    try:
        try:
            os.dup2(2, 1)
        except OSError:  # standard error closed: the app's output is dropped, never mixed with the report
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
        with contextlib.redirect_stdout(sys.stderr):
            code = _serve(args, report)
        return code
    finally:
        if for_good and report.anything_written:
            report.written()
        else:
            # A program that called the command in-process goes on with its standard output back; and an
            # error the command did not write a document for (Ctrl-C before the pass, a bug) has its
            # document written to standard output by bide._cli.
            report.given_back()


class _Unbuffered(io.TextIOBase):
    """Text written straight to a file descriptor: nothing is held back, so a write that fails (a full disk)
    fails where it is made, and nothing is left to fail again when the stream goes. `close_descriptor`
    closes the descriptor; a write after it fails (EBADF)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def write(self, text: str) -> int:
        if self._fd < 0:
            raise OSError(errno.EBADF, "the report's descriptor is closed: its report was written")
        data = text.encode("utf-8")
        while data:
            data = data[os.write(self._fd, data) :]
        return len(text)

    def fileno(self) -> int:
        return self._fd

    def close_descriptor(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1  # (-1 first: the number may be reused by the next file opened)
            with contextlib.suppress(OSError):
                os.close(fd)


class _Report(GuardedStdout):
    """Where `bide worker --once --json` writes its report when standard output is file descriptor 1: a
    copy of that descriptor (`fd`), fd 1 itself pointing at standard error meanwhile. With
    `closed_once_written` (the bide command, whose process ends with the command) the copy, the last
    descriptor of standard output in the process, is closed once the report is written (`written`): a
    reader sees the report's end at once, even while the process waits for a thread a tool left running,
    and nothing printed later (that thread, an exit function, the interpreter's teardown) reaches it."""

    def __init__(self, fd: int, *, closed_once_written: bool) -> None:
        descriptor = _Unbuffered(fd)
        super().__init__(descriptor)
        self._descriptor = descriptor
        self._closed_once_written = closed_once_written
        self.anything_written = False
        _REPORTS.add(descriptor)  # closed in a child forked meanwhile (see _close_reports_in_child)

    def write(self, text: str) -> int:
        self.anything_written = self.anything_written or bool(text)
        return super().write(text)

    def written(self) -> None:
        """The report (or failure document) is written: flush it, and close the descriptor when the
        process ends with the command."""
        self.flush()
        if self._closed_once_written:
            self._descriptor.close_descriptor()

    def given_back(self) -> None:
        """Put the report's descriptor back on file descriptor 1 (unless it was closed, its report written),
        and close the copy."""
        self.flush()
        fd = self._descriptor.fileno()
        if fd >= 0:
            os.dup2(fd, 1)
            self._descriptor.close_descriptor()


# The report descriptors of this process. A child forked while one is open (a tool's multiprocessing pool,
# os.fork) closes its copy at once: it never writes the report, and its copy would keep a reader of the
# pipe from seeing the report's end until the child exits.
_REPORTS: weakref.WeakSet[_Unbuffered] = weakref.WeakSet()


def _close_reports_in_child() -> None:
    for descriptor in list(_REPORTS):
        descriptor.close_descriptor()


os.register_at_fork(after_in_child=_close_reports_in_child)


def _serve(args: argparse.Namespace, report_to: TextIO | GuardedStdout) -> int:
    """`bide worker`, printing its report (or its --json failure document) to `report_to`."""
    from ._cli import json_failure
    from ._worker import Worker


    def failure_document(code: int, message: str, **facts: Any) -> None:
        with contextlib.redirect_stdout(report_to):
            json_failure(args, code, message, **facts)

    def refuse(code: int, message: str) -> int:
        print(f"bide: {printable(message)}", file=sys.stderr)
        failure_document(code, message)
        return code

    if args.json and not args.once:
        return refuse(EXIT_USAGE, "worker --json needs --once (a worker serving until stopped has no report)")
    taken = _StopSignals()
    log_lines = logging.StreamHandler()
    log_lines.setFormatter(_PrintableFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[log_lines])
    # httpx logs every request at INFO, with its URL as given (a password in a model's base_url too).
    for chatty in ("httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    app: list[Any] = []

    def import_app() -> None:  # once the store's URL is checked, before the store is opened or written
        with contextlib.redirect_stdout(sys.stderr):  # what the app prints is not the command's output
            app.append(app_attribute(args.app))

    try:
        # A worker serves a store (its app may start runs): it creates bide's tables in an existing database.
        with contextlib.redirect_stdout(report_to):  # a store that cannot be opened prints its failure
            store = _open(args, create=True, before_opening=import_app)
    except _AppError as exc:
        return refuse(EXIT_USAGE, str(exc))
    if isinstance(store, int):
        return store
    try:
        try:
            agents, served = agents_of(app[0], args.app, store)
            if served is not store:  # the app's own store object, on the same tables: the worker uses it
                with contextlib.suppress(StoreError):  # it was only opened, to check the URL
                    store.close()
                store = served
            # No grace: a stopping worker waits for its drives (a second signal cancels them).
            worker = Worker(store, agents, concurrency=args.concurrency, poll_interval=args.poll, grace=None)
        except (_AppError, ConfigError) as exc:
            return refuse(EXIT_USAGE, str(exc))
        with _signals_restored():
            if args.once:
                return _once_reported(args, worker, report_to, failure_document, taken)
            started = (
                f"bide worker: serving {len(agents)} agent(s) on {_where(store)}, looking for runs to "
                f"recover every {args.poll:g} s; SIGINT, SIGTERM or SIGHUP stops it"
            )
            asyncio.run(_forever(worker, started, taken))
            _flushed(report_to, taken)
        return EXIT_OK
    finally:
        try:
            # Closed already once the worker ran (see _store_released): this closes it on the other ways out.
            store.close()
        except StoreError as exc:  # what the worker did stands (and was reported): only said on stderr
            print(f"bide worker: closing the store failed: {printable(str(exc))}", file=sys.stderr)


def _once_reported(
    args: argparse.Namespace, worker: Worker, report_to: TextIO | GuardedStdout,
    failure_document: Callable[..., None], taken: _StopSignals,
) -> int:
    """`bide worker --once`: the pass, its report (or failure document) written and flushed while the stop
    signals are still the worker's, and its exit code."""
    from ._cli import EXIT_INTERRUPTED

    async def reported() -> int:
        # Written before asyncio.run's end, which waits for the threads of synchronous calls still running
        # past their timeout (a read-only one is not waited for by the pass): the report came after them.
        return _report_written(args, await _once(worker, taken), report_to, taken)

    try:
        return asyncio.run(reported())
    except _PassCancelled as cancelled:  # a second stop signal
        why, facts = cancelled.words()
        print(f"bide worker: {why}", file=sys.stderr)
        failure_document(EXIT_INTERRUPTED, why, **facts)
        _flushed(report_to, taken)
        return EXIT_INTERRUPTED
    except ExceptionGroup as group:  # the pass's task group wraps a listing's failure
        failed, rest = group.split(StoreError)
        if failed is None or rest is not None:
            raise
        cause = failed.exceptions[0]
        why = f"the store failed listing the runs to recover, so none was driven: {cause}"
        print(f"bide worker: {printable(why)}", file=sys.stderr)
        failure_document(EXIT_STORE, why)
        _flushed(report_to, taken)
        return EXIT_STORE


def _report_written(
    args: argparse.Namespace, report: PassReport, report_to: TextIO | GuardedStdout, taken: _StopSignals
) -> int:
    """Write a `--once` pass's report (and why its exit code is not 0) and flush it; its exit code."""
    if args.json:
        facts = {"driven": report.driven, "other_agent_runs": report.other_agent_runs}
        print(json.dumps(asdict(report) | facts, sort_keys=True), file=report_to)
    else:
        print(_report_in_words(report), file=report_to)
    code, why = _once_exit_code(report)
    if why:
        print(f"bide worker: {printable(why)}", file=sys.stderr)
    _flushed(report_to, taken)
    return code


def _report_in_words(report: PassReport) -> str:
    if not report.listed:
        return (
            "resumed no run: the pass was stopped before the store answered its listing of the runs "
            "to recover; the store was not read, so nothing is known of runs waiting"
        )
    runs = "run" if report.driven == 1 else "runs"
    return (
        f"resumed {report.driven} {runs}: {report.completed} completed, "
        + (f"{report.cancelled} cancelled, " if report.cancelled else "")
        + f"{report.halted} halted "
        f"(need a person), {report.waiting} waiting, {report.failed} failed; "
        f"{report.skipped} skipped"
        + (
            f" ({len(report.other_agents)} started by agents --app does not define: left to "
            "the worker of an app that defines them; see below)"
            if report.other_agents
            else ""
        )
        + (
            f"; {report.leased} held by a live lease (driven elsewhere, or its driver died "
            "less than its lease ago: a later pass takes those of this app's agents)"
            if report.leased
            else ""
        )
        + (f"\n{_other_agent_runs_in_words(report)}" if report.other_agents else "")
    )


def _other_agent_runs_in_words(report: PassReport) -> str:
    """The runs of agents the app does not define, counted by agent name: information, not trouble (on a
    shared store they are another app's; after an agent was renamed, no worker drives them)."""
    counts = report.other_agent_runs
    total = sum(counts.values())
    # Quoted: a name holding ", " or " (" would read as two.
    names = ", ".join(f"'{printable(name)}' ({count})" for name, count in counts.items())
    if len(counts) == 1:
        runs, them = ("1 run", "it") if total == 1 else (f"{total} runs", "them")
        return f"{runs} of an agent no app here defines: {names}; a worker whose app defines it drives {them}"
    return f"{total} runs of agents no app here defines: {names}; a worker whose app defines them drives them"


def _flushed(report_to: TextIO | GuardedStdout, taken: _StopSignals) -> None:
    """Write out what the worker printed while the stop signals are still its own (see _signals_restored),
    then mark its output written (`taken.written`: a stop signal from then on abandons only the end of the
    process)."""
    for stream in (report_to, sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed or failing stream: the exit code says
                stream.flush()
    if isinstance(report_to, _Report):
        report_to.written()
    taken.written = True


class _PrintableFormatter(logging.Formatter):
    """The worker's log lines, for a terminal: each line passes through `printable`, since what it says
    comes from inputs (a model server's error text, a run id from the store) that may hold escape sequences
    or line breaks; a traceback keeps its own line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), keep_newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep_newlines=True)


def _once_exit_code(report: PassReport) -> tuple[int, str]:
    """The exit code of a `--once` pass and, unless it is 0, what to say: EXIT_INTERRUPTED when a stop
    signal came before the store answered the pass's listing (`listed` False: nothing was driven, and
    nothing is known of runs waiting), else EXIT_STORE when a drive failed because the store failed, else
    EXIT_NOT_FOUND when the pass met a run no pass of this worker can drive (`unresumable`: it needs a
    person), else EXIT_FAILED when a drive failed otherwise, else EXIT_OK. A drive that ended its run as
    failed (`OutputInvalid`) gave the run's outcome, as a halt does: the worker did not fail, and a run of
    an agent the app does not define (`other_agents`) is another app's. What is said names every kind of
    trouble the pass met, whichever decides the code."""
    if not report.listed:
        from ._cli import EXIT_INTERRUPTED

        return EXIT_INTERRUPTED, (
            "the pass was stopped before the store answered its listing of the runs to recover: none was "
            "driven, and whether any waits is not known; a later pass looks"
        )
    by_store: list[str] = []
    other: list[str] = []
    for run_id, error in sorted(report.errors.items()):
        cause = report.causes.get(run_id, "error")
        if cause != "output":
            (by_store if cause == "store" else other).append(f"run {run_id}: {error}")
    stuck = [f"run {run_id}: {reason}" for run_id, reason in sorted(report.unresumable.items())]
    said: list[str] = []
    if by_store:
        said.append(
            f"the store failed in {_drives(by_store)} ({_first_few(by_store)}); tried again at the next pass"
        )
    if other:
        said.append(f"{_drives(other)} failed ({_first_few(other)}); tried again at the next pass")
    if stuck:
        if len(stuck) == 1:
            runs, them = "1 run cannot be resumed by this worker and needs", "it"
        else:
            runs, them = f"{len(stuck)} runs cannot be resumed by this worker and need", "them"
        said.append(
            f"{runs} a person: no pass of it drives {them} until one acts ({_first_few(stuck)}); each "
            "reason says what to do"
        )
    why = "; ".join(said)
    if by_store:
        return EXIT_STORE, why
    if stuck:
        return EXIT_NOT_FOUND, why
    if other:
        return EXIT_FAILED, why
    return EXIT_OK, ""


def _drives(failed: list[str]) -> str:
    return f"{len(failed)} drive" + ("" if len(failed) == 1 else "s")


def _first_few(lines: list[str]) -> str:
    return "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")


# SIGHUP too (a closed terminal or ssh session, a service manager's reload): its default action would end
# the process at once, in the middle of a side effect.
_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _handled_signals() -> list[signal.Signals]:
    """The stop signals the worker handles: all of them, but SIGHUP when it is ignored (under nohup, which
    asks for the worker to outlive the terminal)."""
    hangup = getattr(signal, "SIGHUP", None)
    return [sig for sig in _STOP_SIGNALS if not (sig == hangup and signal.getsignal(sig) == signal.SIG_IGN)]


@contextlib.contextmanager
def _signals_restored() -> Iterator[None]:
    """The stop signals kept from the default actions until the worker's output is written (see
    _signals_handled, `_counted`): in the bide command itself, until the process exits (a signal that lands
    once the worker is done does not cut its report short; a third in all exits at once); in a program that
    called the command in-process (`bide._cli.main`), which goes on, the program's own handlers are put back
    when the command returns."""
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        # Not in the command: putting back the defaults there would let a signal landing before the process
        # has exited end it by its default action (143 for SIGTERM), half-way through its report.
        if not _ends_with_the_process():
            for sig, handler in previous.items():
                if handler is not None:
                    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing changed
                        signal.signal(sig, handler)
            while _LEFT_TO_PUT_BACK:
                with contextlib.suppress(ValueError, OSError):
                    _LEFT_TO_PUT_BACK.pop()()


def _ends_with_the_process() -> bool:
    """Whether the process is the bide command (`bide`, `python -m bide._cli`), which exits once the command
    returns, rather than a program that called `bide._cli.main` and goes on."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:  # python -m
        return bool(spec.name == "bide._cli")
    from . import _cli

    # The `bide` console script: a file of its own (not a .py program) that calls bide's main.
    script = getattr(main, "__file__", None)
    return isinstance(script, str) and not script.endswith(".py") and getattr(main, "main", None) is _cli.main


class _StopSignals:
    """The stop signals a worker took so far, and where its stop is: `closing` when its drives are over and
    it waits for its store to be released (`_store_released`) before it exits, `over` once the store is
    released (its journal committed: a signal then ends the process, see `_counted`), `written` once its
    report (or failure document) is written out too. `cancelled`: a second signal under --once dropped the
    pass's report (its drives cancelled, or the exit waiting for the store then); `calls_waited`: that exit
    waited for synchronous tool calls running past their timeout (else for a statement of the store).
    `ending`: the timer that ends a process a signal found done but not exited (`_end_if_not_exited`);
    `given_back`: a program that called the command in-process has its handlers back (no timer ends it)."""

    def __init__(self) -> None:
        self.count = 0
        self.received = 0  # (counted as they come, before the loop handles them: see `_signals_handled`)
        self.closing = False
        self.over = False
        self.written = False
        self.cancelled = False
        self.calls_waited = False
        self.ending: threading.Timer | None = None
        self.ending_lock = threading.Lock()
        self.last_signal = 0  # the number of the latest stop signal taken (0: none yet)
        self.given_back = False


@contextlib.contextmanager
def _signals_handled(on_signal: Callable[[signal.Signals], None], taken: _StopSignals) -> Iterator[None]:
    """The stop signals handled by `on_signal` on the running loop until the block ends, then only counted
    (`_counted`): the worker is done, only its output is left to write (`_signals_restored` puts a host's
    handlers back). Python handlers, not the loop's own (`add_signal_handler`): the loop's end would put back
    the default actions, and a signal landing after it killed a worker that had finished its pass."""
    loop = asyncio.get_running_loop()
    handled = _handled_signals()

    def take(signum: int, frame: object) -> None:
        # Run by Python in the main thread between two bytecodes, anywhere in the loop's own code: the signal
        # is handled as the loop's next callback.
        loop.call_soon_threadsafe(on_signal, signal.Signals(signum))

    receive, wake = socket.socketpair()
    wake.setblocking(False)
    try:
        # Every signal's number is written there by Python's own C handler, whichever thread it landed in.
        previous_wakeup = signal.set_wakeup_fd(wake.fileno(), warn_on_full_buffer=False)
    except ValueError:  # not the main thread: signals are not handled there (nor were they before)
        receive.close()
        wake.close()
        yield
        return
    counter = threading.Thread(
        target=_counted, args=(receive, loop, taken), name="bide-worker-signals", daemon=True
    )
    counter.start()

    def put_back() -> None:
        taken.given_back = True  # the command returned to its host: a signal since is the host's to handle
        if taken.ending is not None:
            taken.ending.cancel()
        signal.set_wakeup_fd(previous_wakeup)
        wake.close()  # (the counting thread then ends, and closes `receive`)

    _LEFT_TO_PUT_BACK.append(put_back)
    try:
        for sig in handled:
            signal.signal(sig, take)
        yield
    finally:
        for sig in handled:
            signal.signal(sig, _only_counted)  # in one step: the default action is never back meanwhile
        taken.over = True
        if taken.last_signal:  # a stop asked for before the worker was done: it must not wait for ever now
            _end_later(taken.last_signal, taken)


# What `_signals_handled` leaves in place until the process exits, for `_signals_restored` to put back in a
# program that called the command in-process and goes on.
_LEFT_TO_PUT_BACK: list[Callable[[], None]] = []


def _only_counted(signum: int, frame: object) -> None:
    """The stop signals' handler once the worker is done: a Python handler, so that Python's own handler
    writes each signal to the wakeup fd, where `_counted` counts it."""


def _counted(receive: socket.socket, loop: asyncio.AbstractEventLoop, taken: _StopSignals) -> None:
    """Count the stop signals written to the wakeup fd (`receive`), on a thread of its own: it sees every
    one, whatever the main thread is doing. Python runs a signal's handler only in the main thread, and only
    between two bytecodes: a main thread waiting in C (for a thread a tool left, as the exit does; for the
    lock of a stderr another thread holds, blocked on a full pipe) never ran it, and three signals did not
    end the worker. While the worker runs, the loop is woken to handle each (`on_signal`), and a third the
    loop has not answered in `_LOOP_ANSWERS_S` exits at once. Once it is done (`taken.over`: its journal is
    committed, nothing is left to protect), the first signal ends the process (128 plus its number) unless
    it has exited by itself within `_DONE_EXITS_WITHIN_S` (a report being written to a reader that keeps up,
    an exit under way: its own exit code stands), and a third in all exits at once: the report and the
    threads its tools left running are not waited for."""
    stops = {int(sig) for sig in _STOP_SIGNALS}
    with receive:
        while True:
            try:
                data = receive.recv(64)
            except OSError:
                return
            if not data:
                return  # the wakeup fd was put back (`_signals_restored`)
            for signum in data:
                if signum not in stops:
                    continue
                taken.received += 1
                taken.last_signal = signum
                if not taken.over:
                    with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
                        loop.call_soon_threadsafe(_nothing)  # the main thread then runs `take`
                    if taken.received >= 3:
                        late = (signum, "the worker's loop")
                        watchdog = threading.Timer(_LOOP_ANSWERS_S, _exit_now, args=late)
                        watchdog.daemon = True
                        watchdog.start()
                elif taken.received >= 3:
                    _exit_now(signum, _left_unfinished(taken))
                else:
                    _end_later(signum, taken)


def _nothing() -> None:
    pass


def _end_later(signum: int, taken: _StopSignals) -> None:
    """Start the timer that ends a worker a stop signal found done, or asked to stop before it was done,
    if it has not exited `_DONE_EXITS_WITHIN_S` from now (once: from the counting thread or as the worker
    becomes done, whichever comes first)."""
    with taken.ending_lock:
        if taken.ending is None:
            taken.ending = threading.Timer(_DONE_EXITS_WITHIN_S, _end_if_not_exited, (signum, taken))
            taken.ending.daemon = True  # (a process that exits by itself never waits for it)
            taken.ending.start()


def _end_if_not_exited(signum: int, taken: _StopSignals) -> None:
    """End a worker that a stop signal found done (its journal committed) and that has not exited since."""
    if not taken.given_back:
        _exit_now(signum, _left_unfinished(taken))


def _left_unfinished(taken: _StopSignals) -> str:
    """What a worker that is done (`taken.over`) still had to do when a signal ends it."""
    if taken.cancelled:
        return "the end of its process (its pass was cancelled: no report; a later pass drives its runs)"
    if not taken.written:
        return "its report to be written out (its pass was over and its journal is committed)"
    return "the end of its process (threads its tools left running, exit functions); its report is written"


def _exit_now(signum: int, abandoned: str) -> NoReturn:
    """Exit at once (128 plus `signum`), saying what is `abandoned` on stderr when that can be done without
    blocking (a full pipe nobody reads, or the lock of a stderr another thread holds blocked on one, would
    block it: the exit comes after `_SAYING_S` whatever becomes of the words)."""
    code = 128 + signum
    watchdog = threading.Timer(_SAYING_S, os._exit, args=(code,))
    watchdog.daemon = True
    watchdog.start()
    _say_unless_it_blocks(f"bide worker: exiting now, without waiting for {abandoned}")
    os._exit(code)


def _say_unless_it_blocks(line: str) -> None:
    """`line` on stderr when it takes it now: straight to its descriptor (not through `sys.stderr`, whose
    lock a blocked writer may hold), and only when the descriptor can take it (not a full pipe)."""
    try:
        fd = sys.stderr.fileno() if sys.stderr is not None else -1  # (None when started with 2>&-)
    except (OSError, ValueError, AttributeError):  # stderr captured in the process (a StringIO)
        _say(line)
        return
    if fd < 0:
        return
    with contextlib.suppress(OSError, ValueError):
        ready = select.poll()
        ready.register(fd, select.POLLOUT)
        if ready.poll(0):  # room for a line (a pipe with a free page: up to 4,096 bytes go in at once)
            os.write(fd, (line + "\n").encode())


# How long the last words of a worker exiting at once may take (a blocked stderr), and how long its loop may
# take to answer a third signal before the thread counting them exits itself.
_SAYING_S = 0.5
_LOOP_ANSWERS_S = 0.5
# How long a worker that is done (its journal committed) may take to exit by itself once a stop signal
# came: a report being written to a reader that keeps up, an exit under way. Past it, the signal ends it.
_DONE_EXITS_WITHIN_S = 5.0



def _on_stop_signals(
    worker: Worker, taken: _StopSignals, a_pass: asyncio.Task[Any] | None = None
) -> Callable[[signal.Signals], None]:
    # The first signal stops the worker and waits for its drives however long they take (a side effect
    # running then has its result journaled); only a second one cancels them, which the operator is told.
    # `a_pass`: the task of a --once pass, whose drives are its own (not counted in the worker's in_flight).
    from ._store import finishers_running

    def on_signal(sig: signal.Signals) -> None:
        if taken.over:
            return  # the store is released: only the output is left to write, and the exit
        taken.count += 1
        signals = taken.count
        # Synchronous calls past their timeout, whose drives are over: the exit waits for them all the same.
        late = finishers_running(worker.store)
        pass_over = a_pass is not None and a_pass.done()
        if signals >= 3:
            # A synchronous call cannot be interrupted, and the process waits for its thread at exit: only
            # leaving at once ends it (as SIGKILL would; the run's marker makes its call an unknown outcome).
            _exit_now(int(sig), _abandoned(taken, late))
        if taken.closing:
            # The drives are over: what is left is the store's release (see _store_released).
            worker.stop()
            if a_pass is not None and signals == 2:
                taken.cancelled, taken.calls_waited = True, late
                _say(f"bide worker: this pass is cancelled: {_cancelled_exit(late)}")
            else:
                _say(
                    f"bide worker: still waiting for {_waited_for(late)} before exiting "
                    f"({_exit_at_once(signals)})"
                )
        elif pass_over:
            _say("bide worker: this pass is over: it prints its report once its store is closed")
        elif signals == 1:
            worker.stop()
            if a_pass is not None and worker.listing:
                _say(
                    "bide worker: stopping while this pass lists the runs to recover: it drives none of them "
                    "(the listing's answer is dropped)"
                )
            elif a_pass is not None:
                _say(
                    "bide worker: stopping once this pass's drives finish (a second SIGINT, SIGTERM or "
                    "SIGHUP cancels them: a side effect running then halts its run for a person)"
                )
            elif worker.in_flight:
                _say(
                    f"bide worker: stopping; waiting for the {worker.in_flight} drive(s) in flight to finish "
                    "(a second SIGINT, SIGTERM or SIGHUP cancels them: a side effect running then halts "
                    "its run for a person)"
                )
            if late:
                _say(_LATE_CALLS)
        else:
            if worker.in_flight:
                _say(
                    "bide worker: cancelling the drives in flight; a synchronous tool call among them runs "
                    "on in its thread until it returns, then its outcome is journaled and the worker exits "
                    "(a third signal exits at once: such a call's run then halts for a person)"
                )
            if late:
                _say(_LATE_CALLS)
            worker.cancel_drives()
            if a_pass is not None:
                _say("bide worker: cancelling this pass's drives (a third signal exits at once)")
                taken.cancelled = True
                a_pass.cancel()

    return on_signal


def _waited_for(late: bool) -> str:
    """What the exit of a worker whose drives are over waits for."""
    if late:
        return "synchronous tool calls running past their timeout to return and journal their outcomes"
    return "the store"


def _cancelled_exit(late: bool) -> str:
    """How a --once pass whose drives are over exits once a second signal dropped its report."""
    if late:
        return (
            "its drives had ended; it exits without its report once the synchronous tool calls running past "
            "their timeout have returned and journaled their outcomes (a third SIGINT, SIGTERM or SIGHUP "
            "exits at once: such a call's run then halts for a person)"
        )
    return f"it exits without its report once the store has answered ({_exit_at_once(2)})"


class _PassCancelled(Exception):
    """A --once pass whose report a second stop signal dropped: `report` None when its drives were cancelled,
    else the report of a pass that was over (the exit then waited for the store, or for synchronous calls
    running past their timeout when `calls`)."""

    def __init__(self, report: PassReport | None, calls: bool) -> None:
        super().__init__("the pass was cancelled by a second signal")
        self.report = report
        self.calls = calls

    def words(self) -> tuple[str, dict[str, Any]]:
        """What to say, and the facts for the --json failure document."""
        said = "the pass was cancelled by a second signal"
        if self.report is None:
            return (
                f"{said}: its drives stopped where they were (their runs are driven again by a later pass; "
                "an interrupted side effect may halt its run)"
            ), {}
        if not self.report.listed:
            return (
                f"{said}, stopped while it listed the runs to recover: it drove none, and the store was not "
                "read, so nothing is known of runs waiting; a later pass looks"
            ), {"listed": False}
        if self.calls:
            return (
                f"{said} once its drives had ended: its report is not printed; the synchronous tool calls "
                "that ran past their timeout returned and journaled their outcomes (a later pass goes on "
                "with their runs)"
            ), {}
        return f"{said} once its drives had ended: its report is not printed; what they did is journaled", {}


def _abandoned(taken: _StopSignals, late: bool) -> str:
    """What an exit at once does not wait for: synchronous calls running past their timeout (`late`), the
    store's answer to a statement (the drives are over, the store is closing), else the cancelled drives."""
    if late:
        return "the calls still running"
    if taken.closing:
        return "the store to answer the statement under way"
    return "the cancelled drives to end"


def _exit_at_once(taken: int) -> str:
    """How many more stop signals make the worker exit at once, having taken `taken` (the third does)."""
    more = {0: "three SIGINT, SIGTERM or SIGHUP exit", 1: "two more SIGINT, SIGTERM or SIGHUP exit"}
    return more.get(taken, "a third SIGINT, SIGTERM or SIGHUP exits") + " at once"


async def _store_released(worker: Worker, taken: _StopSignals) -> None:
    """Close the worker's store once its drives are over, and wait until the store is released, with the
    worker's signal handlers still on: a statement it runs (a listing whose answer the worker dropped,
    waiting for a lock another session holds) is answered within the store's busy timeout, and a
    synchronous call past its timeout journals its outcome when it returns. The end of the process would
    wait for them all the same, with the default actions of the signals back (a second signal killed the
    worker, or raised KeyboardInterrupt in the interpreter's exit). Said on stderr when there is a wait: at
    once for synchronous calls, after `_STATEMENT_SAID_AFTER_S` for a statement (most, a listing among them,
    are answered before: only one that waits, for a lock say, holds the exit up)."""
    from ._store import finishers_running

    store = worker.store
    before = set(threading.enumerate())
    late = finishers_running(store)
    try:
        store.close()
    except StoreError as exc:  # what the worker did stands (and is reported): only said on stderr
        _say(f"bide worker: closing the store failed: {printable(str(exc))}")
        return

    def releasing() -> bool:
        # A close that must wait leaves it to a thread of its own (not a daemon: the exit waits for it).
        return any(t not in before and t.is_alive() and not t.daemon for t in threading.enumerate())

    if not releasing():
        return
    taken.closing = True
    what = (
        "synchronous tool calls running past their timeout to return and journal their outcomes"
        if late
        else "the store to answer the statement under way (one waiting for a lock another session holds "
        "waits up to the store's busy timeout)"
    )
    loop = asyncio.get_running_loop()
    say_at = loop.time() + (0.0 if late else _STATEMENT_SAID_AFTER_S)
    said = False
    while releasing():
        if not said and loop.time() >= say_at:
            said = True
            _say(f"bide worker: waiting for {what} before exiting ({_exit_at_once(taken.count)})")
        await asyncio.sleep(_RELEASE_POLL_S)


# How often the exit looks whether the store was released: a wait for a statement is seconds long.
_RELEASE_POLL_S = 0.05
# How long the store may take to answer the statement under way before the exit says it waits for it: an
# ordinary one (a listing) is answered well before, and saying it then told of a wait that did not happen.
_STATEMENT_SAID_AFTER_S = 1.0


_LATE_CALLS = (
    "bide worker: stopping; synchronous tool calls run on past their timeout in their threads: the worker "
    "exits once they return and their outcomes are journaled (a third SIGINT, SIGTERM or SIGHUP exits at "
    "once: such a call's run then halts for a person)"
)


def _say(line: str) -> None:
    if sys.stderr is not None:  # (None when started with 2>&-)
        with contextlib.suppress(OSError):  # a full or broken stderr (2>/dev/full) stops no worker
            print(line, file=sys.stderr, flush=True)


async def _once(worker: Worker, taken: _StopSignals) -> PassReport:
    """The pass, then the store closed and released; `_PassCancelled` when a second stop signal came before
    that (the pass's drives cancelled, or the exit waiting for the store then)."""
    a_pass = asyncio.ensure_future(worker.run_once())
    with _signals_handled(_on_stop_signals(worker, taken, a_pass), taken):
        await asyncio.wait([a_pass])
        await _store_released(worker, taken)
    if a_pass.cancelled():
        raise _PassCancelled(None, calls=False)
    report = a_pass.result()  # (a listing's failure is raised here)
    if taken.cancelled:
        raise _PassCancelled(report, calls=taken.calls_waited)
    return report


async def _forever(worker: Worker, started: str, taken: _StopSignals) -> None:
    with _signals_handled(_on_stop_signals(worker, taken), taken):
        # Said once the stop signals are the worker's own: from then on a signal stops it as documented
        # (before, it ends the process as any program starting up, with no run taken yet).
        _say(printable(started))
        try:
            await worker.run_forever()
        finally:
            await _store_released(worker, taken)


_WORKER_DESCRIPTION = """\
Resume runs whose driver died (their lease expired). Without --once it runs until SIGINT, SIGTERM or SIGHUP,
then exits 0; or until its SQLite file is deleted, moved or replaced under it, then exits 6 (start it again
once the file is in place).

--once makes one pass and exits:
  0  every drive ended as a run does: completed, halted for a person, waiting, or ended as failed by
     its drive (OutputInvalid): those are the runs' outcomes, not the worker's failure
  1  a drive failed otherwise (the model down, a tool that did not run): retried at the next pass
  4  a run this worker cannot drive (a record damaged in the database, another journal format): no
     pass drives it until a person acts; stderr and --json's "unresumable" name each run and why
     (whatever else failed, but the store). A run started by an agent --app does not define is not
     one: on a store several apps share it is another app's (--json's "other_agents" names them)
  6  the store failed, listing the runs or in any drive (whatever else failed): retried at the
     next pass
  130  stopped (SIGINT, SIGTERM or SIGHUP) before the store answered the pass's listing of the runs:
     none was driven and nothing is known of runs waiting (--json: "listed": false); or a second
     signal cancelled the pass before the store was released (no report). Once the store is
     released (the journal committed), the report is printed and the exit code is the pass's,
     unless a signal came (then or before) and the process has not exited 5 s after the store
     was released or the signal came, or a third signal in all comes: then 128 plus its number
"""


def _concurrency(text: str) -> int:
    from ._worker import worker_concurrency

    try:
        return worker_concurrency(int(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"drives at once: a whole number, 1 or more, not {text!r}") from None


def _poll(text: str) -> float:
    from ._worker import worker_poll_interval

    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds: a number, not {text!r}") from None
    try:
        return worker_poll_interval(seconds)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("poll_interval", "--poll")) from None


def register(sub: Any) -> None:
    """Add `bide worker` and `bide cancel` to the `bide` command."""
    from ._cli import add_store_argument

    p = sub.add_parser(
        "worker",
        help="resume runs whose driver died (their lease expired)",
        description=_WORKER_DESCRIPTION,
    )
    add_store_argument(p)
    p.add_argument(
        "--app",
        required=True,
        metavar="MODULE:ATTRIBUTE",
        help="module:attribute giving an Agent, a list (or tuple) of Agents, or a function(store) returning "
        "either, called with the worker's store; the current directory is importable",
    )
    # Checked as they are parsed: a bad value is exit 2 before the store is opened (bide's tables created).
    p.add_argument("--concurrency", type=_concurrency, default=16, help="drives at once (default 16)")
    p.add_argument(
        "--poll", type=_poll, default=1.0, help="seconds between looks for runs (default 1, at least 0.01)"
    )
    p.add_argument(
        "--once", action="store_true", help="one pass, then exit (for cron; how it exits: see above)"
    )
    p.add_argument("--json", action="store_true", help="with --once: print the pass as JSON")
    p.set_defaults(handler=_cmd_worker)

    p = sub.add_parser("cancel", help="ask a run to stop at its next turn boundary")
    add_store_argument(p)
    p.add_argument("run", type=run_id_argument, help="run id")
    p.add_argument("--reason", default="", type=text_argument, help="why (the run's answer says it)")
    p.set_defaults(handler=_cmd_cancel)
