"""A store closed while drives and requests still use it: every request is answered (served, or refused
as closed, saying what to do), close() never waits for a batch in flight, no connection is opened again
after it, and a run whose drive it stopped resumes from its journal without firing a side effect twice.

Nothing here waits on a guess of how long something takes: the tests act on events the code under test
sets, and their bounds (60 s) are only there so that a hang fails instead of stalling the suite."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conftest import PG_URL

import bide
from bide._sql import SQLStore
from bide.testing import ScriptedModel, call, reply

BOUND = 60.0  # seconds: only ever reached by a hang


def _serve_threads_done() -> None:
    """Wait for the threads that finish a store's close after close() returned."""
    for thread in threading.enumerate():
        if thread.name.startswith("bide-store-close"):
            thread.join(BOUND)


class _WindowQueue:
    """The store's request queue, with a pause before a put from the thread named `racer` when the store's
    lock is not held: the window between the store's closed check and its put, in which close() runs."""

    def __init__(self, store: SQLStore, real: Any) -> None:
        self.store, self.real = store, real
        self.reached = threading.Event()  # the racer is at its put
        self.closed = threading.Event()  # the test's close() returned

    def put(self, item: Any) -> None:
        if threading.current_thread().name == "racer":
            self.reached.set()
            if not self.store._lock.locked():
                self.closed.wait(BOUND)
        self.real.put(item)

    def get(self, *args: Any) -> Any:
        return self.real.get(*args)

    def get_nowait(self) -> Any:
        return self.real.get_nowait()


def test_a_request_racing_close_is_answered_never_left_waiting(durable_store_spec: tuple[str, str]) -> None:
    """A request that passed the closed check as close() ran is served or refused: before, its put landed
    after the store's thread had stopped, and its caller waited for ever."""
    url, prefix = durable_store_spec
    store = SQLStore(url, table_prefix=prefix)
    store.insert_many("r", [("a", b"1")])  # the store's thread runs
    window = _WindowQueue(store, store._queue)
    store._queue = window  # type: ignore[assignment]
    answers: list[object] = []

    def racer() -> None:
        try:
            answers.append(store.get("r", "a"))
        except bide.StoreError as exc:
            answers.append(exc)

    thread = threading.Thread(target=racer, name="racer", daemon=True)
    thread.start()
    assert window.reached.wait(BOUND)
    store.close()
    window.closed.set()
    thread.join(BOUND)
    assert not thread.is_alive(), "a request that raced close() was never answered"
    [answer] = answers
    assert isinstance(answer, bide.Entry) or "is closed" in str(answer)


@pytest.fixture
def lock_held_elsewhere(
    durable_store_spec: tuple[str, str],
) -> Iterator[Callable[[SQLStore], Callable[[], None]]]:
    """`hold(store)` takes, on a connection of its own, the lock a write to run "r" of `store` waits for
    (SQLite: the database's write lock; PostgreSQL: the run's row), and returns what lets it go."""
    url, _ = durable_store_spec
    releases: list[Callable[[], None]] = []

    def hold(store: SQLStore) -> Callable[[], None]:
        if url.startswith("sqlite"):
            holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")

            def release_sqlite() -> None:
                holder.execute("ROLLBACK")
                holder.close()

            releases.append(release_sqlite)
            return release_sqlite
        engine = sa.create_engine(url)
        raw = engine.raw_connection()
        cur = raw.cursor()
        cur.execute(f"SELECT 1 FROM {store.table_prefix}runs WHERE run_id = 'r' FOR UPDATE")

        def release_pg() -> None:
            raw.rollback()
            raw.close()
            engine.dispose()

        releases.append(release_pg)
        return release_pg

    yield hold
    for release in releases:
        try:
            release()
        except Exception:
            continue


