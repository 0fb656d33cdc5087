"""The conventions every command line of this distribution follows (`govern`, `bide`, `bide-audit`).

One exit-code table (printed by each `--help`), `--version` and `--debug` on every command, argument errors
answered with exit 2 and a suggestion, readable times, JSON for programs and rich tables for people
(times are shown by `bide._when.when`: ISO 8601 and "in 42 s"). The
commands are argparse programs; this module is the one place their shared behaviour lives.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from ._stdout import emitted, informational_exit, output_failed
from ._terminal import printable

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INTERNAL",
    "EXIT_NOT_FOUND",
    "EXIT_NOT_YET",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_STORE",
    "EXIT_USAGE",
    "Parser",
    "UsageRefused",
    "add_standard_options",
    "close_store",
    "damaged_store_file",
    "give_up_on",
    "internal_error",
    "parse_arguments",
    "print_json",
    "run_id_argument",
    "store_failure",
    "table",
    "text_argument",
    "unreachable_store",
    "unreadable_store",
    "version",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_NOT_FOUND = 4
EXIT_REFUSED = 5
EXIT_STORE = 6
EXIT_NOT_YET = 7

EXIT_CODES_HELP = """\
exit codes (the same for govern, bide and bide-audit):
  0  success: done, verified, certified
  1  checked and found wanting: not verified (bide-audit), certificate not valid (govern check),
     machine not convergent (govern certify: the counterexample is printed)
  2  usage or input error: bad arguments, a machine file that does not import, no registry found,
     an unusable key (bide, govern; bide-audit reads keys as inputs: 4), store URL or JSON argument,
     an output file that cannot be written
  3  internal error or engine/oracle disagreement: a bug; rerun with --debug and report the traceback
  4  unreadable or not found: a truncated, oversized, malformed or non-canonical artifact or
     certificate, a missing input file (machine file, certificate, artifact, key), no such store,
     run or call (bide), a SQLite store that cannot be used where it is: damaged, in a directory you
     may not enter, or where SQLite may not write it (a read-only mount, a directory or file you may
     not write: copy it, with its -wal file, to a directory you can)
  5  refused: the request contradicts what is recorded (already resolved, already decided, gate
     closed) or a policy you pinned (bide-audit verify-approvals); the message says why
  6  the store failed: the database is unreachable or answered with an error (bide,
     bide-audit export)
  7  not yet: another driver holds the run, or the call may still be running (bide resolve);
     nothing was done: retry after the time the message gives (--json: retry_after); a record
     committed while bide-audit export --record ran (run it again)
  130  interrupted (Ctrl-C): what was written is whole, and the message says what was sent
"""


def version() -> str:
    """The installed version of the `bide` distribution (which ships `govern` too)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("bide")
    except PackageNotFoundError:
        return "0+unknown"


