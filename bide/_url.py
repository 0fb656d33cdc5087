"""Where a store lives: the one parser of the URLs `bide.open_store` and `govern.EventLog` accept.

Accepted, the same for both:

- ``bide.db``, ``data/bide.db``, ``/var/lib/bide.db``: a SQLite file (a plain path, relative to the working
  directory or absolute);
- ``sqlite:///bide.db`` (relative) and ``sqlite:////var/lib/bide.db`` (absolute): the same, as URLs
  (percent-decoded, as SQLAlchemy reads them: ``sqlite:///my%20data.db`` is the file ``my data.db``; a
  query such as ``?timeout=30`` is refused: the store sets its own busy timeout);
- ``postgresql://user@host/db`` (also ``postgres://`` and ``postgresql+psycopg://``): PostgreSQL through
  the psycopg driver (``pip install 'bide[postgres]'``);
- ``memory://`` (and ``memory://NAME``): held by this process only, gone when it exits.

Everything else is refused with `StoreURLError` and a hint: ``sqlite:/bide.db`` and ``sqlite://bide.db``
(one or two slashes: it is not clear whether an absolute path was meant) get "did you mean
sqlite:///bide.db?", ``memory`` gets "did you mean memory://?", a PostgreSQL URL without psycopg installed
gets the pip command, an unknown scheme the list above. A PostgreSQL URL that no server could be asked for
(a port that is not a port number, a host that is not a host name, an option libpq does not know, a
connect_timeout psycopg cannot read) is refused here too, before any connection is tried: a typo is the
caller's to fix, not a store failure. libpq checks the values of its other options (``sslmode``,
``target_session_attrs``, ...) only when it starts connecting, before it connects to the server;
`refused_option` turns that refusal into the same `StoreURLError`.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from ._dbfile import unenterable_directory
from ._errors import StoreURLError

__all__ = [
    "StoreURL",
    "StoreURLError",
    "libpq_bounds",
    "missing_database",
    "parse_store_url",
    "refused_for_good",
    "refused_option",
    "refused_option_value",
    "without_password",
]

_FORMS = "a file path (bide.db), sqlite:///path, postgresql://user@host/db, or memory://"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_PASSWORD = re.compile(r"^([^/]*//[^/@:]*):[^/@]*@")
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password)=[^&#]*", re.IGNORECASE)
_HOST_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# C0 and C1 control characters, and the byte order mark a file read as text may start with.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ufeff]")
_POSTGRESQL_FORM = "write postgresql://user:password@host:5432/dbname"
_LIBPQ_OPTIONS = "https://www.postgresql.org/docs/current/libpq-connect.html#LIBPQ-PARAMKEYWORDS"
# The server's messages for a login it refuses for good (auth.c), besides a role that does not exist.
_REFUSED_FOR_GOOD = (
    "password authentication failed for user",
    "no pg_hba.conf entry for",
    "pg_hba.conf rejects",
)
# libpq's messages for an option value it refuses (fe-connect.c): 'invalid sslmode value: "bogus"', and
# 'invalid integer value "abc" for connection option "keepalives"'.
_LIBPQ_REFUSED = re.compile(
    r'invalid (?P<option>\w+) value: "[^"\n]*"'
    r'|invalid integer value "[^"\n]*" for connection option "(?P<integer>\w+)"'
)


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL. `url` is the canonical form (``sqlite:///path``, the PostgreSQL URL as given,
    ``memory://NAME``); `sqlalchemy_url` is what SQLAlchemy opens (psycopg named for PostgreSQL); `path` is
    the SQLite file the store opens (percent-decoded: the file to guard against being overwritten) and `name`
    the memory space (empty for a private one)."""

    kind: Literal["sqlite", "postgresql", "memory"]
    url: str
    sqlalchemy_url: str = ""
    path: str = ""
    name: str = ""


def _sqlite(path: str, what: str) -> StoreURL:
    """The SQLite store at the file `path`, exactly as given (no percent-decoding, no query)."""
    if path in ("", ":memory:"):
        raise StoreURLError(f"a SQLite {what} needs a file path, such as sqlite:///bide.db; for one that "
                            "lives in this process only, use memory://")
    directory = os.path.dirname(os.path.abspath(path))
    # A directory on the way that this user may not enter hides the rest, which may well exist: the store
    # says so when it is opened (bide._dbfile.out_of_reach), rather than "does not exist; create it".
    if not os.path.isdir(directory) and unenterable_directory(path) is None:
        raise StoreURLError(f"the directory {directory!r} of the SQLite {what} {path!r} does not exist; "
                            "create it first")
    # SQLAlchemy percent-decodes the path of a URL and reads what follows a "?" as options: the two
    # characters are encoded so that the URL opens the very file `path` names (the file the CLIs guard).
    url = "sqlite:///" + path.replace("%", "%25").replace("?", "%3F")
    return StoreURL("sqlite", url, sqlalchemy_url=url, path=path)


