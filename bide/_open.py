"""`open_store`: one call from a URL to a store."""

from __future__ import annotations

from ._memory import MemoryStore
from ._sql import SQLStore
from ._store import Store
from ._url import parse_store_url

__all__ = ["open_store"]


def open_store(url: str = "sqlite:///bide.db", *, table_prefix: str = "bide_", create: bool = True) -> Store:
    """Open the store at `url`.

    - ``bide.db`` or ``sqlite:///path/to/file.db``: durable, one machine (the default, ``bide.db`` in the
      working directory). The file is created if missing; its directory must exist.
    - ``postgresql://user@host/db``: durable, many processes and machines (needs the psycopg driver:
      ``pip install 'bide[postgres]'``).
    - ``memory://``: NOT durable, for tests and development; a crash loses everything in it.

    `govern.EventLog` accepts the same forms. Anything else raises `bide.StoreURLError` (a `ConfigError`)
    saying what to write instead, before anything is created. `table_prefix` names the SQL tables
    (``<prefix>records``, ``<prefix>runs``); they are created when missing. With `create=False` a store must
    be there already: a missing SQLite file or a database without those tables raise `bide.StoreNotFound`,
    and nothing is created or changed (a ``memory://`` store is always there). A PostgreSQL database that
    does not exist raises `bide.StoreNotFound` with `create=True` too: bide creates tables, never databases.
    """
    where = parse_store_url(url)
    if where.kind == "memory":
        return MemoryStore(where.url)
    return SQLStore(where.url, table_prefix=table_prefix, create=create)