def test_close_does_not_wait_for_a_write_waiting_for_a_lock(
    durable_store_spec: tuple[str, str], lock_held_elsewhere: Callable[[SQLStore], Callable[[], None]]
) -> None:
    """close() returns while a write accepted before it waits for a lock held elsewhere (before, it waited
    with it, up to the busy timeout, holding up an event loop that called it); the write is answered when
    the lock is let go, and the store is released after it."""
    url, prefix = durable_store_spec
    store = SQLStore(url, table_prefix=prefix, busy_timeout=4 * BOUND)
    store.insert_many("r", [("a", b"1")])
    release = lock_held_elsewhere(store)
    real = store._transaction
    started = threading.Event()

    def transaction(batch: list[Any], raw: Any, **options: Any) -> list[Any]:
        if any(req.op == "insert" for req in batch):
            started.set()
        return real(batch, raw, **options)

    store._transaction = transaction  # type: ignore[method-assign]
    answers: list[object] = []

    def write() -> None:
        try:
            answers.append(store.insert_many("r", [("b", b"2")]))
        except bide.StoreError as exc:
            answers.append(exc)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert started.wait(BOUND)  # the store's thread has the write in hand: it waits for the lock
    closer = threading.Thread(target=store.close, daemon=True)
    closer.start()
    closer.join(BOUND)
    try:
        assert not closer.is_alive(), "close() waited for a write waiting for a lock"
        assert writer.is_alive()  # still waiting: close() did not cut it short
        with pytest.raises(bide.StoreError, match="is closed"):
            store.get("r", "a")  # later requests are refused at once
    finally:
        release()
    writer.join(BOUND)
    assert not writer.is_alive()
    [written] = answers
    assert isinstance(written, list) and [(e.key, e.inserted) for e in written] == [("b", True)]
    closer.join(BOUND)
    _serve_threads_done()
    assert store._thread is not None and not store._thread.is_alive()
    again = bide.open_store(url, table_prefix=prefix)
    try:
        assert [e.key for e in again.load("r")] == ["a", "b"]
    finally:
        again.close()


def test_a_write_asked_before_close_and_flushed_after_it_is_refused(tmp_path: Path) -> None:
    """SQLite, async: a write asked for before close() but run after it (the loop's batch runs once the
    caller yields) is refused, and no connection is opened again for it: before, it reopened the loop's
    connection, which nobody closed, and committed into the closed store."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = SQLStore(url)

    async def go() -> None:
        await store.ainsert_many("r", [("a", b"1")])
        asked = store.ainsert_many("r", [("b", b"2")])
        store.close()
        with pytest.raises(bide.StoreError, match=r"is closed .*nothing was written.*bide\.open_store"):
            await asked

    asyncio.run(go())
    assert store._slots and all(slot.raw is None for _, slot in store._slots)
    again = bide.open_store(url)
    try:
        assert [e.key for e in again.load("r")] == ["a"]
    finally:
        again.close()


def test_a_close_from_another_thread_in_the_middle_of_a_loop_batch_leaves_no_connection_open(
    tmp_path: Path,
) -> None:
    """SQLite, async: close() from another thread while the loop's batch is in its transaction (a write
    hook holds it there). The batch, asked for before the close, finishes on its connection (closing that
    under a statement crashes the process), which its own thread closes right after; nothing is written
    after. Before, the batch was run again on a new connection that nobody closed."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = SQLStore(url)
    inside, closed = threading.Event(), threading.Event()

    def hook(txn: Any, written: Any) -> None:
        if "r2" in written:
            inside.set()
            closed.wait(BOUND)

    def close_when_inside() -> None:
        inside.wait(BOUND)
        store.close()
        closed.set()

    async def go() -> list[Any]:
        await store.ainsert_many("r1", [("a", b"1")])
        store.add_write_hook(hook)
        closer = threading.Thread(target=close_when_inside, daemon=True)
        closer.start()
        answers = await asyncio.gather(
            store.ainsert_many("r1", [("b", b"2")]),
            store.ainsert_many("r2", [("c", b"3")]),
            return_exceptions=True,
        )
        await asyncio.to_thread(closer.join, BOUND)
        return answers

    answers = asyncio.run(go())
    assert inside.is_set() and closed.is_set()
    for answer in answers:
        assert isinstance(answer, list) and answer[0].inserted, answer
    assert store._slots and all(slot.raw is None for _, slot in store._slots)

    async def after_the_close() -> Any:
        return await store.ainsert_many("r1", [("d", b"4")])

    with pytest.raises(bide.StoreError, match="is closed"):
        asyncio.run(after_the_close())
    again = bide.open_store(url)
    try:
        assert [e.key for e in again.load("r1")] == ["a", "b"]
        assert [e.key for e in again.load("r2")] == ["c"]
    finally:
        again.close()


# -- drives --------------------------------------------------------------------------------------------------