def _sqlite_url(url: str, rest: str, what: str) -> StoreURL:
    """The SQLite store of a ``sqlite:///`` URL: its path percent-decoded, as SQLAlchemy opens it. A query
    is refused: none of SQLite's options changes what the store does except for the worse (its busy
    timeout and pragmas are set per connection, overriding ``?timeout=``; ``?uri=true&mode=memory`` and
    the like would open another database than the file named)."""
    path, question, query = rest.partition("?")
    if question:
        raise StoreURLError(
            f"{url!r}: a SQLite {what} URL takes no options (?{query}); remove them (the {what} sets its "
            f"own busy timeout). A file whose name has a '?' in it: write it as %3F, or give the plain path"
        )
    decoded = unquote(path)
    if "\x00" in decoded:
        raise StoreURLError(f"{url!r}: the file name has a NUL byte (%00), which no file name can hold")
    return _sqlite(decoded, what)


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
        raise StoreURLError(f"{_article(what)} {what} URL is required: {_FORMS}")
    if "\x00" in url:
        raise StoreURLError(f"{_article(what)} {what} URL cannot contain a NUL character")
    if url != url.strip() or _CONTROL.search(url):
        # Read from a file or a variable with its line break, such a URL would open another file than
        # the one meant ('bide.db\n'), or send the server another name: two processes, two stores.
        file_hint = (
            ""
            if url.lstrip().lower().startswith("postgres")
            else ". A file whose name has one: write it percent-encoded in a sqlite:/// URL (%20 for a space)"
        )
        raise StoreURLError(
            f"{without_password(url)!r} is not {_article(what)} {what} URL: it begins or ends with white "
            f"space or holds a control character (a line break, a tab); remove it{file_hint}"
        )
    if url in ("memory", "memory:", ":memory:", "memory:/"):
        raise StoreURLError(f"{url!r} is not {_article(what)} {what} URL; did you mean memory:// ?")
    match = _SCHEME.match(url)
    if match is None or len(match.group(1)) == 1:  # no scheme, or a Windows drive letter: a plain path
        return _sqlite(url, what)
    scheme = match.group(1).lower()
    rest = url[match.end():]
    if scheme == "memory":
        if not rest.startswith("//"):
            raise StoreURLError(
                f"{url!r} is not {_article(what)} {what} URL; did you mean memory://{rest.lstrip('/')} ?"
            )
        return StoreURL("memory", url, name=rest[2:])
    if scheme in ("sqlite", "sqlite+pysqlite"):
        if rest.startswith("///"):
            return _sqlite_url(url, rest[3:], what)
        bare = rest.lstrip("/")
        if not bare:
            return _sqlite("", what)
        raise StoreURLError(
            f"{url!r} is not a SQLite URL: did you mean sqlite:///{bare} (relative to the working "
            f"directory) or sqlite:////{bare} (absolute)? A plain path ({bare}) works too"
        )
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        if not rest.startswith("//"):
            raise StoreURLError(
                f"{without_password(url)!r} is not a PostgreSQL URL; write postgresql://user@host/dbname"
            )
        if "\x00" in unquote(rest):
            # libpq ends each name at a NUL: 'db%00x' opened database 'db', 'postgres%00x@' logged in as
            # 'postgres'. Another store than the one meant, as a file name cut short would be.
            raise StoreURLError(
                f"{without_password(url)!r}: a PostgreSQL URL cannot hold %00 (a NUL byte), which would cut "
                "a name short and open another database, user or option than the one written"
            )
        sqlalchemy_url = "postgresql+psycopg:" + rest
        _check_authority(url, sqlalchemy_url)  # a typo first: installing the driver would not fix it
        _require_psycopg()
        _check_postgresql(url, sqlalchemy_url)
        return StoreURL("postgresql", url, sqlalchemy_url=sqlalchemy_url)
    if scheme.startswith("postgresql+"):
        raise StoreURLError(
            f"{without_password(url)!r}: bide talks to PostgreSQL through psycopg only; write postgresql://..."
        )
    shown = without_password(url)
    raise StoreURLError(f"unsupported {what} URL scheme {scheme!r} in {shown!r}: use {_FORMS}")


