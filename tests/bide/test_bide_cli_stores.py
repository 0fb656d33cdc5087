"""`bide` and `bide-audit` pointed at a store that is not there, or at a URL that names no place, through
subprocesses (docs/cli.md):

- a command that needs a store holding runs (every one but `bide worker` and `keygen`) answers "no bide
  store at ..." with exit 4 and leaves the SQLite file, or the PostgreSQL database, exactly as it was: no
  file, no table, no WAL is created;
- a malformed PostgreSQL URL is a usage error (exit 2, the message names what is wrong) for `bide`, `bide
  worker` and `bide-audit export` alike, and so is an option value libpq refuses (``?sslmode=bogus``),
  where a well-formed URL of a server that does not answer is "the store failed" (exit 6);
- a database the server does not have is "no bide store" (exit 4) for them all, `bide worker` included:
  bide creates tables, never databases.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import PG_URL, drop_prefix

import bide
from bide._url import parse_store_url
from bide.audit._keys import generate_key

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = {"bide": "bide._cli", "bide-audit": "bide.audit._cli"}

# Every `bide` command that needs runs to read or a run to write to; the key file is made by `key_file`.
NEEDS_A_STORE: list[tuple[str, ...]] = [
    ("runs",),
    ("runs", "--json"),
    ("show", "r"),
    ("pending",),
    ("resolve", "r", "c0.0", "--not-started"),
    ("cancel", "r"),
    ("approve", "r", "c0.0", "--key", "approver.key"),
    ("deny", "r", "c0.0", "--key", "approver.key"),
]


# An app that imports: `bide worker` imports its --app before it opens the store (a mistyped one is a usage
# error that leaves the store alone), so a store's errors show only behind one.
APP = "ops_app:build"


def run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = [str(REPO), str(REPO / "tests" / "bide"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("BIDE_STORE", None)
    command = [sys.executable, "-m", PROGRAMS[prog], *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def run_all(prog: str, calls: list[tuple[str, ...]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """`run` for each of `calls`, two at once (they do not depend on each other)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: run(prog, *args, cwd=cwd), calls))


