"""The event log's tables and its format marker: which database layout a log is, checked on every open.

A database holding event logs carries one row in ``govern_format``: the format name
(``govern-event-log``) and the layout version, which is per database kind (`LAYOUTS`). Opening a log
checks it:

- no govern tables yet: the tables and the marker are created (a SQLite file must also hold no other
  application's tables: an event log does not move into someone else's database);
- the marker names this layout: nothing to do (one indexed read);
- an older layout: upgraded in place, in one transaction, under a lock that serializes every opener;
  layout 1 (the unmarked tables of earlier versions) gains the columns for the machine's event names and
  the writer of each event (layout 2); on SQLite, layout 2 becomes layout 3 (below);
- a newer layout, or another format name: refused with `LogFormatError`, nothing touched.

Layout 3 (SQLite) keeps each event in its primary key's B-tree (a WITHOUT ROWID table), and keeps no
copy of what the events' indexes already tell in one lookup each: a log's length (its highest position
+ 1) and the next producer and record numbers (their highest + 1). An append then writes the event's
row and its three index entries alone: about half the pages a layout 2 append committed (the rowid
table and its primary key index, the log's row, two counter rows). ``govern_logs.length`` and
``govern_counters`` stay in the file, unused. PostgreSQL stays at layout 2, which keeps them: there an
extra row costs a commit little, and an older govern can still share the database.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .._errors import GovernError

FORMAT_NAME = "govern-event-log"
#: The layout this version writes, per database kind (see the module docstring).
LAYOUTS = {"sqlite": 3, "postgresql": 2}
NAME_MAX = 200

metadata = sa.MetaData()

format_table = sa.Table(
    "govern_format",
    metadata,
    sa.Column("format", sa.String(NAME_MAX), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
)

logs = sa.Table(
    "govern_logs",
    metadata,
    sa.Column("name", sa.String(NAME_MAX), primary_key=True),
    sa.Column("machine", sa.String(NAME_MAX), nullable=False),
    sa.Column("length", sa.BigInteger, nullable=False),
    # The machine's event names, JSON; NULL for a log bound by layout 1, which did not record them.
    sa.Column("events", sa.Text, nullable=True),
)

events = sa.Table(
    "govern_events",
    metadata,
    sa.Column("log", sa.String(NAME_MAX), primary_key=True),
    sa.Column("position", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("event_id", sa.String(NAME_MAX), nullable=False),
    sa.Column("machine", sa.String(NAME_MAX), nullable=False),
    sa.Column("record", sa.String(NAME_MAX), nullable=False),
    sa.Column("record_seq", sa.BigInteger, nullable=False),
    sa.Column("event", sa.String(NAME_MAX), nullable=False),
    sa.Column("producer", sa.String(NAME_MAX), nullable=False),
    sa.Column("producer_seq", sa.BigInteger, nullable=False),
    sa.Column("deps", sa.Text, nullable=False),
    sa.Column("after", sa.Text, nullable=False),
    # A random token of the append call that wrote the event: a retry after an unacknowledged commit
    # reads it back to tell "my commit landed" from "someone else's". NULL for layout 1 rows.
    sa.Column("writer", sa.String(32), nullable=True),
    sa.UniqueConstraint("log", "event_id", name="govern_events_id"),
    sa.UniqueConstraint("log", "record", "record_seq", name="govern_events_record"),
    sa.UniqueConstraint("log", "producer", "producer_seq", name="govern_events_producer"),
    sqlite_with_rowid=False,  # layout 3: the row is stored in its (log, position) key's B-tree
)

# The next producer_seq / record_seq per key, kept with the events in the same transaction on PostgreSQL:
# reading MAX(...) per key would scan every earlier event of the key on some planners. SQLite reads
# MAX(...) from the events' indexes (one lookup each) and leaves this table empty (layout 3).
counters = sa.Table(
    "govern_counters",
    metadata,
    sa.Column("log", sa.String(NAME_MAX), primary_key=True),
    sa.Column("kind", sa.String(1), primary_key=True),
    sa.Column("key", sa.String(NAME_MAX), primary_key=True),
    sa.Column("next", sa.BigInteger, nullable=False),
)

_GOVERN_TABLES = {t.name for t in metadata.sorted_tables}
# Layout 1 already had every table but the marker: without one of them a log is damaged, not old.
_LAYOUT_1_TABLES = _GOVERN_TABLES - {"govern_format"}
# Any constant: every opener of a PostgreSQL database takes this transaction-scoped advisory lock
# while it creates or upgrades the tables, so two processes never race on DDL.
_PG_SCHEMA_LOCK = 0x676F7665726E  # "govern"


class LogFormatError(GovernError):
    """The database is not an event log this version can use: another application's database, another
    format, or a layout written by a newer govern. Nothing was changed; point the log at its own
    database, or upgrade govern."""


def read_marker(conn: Connection, where: str) -> tuple[str, int] | None:
    """The format marker, or None when the database has no marker table (or an empty one)."""
    if "govern_format" not in set(sa.inspect(conn).get_table_names()):
        return None
    return _marker_row(conn, where)


def _marker_row(conn: Connection, where: str) -> tuple[str, int] | None:
    """The marker's row, or None when the table is empty; `LogFormatError` when its version is not an
    integer (an edited marker: no govern wrote it), or when the table has not the marker's columns (another
    program's table of that name)."""
    try:
        row = conn.execute(sa.select(format_table.c.format, format_table.c.version)).first()
    except sa.exc.DBAPIError as exc:
        orig = exc.orig
        missing_column = getattr(orig, "sqlstate", None) == "42703" or str(orig).startswith("no such column")
        if not missing_column:
            raise
        raise LogFormatError(
            f"{where} holds a table govern_format without the format marker's columns: it is another "
            "program's; use a new database (nothing was changed)"
        ) from exc
    if row is None:
        return None
    if type(row.version) is not int:
        raise LogFormatError(
            f"{where} holds a format marker whose version is {row.version!r}, not an integer: it was edited "
            "or is another program's; restore it from a backup or use a new database (nothing was changed)"
        )
    return str(row.format), row.version