def without_password(url: str) -> str:
    """`url` with its password, if any, shown as ``***``: for messages, which end up on terminals and in
    logs. Both places libpq takes one from: the authority (``user:***@``) and the query (``password=***``,
    ``sslpassword=***``)."""
    return _QUERY_PASSWORD.sub(r"\1=***", _PASSWORD.sub(r"\1:***@", url))


def _check_authority(url: str, sqlalchemy_url: str) -> None:
    """Refuse a PostgreSQL URL whose port (before the path) is not a port number, or that puts several
    hosts there; read as text, without the driver."""
    shown = without_password(url)
    # The port is checked before SQLAlchemy reads it: its own complaint is int()'s.
    authority = sqlalchemy_url.split("//", 1)[1].split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    _, colon, port = (authority.rpartition("]")[2] if authority.startswith("[") else authority).partition(":")
    if colon and "," in authority:
        raise StoreURLError(
            f"{shown!r} is not a usable PostgreSQL URL: several hosts go in the query, not before the "
            "path: write postgresql://user@/dbname?host=host1:5432&host=host2:5432"
        )
    if colon:
        _check_port(shown, port)


def _check_postgresql(url: str, sqlalchemy_url: str) -> None:
    """Refuse a PostgreSQL URL that names no server or no database: the options SQLAlchemy would hand
    psycopg must be a connection string libpq reads, with port numbers for ports, host names, IP addresses
    or socket directories for hosts, a connect_timeout psycopg reads, and a database (named in the URL, or
    by PGDATABASE or a libpq service). Nothing is connected to."""
    from psycopg import Error as PsycopgError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    shown = without_password(url)
    try:
        parsed = make_url(sqlalchemy_url)
        _, params = parsed.get_dialect()().create_connect_args(parsed)
        options = conninfo_to_dict(make_conninfo("", **params))
        if "connect_timeout" in options:  # psycopg reads it itself, before libpq sees the URL
            timeout_from_conninfo(options)
    except (ValueError, ArgumentError, PsycopgError) as exc:
        reason = str(exc).strip().replace("\n", " ").replace(sqlalchemy_url, without_password(sqlalchemy_url))
        raise StoreURLError(
            f"{shown!r} is not a usable PostgreSQL URL ({reason}); {_POSTGRESQL_FORM}"
        ) from None
    for each in str(options.get("port", "")).split(","):
        if each:
            _check_port(shown, each)
    for host in str(options.get("host", "")).split(","):
        if host and not _is_host(host):
            raise StoreURLError(
                f"{shown!r} is not a usable PostgreSQL URL: the host {host!r} is not a host name, an IP "
                f"address or a socket directory; {_POSTGRESQL_FORM}"
            )
    dbname = str(options.get("dbname") or "")
    if _CONTROL.search(dbname):  # percent-encoded in the URL (%0A): no database is named so
        raise StoreURLError(
            f"{shown!r} is not a usable PostgreSQL URL: its database name {dbname!r} holds a control "
            f"character; {_POSTGRESQL_FORM}"
        )
    named_elsewhere = options.get("service") or os.environ.get("PGDATABASE") or os.environ.get("PGSERVICE")
    if not dbname and not named_elsewhere:
        # libpq would take the database named like the user: tables made where nobody meant them. (A
        # service, in the URL or PGSERVICE, may name it in the service file: libpq reads that.)
        raise StoreURLError(
            f"{shown!r} names no database (the server would use the one named like the user); "
            f"{_POSTGRESQL_FORM}"
        )


_KEEPALIVE_MAX_S = 32767