class Parser(argparse.ArgumentParser):
    """An argparse parser that prints the exit-code table in `--help`, exits 2 on bad arguments, and
    suggests the nearest command for a mistyped one. `synonyms` maps words people try that are not a
    command, nor close to one by spelling (`bide status`), to the command that does it (`show`)."""

    def __init__(self, *args: Any, synonyms: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.synonyms = dict(synonyms or {})

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        # argparse drops every OSError of its writes, so `--help > /dev/full` exited 0 with the help lost.
        if not message:
            return
        out = sys.stderr if file is None else file
        if out is not sys.stdout:
            super()._print_message(message, file)
            return
        try:
            out.write(message)
        except OSError as exc:  # said as the command ends (`informational_exit`, see bide._stdout)
            output_failed(exc)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        hint = _suggestion(self, message)
        sys.stderr.write(f"{self.prog}: usage error: {message}{hint}\n")
        raise UsageRefused(f"{message}{hint}")


class UsageRefused(SystemExit):
    """What `Parser` raises for arguments it refuses: exit code 2 (usage), with argparse's message."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_USAGE)
        self.message = message


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, say_in_json: Callable[[str], None]
) -> argparse.Namespace:
    """`parser.parse_args(argv)`. Arguments refused with `--json` among them still give the one JSON
    document every exit of a `--json` command prints: `say_in_json(message)` prints it, then the refusal
    goes on (exit code 2, the usage on stderr). Help or a version that could not be written exits 2, not 0."""
    prefix = f"{parser.prog}: error: "
    try:
        return parser.parse_args(argv)
    except UsageRefused as refused:
        if "--json" in (sys.argv[1:] if argv is None else argv):
            said = f"the arguments were refused: {refused.message}"
            emitted(lambda: say_in_json(said), EXIT_USAGE, prefix)
        raise
    except SystemExit as done:
        raise informational_exit(done, prefix) from None


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    if "invalid choice" not in message:
        return ""
    wrong = message.split("'", 2)[1] if message.count("'") >= 2 else ""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            close = difflib.get_close_matches(wrong, list(action.choices), n=1)
            synonym = getattr(parser, "synonyms", {}).get(wrong.lower())
            if not close and synonym in action.choices:
                close = [synonym]
            if close:
                return f"\n  did you mean `{parser.prog} {close[0]}`?"
    return ""


def add_standard_options(parser: argparse.ArgumentParser) -> None:
    """`--version` and `--debug` (tracebacks for errors), the same on every command."""
    parser.add_argument("--version", action="version", version=f"{parser.prog} {version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")


#: The largest size limit an option takes: 1 TiB, far above any input that fits in memory.
MAX_BYTE_LIMIT = 1 << 40


def byte_limit(text: str) -> int:
    """An argparse type for a size limit in bytes: a whole number from 1 to `MAX_BYTE_LIMIT` (a negative
    size given to read() means "everything", which would lift the limit silently)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("the size limit must be positive")
    if value > MAX_BYTE_LIMIT:
        raise argparse.ArgumentTypeError(f"the size limit can be at most {MAX_BYTE_LIMIT} bytes (1 TiB)")
    return value


def skew_seconds(text: str) -> int:
    """An argparse type for a clock-skew allowance: a whole number of seconds, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of seconds") from None
    if value < 0:
        raise argparse.ArgumentTypeError("the clock skew cannot be negative")
    return value


def run_id_argument(text: str) -> str:
    """An argparse type for a run id: one bide could have written (not empty, at most 256 characters, no
    control characters), so a mistyped id is a usage error rather than a run that "cannot be read"."""
    from ._errors import ConfigError
    from ._journal import check_run_id

    try:
        return check_run_id(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def text_argument(text: str) -> str:
    """An argparse type for text a command stores or looks up (a reason, a message, a call id, a prefix):
    bytes that are not UTF-8 (which Python hands over as lone surrogates, and no store can keep) are a
    usage error, not a failure of the store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} holds bytes that are not UTF-8 text (at character {exc.start}); bide keeps text as "
            "UTF-8"
        ) from None
    return text


def internal_error(prog: str, exc: BaseException, *, debug: bool) -> int:
    """Report an unexpected exception as a bug (exit 3); the traceback only with --debug."""
    if debug:
        traceback.print_exception(exc)
    print(
        printable(f"{prog}: internal error: {type(exc).__name__}: {exc} (this is a bug; rerun with --debug "
                  "and report the traceback)"),
        file=sys.stderr,
    )
    return EXIT_INTERNAL


# SQLite's answers for a file that is not (or no longer) a whole database: a truncated or overwritten file,
# which fails the same way on every try. Any other error of the store (busy, locked, out of memory, a lost
# connection) may pass: exit 6, which a script retries.
_DAMAGED_FILE_ERRORS = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
# SQLite's answers for files it may not create or write: in a read-only place, the same on every try.
_READ_ONLY_ERRORS = ("SQLITE_READONLY", "SQLITE_CANTOPEN")


def _sqlite_error_names(exc: BaseException) -> list[str]:
    """The SQLite error names (`SQLITE_CORRUPT`, ...) of the errors `exc` was raised from, itself included."""
    names = []
    seen: BaseException | None = exc
    for _ in range(10):  # a chain is a few errors long; a cycle must not hang the command
        if seen is None:
            break
        name = getattr(seen, "sqlite_errorname", None)  # sqlite3.Error; SQLAlchemy's keeps it as .orig
        name = name or getattr(getattr(seen, "orig", None), "sqlite_errorname", None)
        if isinstance(name, str):
            names.append(name)
        seen = seen.__cause__ or seen.__context__
    return names