def _charging_agent(
    store: bide.Store, where: str, fired: list[int], *, gated: bool = True
) -> tuple[bide.Agent[str], threading.Event, threading.Event]:
    """An agent whose model calls `charge` once then answers. `gated`, it stops where the test closes the
    store (`where`: "model", the second model turn; "async tool" or "sync tool", inside the charge) until
    the returned `go` is set; `entered` says it got there."""
    entered, go = threading.Event(), threading.Event()
    gate = {"on": gated}

    async def await_go() -> None:
        entered.set()
        await asyncio.to_thread(go.wait, BOUND)

    if where == "sync tool":

        @bide.tool
        def charge(amount: int) -> str:
            """Charge (a side effect)."""
            fired.append(amount)
            if gate["on"]:
                entered.set()
                go.wait(BOUND)
            return "charged"

    else:

        @bide.tool(name="charge")
        async def async_charge(amount: int) -> str:
            """Charge (a side effect)."""
            fired.append(amount)
            if gate["on"] and where == "async tool":
                await await_go()
            return "charged"

        charge = async_charge

    script = ScriptedModel([call("charge", amount=5), reply("done")])

    class Model:
        name = "gated"

        async def complete(self, request: Any) -> Any:
            turns = sum(1 for m in request.messages if m.role == "assistant")
            if where == "model" and turns == 1 and gate["on"]:
                await await_go()
            return await script.complete(request)

    agent: bide.Agent[str] = bide.Agent(Model(), store=store, tools=[charge])
    return agent, entered, go


@pytest.mark.parametrize("where", ["model", "async tool", "sync tool"])
def test_a_drive_whose_store_is_closed_under_it_says_so_and_resumes_once_opened_again(
    durable_store_spec: tuple[str, str], where: str
) -> None:
    """Closed in a model turn or inside a side effect, the drive ends in a StoreError that says the store
    is closed and what to do (open it again and run the run again); run again on the store opened again,
    the run completes, the side effect having fired once."""
    url, prefix = durable_store_spec
    store = bide.open_store(url, table_prefix=prefix)
    fired: list[int] = []
    agent, entered, go = _charging_agent(store, where, fired)

    async def first() -> BaseException:
        drive = asyncio.ensure_future(agent.run("r", "charge 5"))
        assert await asyncio.to_thread(entered.wait, BOUND)
        store.close()
        go.set()
        try:
            await asyncio.wait_for(drive, BOUND)
        except bide.StoreError as exc:
            return exc
        raise AssertionError("the drive went on under a closed store")

    failure = asyncio.run(first())
    said = str(failure)
    assert "is closed (its close() was called)" in said and "bide.open_store" in said
    if where != "model":
        assert "ran and returned" in said  # the effect's outcome is named, not lost
    _serve_threads_done()
    again = bide.open_store(url, table_prefix=prefix)
    try:
        resumed, _, _ = _charging_agent(again, where, fired, gated=False)
        result = asyncio.run(resumed.run("r", "charge 5"))
        assert result.status == "completed" and result.answer == "done"
        assert fired == [5]
    finally:
        again.close()


_CLOSER = """
import asyncio, sys, threading
import bide
from bide.testing import ScriptedModel, call, reply

url, prefix, effects = sys.argv[1:4]
entered, go = threading.Event(), threading.Event()

@bide.tool
def charge(amount: int) -> str:
    '''Charge (a side effect).'''
    with open(effects, "a") as f:
        f.write("charged\\n")
    entered.set()
    go.wait(60)
    return "charged"

async def main():
    store = bide.open_store(url, table_prefix=prefix)
    agent = bide.Agent(ScriptedModel([call("charge", amount=5), reply("done")]), store=store, tools=[charge],
                       lease_ttl=1.0)
    drive = asyncio.ensure_future(agent.run("r", "charge 5"))
    await asyncio.to_thread(entered.wait, 60)
    store.close()
    go.set()
    try:
        await drive
    except bide.StoreError as exc:
        print("refused:", exc)

asyncio.run(main())
"""