def files(directory: Path) -> dict[str, bytes]:
    """Every file in `directory`, by name, with its bytes: what a command must leave as it found it."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    generate_key(str(tmp_path / "approver.key"))
    return tmp_path / "approver.key"


@pytest.mark.parametrize("database", ["absent", "empty file", "another schema"])
def test_a_command_needing_a_store_creates_none_in_a_sqlite_file(
    database: str, tmp_path: Path, key_file: Path
) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "bide.db"
    if database == "empty file":
        path.touch()
    elif database == "another schema":
        with sqlite3.connect(path) as other:
            other.execute("CREATE TABLE notes (body TEXT)")
            other.execute("INSERT INTO notes VALUES ('keep me')")
        other.close()
    before = files(folder)
    store = f"sqlite:///{path}"
    calls = [(*args, "--store", store) for args in NEEDS_A_STORE]
    for args, done in zip(calls, run_all("bide", calls, cwd=tmp_path), strict=True):
        assert done.returncode == 4, (args, done.stderr)
        assert "no bide store at" in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert files(folder) == before, args
    key = str(key_file)
    exported = run("bide-audit", "export", "--store", store, "--run", "r", "--key", key, "-o", "out.json",
                   cwd=tmp_path)  # fmt: skip
    assert exported.returncode == 4, exported.stdout + exported.stderr
    assert "no bide store at" in exported.stdout + exported.stderr
    assert files(folder) == before
    assert not (tmp_path / "out.json").exists()


def _tables_with_prefix(url: str, prefix: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return [name for name in sa.inspect(engine).get_table_names() if name.startswith(prefix)]
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_command_needing_a_store_creates_no_postgresql_table(tmp_path: Path, key_file: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    calls = [(*args, "--store", PG_URL, "--table-prefix", prefix) for args in NEEDS_A_STORE]
    for args, done in zip(calls, run_all("bide", calls, cwd=tmp_path), strict=True):
        assert done.returncode == 4, (args, done.stderr)
        assert "no bide store at" in done.stderr and prefix in done.stderr, (args, done.stderr)
        assert "--table-prefix" in done.stderr, (args, done.stderr)  # the prefix may be the cause here
    assert _tables_with_prefix(PG_URL, prefix) == []


def test_open_store_without_create_opens_only_a_store_that_is_there(
    durable_store_spec: tuple[str, str],
) -> None:
    url, prefix = durable_store_spec
    with pytest.raises(bide.StoreNotFound):
        bide.open_store(url, table_prefix=prefix, create=False)
    if url.startswith("sqlite:///"):
        assert not Path(url.removeprefix("sqlite:///")).exists()
    else:
        assert _tables_with_prefix(url, prefix) == []
    made = bide.open_store(url, table_prefix=prefix)
    made.insert_many("r", [("k", b"{}")])
    made.close()
    there = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        assert [entry.key for entry in there.load("r")] == ["k"]
    finally:
        there.close()


MALFORMED = [
    ("postgresql://user@host:notaport/db", "notaport"),
    ("postgresql+psycopg://@:99999999/x", "99999999"),
    ("postgresql://user@ho st/db", "ho st"),
    ("postgresql://user@%%%/db", "%%%"),
    ("postgresql://user@host/db?nonsense=1", "nonsense"),
    ("postgres://user:secret@host:5432,other:5433/db", "5432,other:5433"),
    ("postgresql://user@host:notaport/db?password=secret", "notaport"),  # libpq takes one there too
]


@pytest.mark.parametrize(("url", "named"), MALFORMED)
def test_a_malformed_postgresql_url_is_a_usage_error_everywhere(
    url: str, named: str, tmp_path: Path, key_file: Path
) -> None:
    key = str(key_file)
    runs, worker, cancel = run_all(
        "bide",
        [("runs", "--store", url), ("worker", "--store", url, "--app", APP, "--once"),
         ("cancel", "r", "--store", url)],
        cwd=tmp_path,
    )  # fmt: skip
    exported = run("bide-audit", "export", "--store", url, "--run", "r", "--key", key, "-o", "x.json",
                   cwd=tmp_path)  # fmt: skip
    for done in (runs, worker, cancel, exported):
        said = done.stdout + done.stderr
        assert done.returncode == 2, (done.args, said)
        assert "PostgreSQL URL" in said and named in said, (done.args, said)
        assert "secret" not in said  # the password is not repeated on a terminal or in a log
        assert "Traceback" not in said


def test_a_well_formed_url_of_a_server_that_does_not_answer_is_a_store_failure(
    tmp_path: Path, key_file: Path
) -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    runs, worker = run_all(
        "bide", [("runs", "--store", url), ("worker", "--store", url, "--app", APP, "--once")],
        cwd=tmp_path,
    )  # fmt: skip
    key = str(key_file)
    exported = run("bide-audit", "export", "--store", url, "--run", "r", "--key", key, "-o", "x.json",
                   cwd=tmp_path)  # fmt: skip
    for done in (runs, worker, exported):
        said = done.stdout + done.stderr
        assert done.returncode == 6, (done.args, said)
        assert "Connection refused" in said and "sqlalche.me" not in said and "\\x0a" not in said, said


@pytest.mark.postgres
def test_a_login_the_server_refuses_is_a_store_failure_that_says_what_to_fix(
    tmp_path: Path, key_file: Path
) -> None:
    in_authority = _pg_url(username="bide_absent_role", password="secret")
    in_query = _pg_url(username="bide_absent_role", query={"password": "secret"})  # libpq takes one there too
    done_all = [*_every_command(in_authority, "bide_", key_file, tmp_path)]
    for done in [*done_all, *_every_command(in_query, "bide_", key_file, tmp_path)]:
        said = done.stdout + done.stderr
        assert done.returncode == 6, (done.args, said)
        assert 'role "bide_absent_role" does not exist' in said and "fix the user or password" in said, said
        assert "secret" not in said and "sqlalche.me" not in said and "Traceback" not in said, said


def _pg_url(**parts: Any) -> str:
    """PG_URL with `parts` (database, password, port, query) replaced, the password written out."""
    return sa.make_url(PG_URL).set(**parts).render_as_string(hide_password=False)


def _databases() -> set[str]:
    engine = sa.create_engine(PG_URL)
    try:
        with engine.connect() as conn:
            return set(conn.exec_driver_sql("SELECT datname FROM pg_database").scalars())
    finally:
        engine.dispose()


def _every_command(url: str, prefix: str, key: Path, cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """`bide runs`, `show`, `worker --once` and `cancel`, and `bide-audit export`, on the store at `url`."""
    store = ("--store", url, "--table-prefix", prefix)
    calls = [("runs", *store), ("show", "r", *store), ("worker", "--app", APP, "--once", *store),
             ("cancel", "r", *store)]  # fmt: skip
    exported = run("bide-audit", "export", "--store", url, "--run", "r", "--key", str(key), "-o", "x.json",
                   cwd=cwd)  # fmt: skip
    return [*run_all("bide", calls, cwd), exported]


@pytest.mark.postgres
def test_a_postgresql_database_that_does_not_exist_is_not_found_everywhere(
    tmp_path: Path, key_file: Path
) -> None:
    name = f"bide_absent_{uuid.uuid4().hex[:10]}"
    url = _pg_url(database=name, password="secret")
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    for done in _every_command(url, prefix, key_file, tmp_path):
        said = done.stdout + done.stderr
        assert done.returncode == 4, (done.args, said)
        assert f'database "{name}" does not exist' in said and f"createdb {name}" in said, (done.args, said)
        assert "never databases" in said and "--table-prefix" not in said  # the prefix is not the cause
        assert "secret" not in said and "***" in said
        assert "Traceback" not in said
    assert name not in _databases()
    assert not (tmp_path / "x.json").exists()


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("option", "value"),
    [("sslmode", "bogus"), ("connect_timeout", "abc"), ("target_session_attrs", "nonsense"),
     ("keepalives", "often")],
)  # fmt: skip
def test_an_option_value_libpq_refuses_is_a_usage_error_everywhere(
    option: str, value: str, tmp_path: Path, key_file: Path
) -> None:
    url = _pg_url(password="secret", query={option: value})
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    for done in _every_command(url, prefix, key_file, tmp_path):
        said = done.stdout + done.stderr
        assert done.returncode == 2, (done.args, said)
        assert "not a usable PostgreSQL URL" in said and option in said and value in said, (done.args, said)
        assert "secret" not in said
        assert "Traceback" not in said
    assert _tables_with_prefix(PG_URL, prefix) == []
    assert not (tmp_path / "x.json").exists()
    # Refused before any connection: a server that is not there makes no difference.
    nowhere = run("bide", "runs", "--store", _pg_url(port=1, query={option: value}), cwd=tmp_path)
    assert nowhere.returncode == 2, nowhere.stderr


@pytest.mark.postgres
def test_open_store_refuses_a_missing_database_and_a_refused_option_value_even_with_create() -> None:
    with pytest.raises(bide.StoreNotFound, match="does not exist"):
        bide.open_store(_pg_url(database=f"bide_absent_{uuid.uuid4().hex[:10]}"), create=True)
    with pytest.raises(bide.StoreURLError, match="sslmode"):
        bide.open_store(_pg_url(query={"sslmode": "bogus"}), create=True)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://postgres@127.0.0.1:5432/test",
        "postgres://user:p%40ss@db.example.com/app",
        "postgresql+psycopg://user@[::1]:5432/app",
        "postgresql:///app?host=/var/run/postgresql",
        "postgresql://user@db_1.internal/app?sslmode=require&connect_timeout=5",
        "postgresql://user@/app?host=h1,h2&port=5432,5433",
    ],
)
def test_well_formed_postgresql_urls_are_accepted_without_connecting(url: str) -> None:
    assert parse_store_url(url).kind == "postgresql"


def _waits_on_a_lock(application: str) -> bool:
    """Whether a session of `application` waits for a lock now (asked on a fresh connection: a session's
    view of pg_stat_activity is kept for its transaction)."""
    engine = sa.create_engine(PG_URL)
    sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %(a)s AND wait_event_type = 'Lock'"
    try:
        with engine.connect() as conn:
            waiting = conn.exec_driver_sql(sql, {"a": application}).scalar_one()
    finally:
        engine.dispose()
    return bool(waiting)


@pytest.mark.postgres
@pytest.mark.parametrize("command", [("runs",), ("show", "r"), ("pending",), ("cancel", "r")])
def test_ctrl_c_stops_a_command_whose_read_waits_on_a_lock_at_once(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Another session holds a lock on the records table: the command's read waits for it (up to the store's
    busy timeout, 30 s). Ctrl-C stops the command at once, exit 130, and `bide cancel` sent nothing: the read
    it gave up on is cancelled instead of being waited for when the store closes. The Ctrl-C comes once the
    server shows the command's session waiting for the lock (a fixed wait could end, on a loaded machine,
    before the command had even started)."""
    import signal
    import time

    from bide._records import CANCEL_KEY
    from bide.testing import ScriptedModel, call, reply

    prefix = f"i{uuid.uuid4().hex[:10]}_"
    store = bide.open_store(PG_URL, table_prefix=prefix)
    try:
        model = ScriptedModel([call("wait", seconds=3600), reply("later")])
        with pytest.raises(bide.RunSleeping):  # an open run: a cancel request would be recorded
            bide.Agent(model, store=store, tools=[bide.timer()]).run_sync("r", "go")
        locking = sa.create_engine(PG_URL)
        locker = locking.connect()
        transaction = locker.begin()
        locker.exec_driver_sql(f"LOCK TABLE {prefix}records IN ACCESS EXCLUSIVE MODE")
        application = f"bide-cli-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        args = [*command, "--store", PG_URL, "--table-prefix", prefix]
        child = subprocess.Popen(
            [sys.executable, "-m", "bide._cli", *args], env={**env, "PGAPPNAME": application}, cwd=tmp_path,
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            give_up = time.monotonic() + 60
            while not _waits_on_a_lock(application):  # started, and waiting for the lock
                assert child.poll() is None, child.communicate()
                assert time.monotonic() < give_up, "the command never waited for the lock"
                time.sleep(0.05)
            assert child.poll() is None
            child.send_signal(signal.SIGINT)
            started = time.monotonic()
            _, errors = child.communicate(timeout=25)
            took = time.monotonic() - started
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            transaction.rollback()
            locker.close()
            locking.dispose()  # (closed, the connection went back to the engine's pool: still a session)
        assert child.returncode == 130, errors
        assert took < 5, f"{took:.1f} s from Ctrl-C to exit"
        assert CANCEL_KEY not in [e.key for e in store.load("r")]
        assert bide.run_status(store, "r").status == "sleeping"
    finally:
        store.close()
        drop_prefix(PG_URL, prefix)


def test_with_json_a_failed_command_prints_one_json_document_saying_why(tmp_path: Path) -> None:
    """`--json` output is for programs on every exit (docs/cli.md): a command that fails prints one JSON
    document on stdout (`exit_code`, `reason`, `message`) beside its message for people on stderr, and
    without `--json` nothing on stdout."""
    bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}").close()
    cases = [
        (("runs", "--store", f"sqlite:///{tmp_path / 'missing.db'}", "--json"), 4, "not found"),
        (("show", "--store", f"sqlite:///{tmp_path / 'runs.db'}", "nope", "--json"), 4, "not found"),
        (("pending", "--store", "memory://", "--json"), 2, "usage error"),
        (("runs", "--store", "postgresql://postgres@127.0.0.1:1/x", "--json"), 6, "store failed"),
    ]
    outcomes = run_all("bide", [args for args, _, _ in cases], tmp_path)
    for (args, code, reason), done in zip(cases, outcomes, strict=True):
        assert done.returncode == code, (args, done.stderr)
        document = json.loads(done.stdout)
        assert (document["exit_code"], document["reason"]) == (code, reason)
        assert done.stderr == f"bide: {document['message']}\n"
    plain = run("bide", "show", "--store", f"sqlite:///{tmp_path / 'runs.db'}", "nope", cwd=tmp_path)
    assert (plain.returncode, plain.stdout) == (4, "")
