"""Dropping the PostgreSQL tables a test made under a table prefix of its own (the server's tables are
shared by every test and every run)."""

from __future__ import annotations

import sqlalchemy as sa


def drop_prefixed_tables(database: str | sa.engine.Engine, prefix: str) -> None:
    """Drop every table whose name starts with `prefix`, through `database` (an engine, kept open, or a
    URL, through an engine of its own that is disposed afterwards)."""
    engine = sa.create_engine(database) if isinstance(database, str) else database
    try:
        with engine.begin() as conn:
            for name in sa.inspect(conn).get_table_names():
                if name.startswith(prefix):
                    conn.exec_driver_sql(f'DROP TABLE "{name}"')
    finally:
        if isinstance(database, str):
            engine.dispose()