def test_a_process_that_closed_its_store_under_a_side_effect_leaves_it_halted_not_fired_again(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """Another process closed its store while a side effect ran and ended: its marker has no result, so the
    run, driven here, halts with OutcomeUnknown (the effect fired once) instead of firing it again."""
    url, prefix = durable_store_spec
    effects = tmp_path / "effects"
    done = subprocess.run(
        [sys.executable, "-c", _CLOSER, url, prefix, str(effects)],
        capture_output=True,
        text=True,
        timeout=4 * BOUND,
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "is closed" in done.stdout
    store = bide.open_store(url, table_prefix=prefix)
    calls: list[int] = []

    @bide.tool
    def charge(amount: int) -> str:
        """Charge (a side effect)."""
        calls.append(amount)
        return "charged"

    agent = bide.Agent(
        ScriptedModel([call("charge", amount=5), reply("done")]),
        store=store,
        tools=[charge],
        lease_wait=BOUND,  # the closing process's lease was not freed: it expires (lease_ttl 1 s)
    )
    try:
        with pytest.raises(bide.OutcomeUnknown):
            asyncio.run(agent.run("r", "charge 5"))
        assert calls == [] and effects.read_text().splitlines() == ["charged"]
    finally:
        store.close()


@pytest.mark.postgres
def test_a_closed_stores_messages_and_threads_show_no_password(pg_prefix: str) -> None:
    """The refusal of a closed store, its repr and its thread's name show the URL without its password
    (the server trusts the test's connections: the password is only carried)."""
    secret = f"pw{uuid.uuid4().hex[:8]}"
    url = PG_URL.replace("postgres@", f"postgres:{secret}@", 1)
    assert secret in url
    store = SQLStore(url, table_prefix=pg_prefix)
    try:
        store.insert_many("r", [("a", b"1")])
        names = [t.name for t in threading.enumerate() if t.name.startswith("bide-store")]
        assert names and not any(secret in name for name in names)
        assert secret not in repr(store)
    finally:
        store.close()
    with pytest.raises(bide.StoreError, match="is closed") as refused:
        store.get("r", "a")
    assert secret not in str(refused.value)



@pytest.mark.parametrize(
    "url",
    [
        "postgresql+asyncpg://u:{secret}@127.0.0.1/test",
        "postgresql+psycopg2://u:{secret}@127.0.0.1/test",
        "mysql://u:{secret}@db.example/test",
    ],
)
def test_a_refused_store_url_shows_no_password(url: str) -> None:
    secret = f"pw{uuid.uuid4().hex[:8]}"
    for opening in (bide.open_store, SQLStore):
        with pytest.raises(bide.ConfigError) as refused:
            opening(url.format(secret=secret))
        assert secret not in str(refused.value) and "***" in str(refused.value)


# Threads each drive runs with run_sync on one SQLite store (a web server's request threads) while the main
# thread closes it: each thread's own connection was closed under a statement it was running, and sqlite3
# crashes the process then (SIGSEGV) instead of raising.
_CLOSED_UNDER_THREADS = """
import sys, tempfile, threading, time
import bide
from bide.testing import ScriptedModel, call, reply

async def charge_card(customer: str, cents: int) -> str:
    '''Charge a card.'''
    return "charged"

store = bide.open_store(f"sqlite:///{tempfile.mkdtemp()}/s.db")
model = ScriptedModel([call("charge_card", customer="alice", cents=500), reply("done")], record=False)
agent = bide.Agent(model, store=store, tools=[bide.Tool.from_function(charge_card)])
started = threading.Barrier(9)
ran = [0] * 8

def serve(w: int) -> None:
    started.wait()
    while True:
        try:
            agent.run_sync(f"t{w}-{ran[w]}", "go")
        except bide.StoreError as exc:
            assert "is closed" in str(exc), exc
            return
        ran[w] += 1

threads = [threading.Thread(target=serve, args=(w,)) for w in range(8)]
for t in threads:
    t.start()
started.wait()
while sum(ran) < int(sys.argv[1]):
    time.sleep(0.001)
store.close()
for t in threads:
    t.join()
print("closed after", sum(ran), "runs")
"""


def test_closing_a_sqlite_store_under_threads_running_drives_does_not_crash_the_process(
    tmp_path: Path,
) -> None:
    script = tmp_path / "close_under_threads.py"
    script.write_text(_CLOSED_UNDER_THREADS)
    for after in (5, 20, 40, 80, 120, 160, 200, 300):
        done = subprocess.run(
            [sys.executable, str(script), str(after)], capture_output=True, text=True, timeout=BOUND
        )
        assert done.returncode == 0, (after, done.returncode, done.stderr[-2000:])
        assert "closed after" in done.stdout


# close() from an atexit handler while the store's thread waits for a lock held elsewhere: the interpreter
# has joined its threads already, so a thread started to wait for the answer was never waited for (3.11: the
# write was never answered) or could not be started (3.12: RuntimeError).
_CLOSED_AT_EXIT = """
import atexit, sqlite3, sys, threading, time
import bide
from bide._sql import SQLStore

path = sys.argv[1]
store = SQLStore(f"sqlite:///{path}", busy_timeout=2)
store.insert_many("r", [("a", b"1")])
holder = sqlite3.connect(path, isolation_level=None)
holder.execute("BEGIN IMMEDIATE")  # the write lock, held elsewhere
waiting = threading.Event()

def say(line: str) -> None:
    sys.stdout.write(line + "\\n")  # one write: the two threads' lines never mix
    sys.stdout.flush()

def request() -> None:
    waiting.set()
    try:
        store.insert_many("r", [("b", b"2")])
        say("request answered: written")
    except bide.StoreError as exc:
        say(f"request answered: {exc}")

asking = threading.Thread(target=request, daemon=True)
asking.start()
waiting.wait()
while store._queued == store._served:  # until the store's thread has the write in hand
    time.sleep(0.01)

def shutdown() -> None:
    store.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("bide-store")]
    say(f"close() returned, store threads left: {left}")
    asking.join(10)

atexit.register(shutdown)
"""


def test_a_close_at_exit_waits_for_the_answer_of_a_write_in_hand(tmp_path: Path) -> None:
    script = tmp_path / "close_at_exit.py"
    script.write_text(_CLOSED_AT_EXIT)
    command = [sys.executable, str(script), str(tmp_path / "bide.db")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0, done.stderr[-2000:]
    said = {line.split(":")[0]: line for line in done.stdout.splitlines()}
    assert said.keys() == {"request answered", "close() returned, store threads left"}, done.stdout
    assert said["close() returned, store threads left"].endswith(": []"), done.stdout  # it waited
    assert "wrote nothing" in said["request answered"], done.stdout


# The main thread has returned and a thread it left running (not a daemon) closes the store while a write
# waits for a lock held elsewhere, then releases that lock: close() must not wait (it took the main thread's
# end for the interpreter's, and waited out the busy timeout: the write then failed instead of committing).
_CLOSED_AFTER_MAIN_RETURNED = """
import sqlite3, sys, threading, time
import bide
from bide._sql import SQLStore

path = sys.argv[1]
store = SQLStore(f"sqlite:///{path}", busy_timeout=30)
store.insert_many("r", [("a", b"1")])
holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
holder.execute("BEGIN IMMEDIATE")  # the write lock, held elsewhere

def request() -> None:
    try:
        store.insert_many("r", [("b", b"2")])
        sys.stdout.write("request: written\\n")
    except bide.StoreError as exc:
        sys.stdout.write(f"request: {exc}\\n")
    sys.stdout.flush()

asking = threading.Thread(target=request)

def shutdown() -> None:
    threading.main_thread().join()
    while store._queued == store._served:  # until the store's thread has the write in hand
        time.sleep(0.01)
    store.close()
    holder.execute("COMMIT")  # only once close() returned
    asking.join()

asking.start()
threading.Thread(target=shutdown).start()
"""

# A write hook that closes the store, on a write an atexit handler makes: close() ran in the store's own
# thread and joined itself (RuntimeError).
_CLOSED_BY_A_HOOK_AT_EXIT = """
import atexit, sys
from bide._sql import SQLStore

store = SQLStore(f"sqlite:///{sys.argv[1]}")
store.insert_many("r", [("a", b"1")])

def hook(txn: object, written: object) -> None:
    try:
        store.close()
    except Exception as exc:
        sys.stdout.write(f"close() raised {exc!r}\\n")

store.add_write_hook(hook)

def last_write() -> None:
    store.insert_many("r", [("b", b"2")])
    sys.stdout.write("written\\n")

atexit.register(last_write)
"""


@pytest.mark.parametrize(
    ("script", "said"),
    [(_CLOSED_AFTER_MAIN_RETURNED, "request: written"), (_CLOSED_BY_A_HOOK_AT_EXIT, "written")],
    ids=["main-thread-returned", "hook-at-exit"],
)
def test_a_close_while_the_interpreter_winds_down_neither_waits_nor_fails(
    script: str, said: str, tmp_path: Path
) -> None:
    path = tmp_path / "script.py"
    path.write_text(script)
    command = [sys.executable, str(path), str(tmp_path / "bide.db")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BOUND)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    assert done.stdout.splitlines() == [said], done.stdout
