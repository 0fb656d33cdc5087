"""`open_store`: one call from a URL to a store."""

from __future__ import annotations

from ._errors import ConfigError
from ._memory import MemoryStore
from ._sql import SQLStore
from ._store import Store

__all__ = ["open_store"]


def open_store(url: str = "sqlite:///bide.db", *, table_prefix: str = "bide_") -> Store:
    """Open the store at `url`.

    - ``sqlite:///path/to/file.db``: durable, one machine (the default, ``bide.db`` in the working directory).
    - ``postgresql://user@host/db``: durable, many processes and machines (uses the psycopg driver).
    - ``memory://``: NOT durable, for tests and development; a crash loses everything in it.

    `table_prefix` names the SQL tables (``<prefix>records``, ``<prefix>runs``).
    """
    if not isinstance(url, str) or not url:
        raise ConfigError("open_store needs a URL such as sqlite:///bide.db, postgresql://... or memory://")
    if url.startswith("memory:"):
        return MemoryStore(url)
    return SQLStore(url, table_prefix=table_prefix)