def damaged_store_file(exc: BaseException) -> str | None:
    """When `exc` was raised (perhaps through other errors) from a SQLite file that is damaged ("database disk
    image is malformed", "file is not a database"), what to tell the user: a store that is unreadable (exit
    4) and will stay so, not one that failed (exit 6, which a script retries forever); None otherwise."""
    if any(name.startswith(_DAMAGED_FILE_ERRORS) for name in _sqlite_error_names(exc)):
        return (
            f"{exc}: the store's file is damaged (truncated or overwritten), and reading it will fail "
            "the same way every time; restore it from a backup"
        )
    return None


def _refused_by_its_place(exc: BaseException) -> bool:
    """`exc` was raised (perhaps through other errors) from SQLite's refusal to create or write a file of the
    store: the store's errors keep the sqlite3 error they report as their cause."""
    return any(name.startswith(_READ_ONLY_ERRORS) for name in _sqlite_error_names(exc))


def _denied_by_the_system(exc: BaseException) -> bool:
    """`exc` was raised (perhaps through other errors) from the operating system's refusal to let this user
    reach a file (`PermissionError`)."""
    seen: BaseException | None = exc
    for _ in range(10):  # (as in _sqlite_error_names)
        if seen is None:
            return False
        if isinstance(seen, PermissionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def unreachable_store(path: str) -> str | None:
    """When this user may not reach the SQLite store `path` (a directory on its way they may not enter, or
    a file they may not read), what to tell them: it is unreadable (exit 4), and stays so whatever the
    retries (exit 6 would have a script retry for ever), with what to do; None when they may."""
    found = _out_of_reach(path)
    return None if found is None else f"{found[0]}; {found[1]}"


def _out_of_reach(path: str) -> tuple[str, str] | None:
    """What keeps this user from the SQLite store `path`, and what to do, in words; None when nothing does."""
    from ._dbfile import out_of_reach, unenterable_directory

    reach = out_of_reach(path)
    if reach is None:
        return None
    closed = unenterable_directory(path)
    name = os.path.basename(path)
    if closed is not None:
        who = (f"run the command as a user who may enter {closed} (its owner, or a member of its group), or "
               f"have its owner let this user in (chmod o+x {closed}, or add the user to its group)")
    else:
        who = f"run the command as the store's owner, or have the owner let this user read {name}"
    return reach, (
        f"this will fail the same way every time: {who}; or read a copy of {name}, with its {name}-wal file "
        "if there is one (it may hold the latest records), made by a user who can"
    )


def _read_only_place(path: str) -> str | None:
    """Why SQLite may not write the WAL-mode store `path` where it is, in words: its directory is on a
    read-only mount; the store's file, or its `-wal` or `-shm` beside it, is not writable by this user; or
    its directory is not, and the two files SQLite creates there for a reader are not both there. None when
    none of these holds."""
    path = os.path.realpath(path)  # SQLite writes beside the file a symbolic link names
    directory = os.path.dirname(path)
    try:
        mounted_read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    if mounted_read_only:
        return f"the file system holding {directory} is mounted read-only"
    for name in (path, f"{path}-wal", f"{path}-shm"):
        if os.path.isfile(name) and not os.access(name, os.W_OK):
            return f"{name} is not writable by this user"
    beside = (f"{path}-wal", f"{path}-shm")
    if all(os.path.isfile(name) for name in beside):
        return None
    if not os.access(directory, os.W_OK | os.X_OK):
        name = os.path.basename(path)
        return (f"the directory {directory} is not writable by this user (SQLite creates {name}-wal and "
                f"{name}-shm beside a store it reads)")
    return None


def unreadable_store(exc: BaseException, url: str | None) -> str | None:
    """When `exc`, raised by the store `url`, says the store cannot be read or written and will not be on any
    try (a damaged SQLite file; a SQLite store in a directory this user may not enter, or in a read-only
    place), what to tell the user (exit 4, with what to do); None for a failure that may pass (exit 6,
    which a script retries)."""
    damaged = damaged_store_file(exc)
    if damaged is not None or url is None:
        return damaged
    from ._url import StoreURLError, parse_store_url

    try:
        where = parse_store_url(url)
    except StoreURLError:
        return None
    if where.kind != "sqlite":
        return None
    refused = _refused_by_its_place(exc)
    found = _out_of_reach(where.path) if refused or _denied_by_the_system(exc) else None
    if found is not None:
        reach, advice = found
        said = _without_retry_advice(str(exc))
        return f"{said}{'' if reach in said else f' ({reach})'}; {advice}"
    if not refused:
        return None
    place = _read_only_place(where.path)
    if place is None:
        return None
    # The file SQLite reads and writes beside: where a symbolic link leads (its -wal is there, not beside
    # the link), named in full when the link names it otherwise.
    real = os.path.realpath(where.path)
    name = os.path.basename(real)
    shown = name if real == os.path.abspath(where.path) else real
    said = _without_retry_advice(str(exc))
    from ._dbfile import why_unwritable

    hinted = why_unwritable(where.path)  # what the store may have said of the place already
    why = "" if place in said or (hinted and hinted in said) else f" ({place})"
    return (
        f"{said}{why}; SQLite may not write where the store is, and this will fail the same way every time: "
        "to change the store, run the command where it may be written (as its owner, on a read-write "
        f"mount); to read it, copy {shown}, with its {name}-wal file if there is one (it may hold the latest "
        "records), to a directory you can write, and read the copy"
    )


def store_failure(exc: BaseException, url: str | None) -> str:
    """What to say of `exc`, a failure of the store `url` that may pass (exit 6): its message, less a hint
    the store added that SQLite may not write where a SQLite file is (`bide._dbfile.why_unwritable`) when the
    error is no refusal to write (a locked database), which the hint would only mislead about."""
    said = str(exc)
    if url is None or _refused_by_its_place(exc):
        return said
    from ._dbfile import why_unwritable
    from ._url import StoreURLError, parse_store_url

    try:
        where = parse_store_url(url)
    except StoreURLError:
        return said
    if where.kind != "sqlite":
        return said
    hint = why_unwritable(where.path)
    # Only a hint of a place SQLite may not write: one of a full disk explains a disk I/O error.
    misleading = hint and ("not writable by this user" in hint or "mounted read-only" in hint)
    return said.replace(hint, "") if misleading else said


def _without_retry_advice(said: str) -> str:
    """The store's message `said` without the advice it gives for a failure that may pass ("run it again"),
    which a failure that will not contradicts."""
    for advice in ("; run it again once the database answers", "; run it again"):
        said = said.replace(advice, "")
    return said


def give_up_on(store: Any) -> None:
    """Cancel what `store` is running now for a command that was interrupted (Ctrl-C) before it sent any
    write: a read waiting on a lock held elsewhere fails at once instead of when the busy timeout ends."""
    interrupt = getattr(store, "interrupt", None)
    if callable(interrupt):
        interrupt()


def close_store(store: Any) -> None:
    """Close a command's store; when a KeyboardInterrupt passes through the caller's `finally` (the command
    leaves on Ctrl-C, having sent no write), `give_up_on` it first, so closing does not wait for it."""
    if isinstance(sys.exc_info()[1], KeyboardInterrupt):
        give_up_on(store)
    store.close()


def print_json(value: Any) -> None:
    """Print JSON for programs: sorted keys, ASCII-escaped (no control character from an input reaches the
    terminal), one document per command."""
    print(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=True))


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None) -> None:
    """Print a rich table for people; every cell goes through `printable` and is never read as markup."""
    # rich is imported here, not at start: a command that prints JSON, help or an error never pays for it.
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for name in columns:
        t.add_column(name, overflow="fold")
    for row in rows:
        t.add_row(*(Text(printable(str(cell))) for cell in row))
    # Piped output is not wrapped at 80 columns: a run id or a record is never folded for `grep`.
    width = None if sys.stdout.isatty() else 1000
    Console(highlight=False, soft_wrap=False, width=width).print(t)