def check_open(conn: Connection, where: str, dialect: str) -> bool:
    """What opening a log checks, in one catalog query and one indexed read: True when the marker names
    this layout of `dialect` and every table of that layout is there; False when the schema needs
    creating or upgrading; raises `LogFormatError` for another format, a newer layout, or a marker
    beside only some of the tables (nothing is changed)."""
    tables = set(sa.inspect(conn).get_table_names())
    marker = _marker_row(conn, where) if "govern_format" in tables else None
    if not check_marker(marker, where, dialect):
        return False
    missing = sorted(_GOVERN_TABLES - tables)
    if missing:
        raise LogFormatError(
            f"{where} holds only some of the event log's tables (the format marker is there, "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not): it is damaged or another "
            "program's; restore it from a backup or use a new database (nothing was changed)"
        )
    return True


def check_marker(marker: tuple[str, int] | None, where: str, dialect: str) -> bool:
    """True when the marker names this layout of `dialect`; False when the schema needs creating or
    upgrading; raises `LogFormatError` for another format or a newer layout."""
    layout = LAYOUTS[dialect]
    if marker is None:
        return False
    name, version = marker
    if name != FORMAT_NAME:
        raise LogFormatError(
            f"{where} holds a govern_format table for format {name!r}, not {FORMAT_NAME!r}: it is not an "
            "event log; open the log in a database of its own"
        )
    if version > layout:
        raise LogFormatError(
            f"{where} holds an event log of layout {version}, written by a newer govern; this version "
            f"reads layouts up to {layout}: upgrade govern (nothing was changed)"
        )
    return version == layout


def prepare(conn: Connection, dialect: str, where: str) -> None:
    """Create or upgrade the schema inside the caller's transaction (see the module docstring). On
    SQLite the caller's BEGIN IMMEDIATE serializes openers; on PostgreSQL an advisory lock does."""
    if dialect == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK)))
    marker = read_marker(conn, where)
    if check_marker(marker, where, dialect):
        return  # another opener prepared it while this one waited for the lock
    tables = set(sa.inspect(conn).get_table_names())
    ours = tables & _GOVERN_TABLES
    if dialect == "sqlite":
        foreign = sorted(t for t in tables - _GOVERN_TABLES if not t.startswith("sqlite_"))
        if foreign and not ours:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            raise LogFormatError(
                f"{where} is another application's database (it holds the tables {shown}) and no event "
                "log: give the event log a file of its own (nothing was changed)"
            )
    missing = sorted(_LAYOUT_1_TABLES - ours)
    if ours and missing:
        raise LogFormatError(
            f"{where} holds only some of the event log's tables ({', '.join(sorted(ours))}; "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not there): it is damaged or "
            "another program's; restore it from a backup or use a new database (nothing was changed)"
        )
    if ours:
        _upgrade_from_layout_1(conn)
        if dialect == "sqlite" and (marker is None or marker[1] < 3):
            _upgrade_sqlite_to_layout_3(conn)
    metadata.create_all(conn, checkfirst=True)
    conn.execute(sa.delete(format_table))
    conn.execute(sa.insert(format_table).values(format=FORMAT_NAME, version=LAYOUTS[dialect]))


def _upgrade_from_layout_1(conn: Connection) -> None:
    """Layout 1 → 2: add the columns layout 2 reads (existing rows keep NULL: unknown)."""
    inspector = sa.inspect(conn)
    if "events" not in {c["name"] for c in inspector.get_columns("govern_logs")}:
        conn.exec_driver_sql("ALTER TABLE govern_logs ADD COLUMN events TEXT")
    if "writer" not in {c["name"] for c in inspector.get_columns("govern_events")}:
        conn.exec_driver_sql("ALTER TABLE govern_events ADD COLUMN writer VARCHAR(32)")


def _upgrade_sqlite_to_layout_3(conn: Connection) -> None:
    """Layout 2 → 3 on SQLite: the events move, in position order, into a WITHOUT ROWID table of the
    same columns, constraints and name; the counters, derived from the events from now on, are emptied
    (a stale counter must never be read again)."""
    columns = ", ".join(f'"{c.name}"' for c in events.columns)
    conn.exec_driver_sql("ALTER TABLE govern_events RENAME TO govern_events_layout_2")
    events.create(conn)
    conn.exec_driver_sql(
        f'INSERT INTO govern_events ({columns}) SELECT {columns} FROM govern_events_layout_2 '
        'ORDER BY "log", "position"'
    )
    conn.exec_driver_sql("DROP TABLE govern_events_layout_2")
    conn.execute(sa.delete(counters))
