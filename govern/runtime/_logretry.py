"""Which database failures an event log operation retries, and for how long.

A failure is classified from the driver's own error, never from a flag SQLAlchemy sets on the side
(`connection_invalidated` is racy: it was False for an admin shutdown during a query and for
"cannot exit pipeline mode while busy" on rollback):

- **retry**: the operation can run again and will most likely succeed: a lost or refused connection
  (SQLSTATE class 08, admin/crash shutdown 57P01/57P02/57P03, a session the server ended for idling in a
  transaction 25P03, or a psycopg `OperationalError` /
  `InterfaceError` without SQLSTATE: the connection broke under the driver), a serialization failure
  (40001), a deadlock (40P01), and SQLite's busy/locked (its lock wait ran out or was refused at once);
- **timeout**: a bounded wait ran out: PostgreSQL's `lock_timeout` (55P03) or `statement_timeout`
  (57014), or no free connection in the pool. Retrying would only wait again: the caller is told;
- **refused**: libpq refuses the value of one of its options (``sslmode=bogus``): the URL must change;
- **corrupt**: a damaged SQLite file, or a uniqueness constraint of the events table violated: appends
  number events from the log's own counters under its lock, so two events at one position (or one
  record or producer sequence number) mean the counters were edited down or restored apart from the
  events; retrying would fail the same way;
- **fail**: everything else (another constraint the log's own checks should have prevented),
  and a server that refuses the connection for good: no such database, no such role, a wrong password
  or no pg_hba.conf rule for it. Retrying these for the log's whole timeout only hid them behind
  "unreachable or overloaded".

Every retry loop runs until the operation's deadline (the log's `timeout` after it began), waiting as
bide's one retry policy says (`bide.RetryPolicy`: jittered exponential backoff from 1 ms to 100 ms); the
deadline, not a count of attempts, ends the loop, because the log promises to finish or raise within
its timeout.
"""

from __future__ import annotations

import shlex
import sqlite3
import sys
import time
from typing import Literal

import sqlalchemy as sa

from bide._retry import RetryPolicy
from bide._sql import _SERVER_FULL
from bide._url import missing_database, refused_for_good, refused_option_value

Kind = Literal["retry", "timeout", "refused", "corrupt", "fail"]

# 25P03: the server ended a session left idle in a transaction (a paused process; see `_engine` in _eventlog).
_RETRY_STATES = {"40001", "40P01", "57P01", "57P02", "57P03", "25P03"}
_TIMEOUT_STATES = {"55P03": "lock_timeout", "57014": "statement_timeout"}
#: The waits between tries; `attempts` is unused (the deadline bounds the loop).
_WAITS = RetryPolicy(initial=0.001, maximum=0.1, multiplier=2.0)
_SQLITE_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED (primary codes; extended codes keep them in the low byte)
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_SQLITE_UNIQUE = {1555, 2067}  # SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE
_COUNTERS_BEHIND = (
    "the log's counters are behind its events ({what}): they were edited, or restored apart from the events"
)


def classify(exc: BaseException) -> tuple[Kind, str, bool]:
    """How to treat `exc` (a SQLAlchemy error, possibly with a chain of causes), a short reason, and
    whether the connection it happened on is broken (it must be discarded, not returned to the pool)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = _classify_one(current)
        if kind is not None:
            return kind
        current = current.__cause__ or current.__context__
    return "fail", _describe(exc), False


def _classify_one(exc: BaseException) -> tuple[Kind, str, bool] | None:
    if isinstance(exc, sa.exc.TimeoutError):
        return "timeout", "no free connection in the pool", False
    orig: BaseException = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", None)
        text = str(orig).lower()
        if (code is not None and code & 0xFF in _SQLITE_BUSY) or "database is locked" in text:
            return "retry", "the SQLite database is locked by another writer", False
        if code is not None and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            notadb = code & 0xFF == _SQLITE_NOTADB
            what = "the file is not a SQLite database" if notadb else "the file is damaged"
            return "corrupt", f"{what} ({_first_line(orig)})", True
        if code in _SQLITE_UNIQUE and "govern_events." in text:
            return "corrupt", _COUNTERS_BEHIND.format(what=_first_line(orig)), False
        return None
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        if state in _TIMEOUT_STATES:
            return "timeout", f"PostgreSQL {_TIMEOUT_STATES[state]} ({state}): {_first_line(orig)}", False
        if state in _RETRY_STATES or state.startswith("08"):
            broken = state.startswith(("08", "57P")) or state == "25P03"
            return "retry", f"SQLSTATE {state}: {_first_line(orig)}", broken
        if state == "3F000":  # invalid_schema_name: the URL's search_path names no schema that exists
            return (
                "refused",
                f"{_first_line(orig)}: the schema the URL's search_path names does not exist; create it "
                "(CREATE SCHEMA ...) or name an existing one",
                False,
            )
        diag = getattr(orig, "diag", None)
        if state == "23505" and str(getattr(diag, "table_name", "")) == "govern_events":
            return "corrupt", _COUNTERS_BEHIND.format(what=_first_line(orig)), False
        return None
    psycopg = sys.modules.get("psycopg")
    if psycopg is not None and isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        return _refused_for_good(orig) or ("retry", f"the connection broke: {_first_line(orig)}", True)
    return None


def server_full(exc: BaseException) -> bool:
    """True when `exc` (or one of its causes) is PostgreSQL refusing a login because the connection slots
    it may use are all taken (53300: the server's, or a role's or a database's CONNECTION LIMIT): one
    frees as a session ends. libpq passes no SQLSTATE for it; the server's words tell it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        orig = current.orig if isinstance(current, sa.exc.DBAPIError) else current
        said = str(orig)
        if getattr(orig, "sqlstate", None) == "53300" or any(words in said for words in _SERVER_FULL):
            return True
        current = current.__cause__ or current.__context__
    return False


def _refused_for_good(orig: BaseException) -> tuple[Kind, str, bool] | None:
    """A connection the server or libpq refuses whatever the timing: told at once, not retried."""
    database = missing_database(orig)
    if database is not None:
        return (
            "fail",
            f'the server has no database "{database}": create it (createdb {shlex.quote(database)}) or name '
            "an existing one in the URL; the event log creates tables, never databases",
            True,
        )
    refused = refused_option_value(str(orig))
    if refused is not None:
        option, said = refused
        where = "set in the URL or by a PG... environment variable"
        return "refused", f"libpq refuses the value of its option {option} ({said}), {where}", True
    words = refused_for_good(orig)
    if words is not None:
        return "fail", f"the server refuses this login ({words}): fix the URL's user or password", True
    return None


def _describe(exc: BaseException) -> str:
    return _first_line(exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None else exc)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Backoff:
    """Jittered exponential backoff until a deadline: `wait()` sleeps and returns True while time is left."""

    def __init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.attempts = 0

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def wait(self) -> bool:
        pause = _WAITS.wait(self.attempts)
        self.attempts += 1
        if time.monotonic() + pause >= self.deadline:
            return False
        time.sleep(pause)
        return True