def libpq_bounds(given: Collection[str], wait_s: float) -> dict[str, int]:
    """libpq options that bound every wait on the network to about `wait_s` seconds (at least 2): each
    connection attempt (``connect_timeout``), and a request whose network path goes silent while it waits
    for the answer (a dead route, an expired NAT entry: no reset ever comes). For that one, TCP keepalives
    probe a connection silent for half of `wait_s` and give up after three unanswered probes, and
    ``tcp_user_timeout`` gives up on data unacknowledged for `wait_s`: the kernel closes the connection
    after about `wait_s` of silence and the driver reports it lost, which the caller handles like any lost
    connection. A live server's kernel answers the probes however long a statement runs, so nothing alive
    is cut. An option named in the URL (`given`) wins."""
    s = max(2, math.ceil(wait_s))
    bounds = {
        "connect_timeout": s,
        "keepalives": 1,
        # Linux refuses keepalive times over 32,767 s (setsockopt: Invalid argument), and a timeout in
        # milliseconds over a signed 32-bit int: a long busy timeout probes at those limits.
        "keepalives_idle": min(max(1, s // 2), _KEEPALIVE_MAX_S),
        "keepalives_interval": min(max(1, math.ceil(s / 6)), _KEEPALIVE_MAX_S),
        "keepalives_count": 3,
        "tcp_user_timeout": min(s * 1000, 2**31 - 1),
    }
    return {name: value for name, value in bounds.items() if name not in given}


def server_keepalives(wait_s: float, given: str | Collection[str] = ()) -> dict[str, int]:
    """PostgreSQL session settings with which the server finds a client gone silent within about `wait_s`
    seconds (at least 2): its kernel probes a connection idle for half of it and gives up after three
    unanswered probes. A client whose host died or was cut off in the middle of a transaction (between its
    writes and its COMMIT, waiting "active" on ClientRead, where no session timeout applies) would
    otherwise hold its locks until the operating system's keepalive, two hours by default. A live client's
    kernel answers the probes; over a Unix socket the server ignores them. A setting the URL's own
    server `options` (`given`, a string or several) name is left to them."""
    s = max(2, math.ceil(wait_s))
    settings = {
        "tcp_keepalives_idle": min(max(1, s // 2), _KEEPALIVE_MAX_S),
        "tcp_keepalives_interval": min(max(1, math.ceil(s / 6)), _KEEPALIVE_MAX_S),
        "tcp_keepalives_count": 3,
    }
    named = given if isinstance(given, str) else " ".join(given)
    return {name: value for name, value in settings.items() if name not in named}


def refused_option(url: str, options: Collection[str], error: str) -> StoreURLError | None:
    """The `StoreURLError` for a connection that failed because libpq refused the value of one of
    `options`, the options the URL sets; `error` is the connect error's message. None for any other
    failure."""
    refused = refused_option_value(error)
    if refused is None or refused[0] not in options:
        return None
    option, said = refused
    return StoreURLError(
        f"{without_password(url)!r} is not a usable PostgreSQL URL: libpq refuses its option {option} "
        f"({said}); the options and the values they take: {_LIBPQ_OPTIONS}"
    )


def refused_option_value(error: str) -> tuple[str, str] | None:
    """(the option, libpq's words) when `error`, a connect error's message, is libpq refusing the value of
    one of its options (set in the URL, or by an environment variable such as PGSSLMODE); else None."""
    match = _LIBPQ_REFUSED.search(error)
    if match is None:
        return None
    return match["option"] or match["integer"], match.group(0)


def missing_database(error: BaseException | None) -> str | None:
    """The name of the database, when `error` is psycopg's failure to connect because the server has no
    database by that name (SQLSTATE 3D000); else None."""
    pgconn = getattr(error, "pgconn", None)
    if pgconn is None:
        return None
    try:
        name: str = pgconn.db.decode(errors="replace")
    except Exception:  # psycopg's PGconn of a connection already closed has no name to give
        return None
    # psycopg gives no SQLSTATE for an error at connect (libpq keeps the server's fields to itself), so the
    # server's message for the very name asked for stands in for it; a server that answers in another
    # language leaves the failure as it was (a store failure; a retry in govern's event log).
    if getattr(error, "sqlstate", None) == "3D000" or f'database "{name}" does not exist' in str(error):
        return name
    return None


def refused_for_good(error: BaseException | None) -> str | None:
    """The server's words, when `error` is psycopg's failure to connect because the server refuses this
    user for good: no such role, a wrong password, or no pg_hba.conf rule that lets it in (SQLSTATE class
    28); else None. Retrying cannot change these; the URL (or the server's setup) must."""
    if getattr(error, "pgconn", None) is None:
        return None
    text = str(error)
    # As in `missing_database`: the server's English message stands in for the SQLSTATE psycopg hides.
    if not (
        getattr(error, "sqlstate", None) in ("28000", "28P01")
        or re.search(r'role "[^"\n]*" does not exist', text)
        or any(words in text for words in _REFUSED_FOR_GOOD)
    ):
        return None
    fatal = [line.strip() for line in text.splitlines() if "FATAL:" in line]
    return fatal[0] if fatal else text.strip().splitlines()[0]


def _check_port(shown: str, port: str) -> None:
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise StoreURLError(
            f"{shown!r} is not a usable PostgreSQL URL: the port {port!r} is not a port number (1 to 65535); "
            f"{_POSTGRESQL_FORM}"
        )


def _is_host(host: str) -> bool:
    if host.startswith(("/", "@")):  # a Unix socket directory (or, with @, Linux's abstract namespace)
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None
    return True


def _article(noun: str) -> str:
    """The article before `noun`: "an" before a vowel ("an event log"), else "a" ("a store")."""
    return "an" if noun[:1].lower() in "aeiou" else "a"
