"""Where a store lives: the one parser of the URLs `bide.open_store` and `govern.EventLog` accept.

Accepted, the same for both:

- ``bide.db``, ``data/bide.db``, ``/var/lib/bide.db``: a SQLite file (a plain path, relative to the working
  directory or absolute);
- ``sqlite:///bide.db`` (relative) and ``sqlite:////var/lib/bide.db`` (absolute): the same, as URLs;
- ``postgresql://user@host/db`` (also ``postgres://`` and ``postgresql+psycopg://``): PostgreSQL through
  the psycopg driver (``pip install 'bide[postgres]'``);
- ``memory://`` (and ``memory://NAME``): held by this process only, gone when it exits.

Everything else is refused with `StoreURLError` and a hint: ``sqlite:/bide.db`` and ``sqlite://bide.db``
(one or two slashes: it is not clear whether an absolute path was meant) get "did you mean
sqlite:///bide.db?", ``memory`` gets "did you mean memory://?", a PostgreSQL URL without psycopg installed
gets the pip command, an unknown scheme the list above.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Literal

from ._errors import StoreURLError

__all__ = ["StoreURL", "StoreURLError", "parse_store_url", "without_password"]

_FORMS = "a file path (bide.db), sqlite:///path, postgresql://user@host/db, or memory://"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PASSWORD = re.compile(r"^([^/]*//[^/@:]*):[^/@]*@")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL. `url` is the canonical form (``sqlite:///path``, the PostgreSQL URL as given,
    ``memory://NAME``); `sqlalchemy_url` is what SQLAlchemy opens (psycopg named for PostgreSQL); `path` is
    the SQLite file and `name` the memory space (empty for a private one)."""

    kind: Literal["sqlite", "postgresql", "memory"]
    url: str
    sqlalchemy_url: str = ""
    path: str = ""
    name: str = ""


def _sqlite(path: str, what: str) -> StoreURL:
    if path in ("", ":memory:"):
        raise StoreURLError(f"a SQLite {what} needs a file path, such as sqlite:///bide.db; for one that "
                            "lives in this process only, use memory://")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise StoreURLError(f"the directory {directory!r} of the SQLite {what} {path!r} does not exist; "
                            "create it first")
    url = "sqlite:///" + path
    return StoreURL("sqlite", url, sqlalchemy_url=url, path=path)


def _require_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise StoreURLError(
            "a postgresql:// URL needs the psycopg driver, which is not installed: "
            "pip install 'bide[postgres]'"
        ) from exc


def parse_store_url(url: object, *, what: str = "store") -> StoreURL:
    """Parse a store (or event log: `what`) URL in any of the forms in the module docstring; raise
    `StoreURLError` with a hint otherwise. A SQLite file's directory must exist; the file need not."""
    if not isinstance(url, str) or not url.strip():
        raise StoreURLError(f"a {what} URL is required: {_FORMS}")
    if "\x00" in url:
        raise StoreURLError(f"a {what} URL cannot contain a NUL character")
    if url in ("memory", "memory:", ":memory:", "memory:/"):
        raise StoreURLError(f"{url!r} is not a {what} URL; did you mean memory:// ?")
    match = _SCHEME.match(url)
    if match is None or len(match.group(1)) == 1:  # no scheme, or a Windows drive letter: a plain path
        return _sqlite(url, what)
    scheme = match.group(1).lower()
    rest = url[match.end():]
    if scheme == "memory":
        if not rest.startswith("//"):
            raise StoreURLError(f"{url!r} is not a {what} URL; did you mean memory://{rest.lstrip('/')} ?")
        return StoreURL("memory", url, name=rest[2:])
    if scheme in ("sqlite", "sqlite+pysqlite"):
        if rest.startswith("///"):
            return _sqlite(rest[3:], what)
        bare = rest.lstrip("/")
        if not bare:
            return _sqlite("", what)
        raise StoreURLError(
            f"{url!r} is not a SQLite URL: did you mean sqlite:///{bare} (relative to the working "
            f"directory) or sqlite:////{bare} (absolute)? A plain path ({bare}) works too"
        )
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        if not rest.startswith("//"):
            raise StoreURLError(f"{url!r} is not a PostgreSQL URL; write postgresql://user@host/dbname")
        _require_psycopg()
        return StoreURL("postgresql", url, sqlalchemy_url="postgresql+psycopg:" + rest)
    if scheme.startswith("postgresql+"):
        raise StoreURLError(f"{url!r}: bide talks to PostgreSQL through psycopg only; write postgresql://...")
    raise StoreURLError(f"unsupported {what} URL scheme {scheme!r} in {url!r}: use {_FORMS}")


def without_password(url: str) -> str:
    """`url` with its password, if any, shown as ``***``: for messages, which end up on terminals and in
    logs."""
    return _PASSWORD.sub(r"\1:***@", url)
