"""A side effect's result that could not be journaled (the store locked past its busy timeout, down, or
full) is not thrown away: the drive's StoreError says the call ran and what it returned, and the next drive
of the run in the same process journals that result instead of halting with OutcomeUnknown. Another process
(here: a simulated restart) knows nothing of it and halts, as it must.

Before: the result was lost as soon as its one write failed, and the next drive halted for a person on a
call this process had seen return.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import bide
from bide._inflight import forget_claims
from bide.testing import ScriptedModel, Turn, call, reply


class Locker:
    """Another connection to the store's file that holds its write lock while the test says so."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def lock(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def unlock(self) -> None:
        self.conn.execute("COMMIT")


def _agent(
    store: bide.Store,
    locker: Locker,
    fired: list[str],
    *,
    max_parallel: int = 1,
    lease_ttl: float = 1,
    lease_wait: float = 10,
) -> bide.Agent:
    @bide.tool
    def charge(card: str) -> str:
        """Charge a card."""
        fired.append(card)
        if len(fired) == 1:
            locker.lock()  # the result's write now waits, then fails
        return f"charged {card}"

    @bide.tool
    def notify(who: str) -> str:
        """Tell someone."""
        fired.append(who)
        return f"told {who}"

    both = Turn(calls=(*call("charge", card="c1").calls, *call("notify", who="ann").calls))
    model = ScriptedModel([both if max_parallel > 1 else call("charge", card="c1"), reply("done")])
    # The failed drive could not free its lease either (the store was locked): a drive in another process
    # waits it out; the next drive in this one frees it.
    return bide.Agent(
        model,
        store=store,
        tools=[charge, notify],
        max_parallel=max_parallel,
        lease_ttl=lease_ttl,
        lease_wait=lease_wait,
    )


@pytest.mark.parametrize(
    "next_store", ["the same store object", "the store opened again", "the store opened by a relative path"]
)
@pytest.mark.parametrize("max_parallel", [1, 2])
def test_a_result_that_could_not_be_written_is_written_by_the_next_drive(
    tmp_path: Path, max_parallel: int, next_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bide.db"
    store = first = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    locker = Locker(path)
    fired: list[str] = []
    try:
        with pytest.raises(bide.StoreError, match=r"ran and returned \"charged c1\"") as failed:
            _agent(store, locker, fired, max_parallel=max_parallel, lease_ttl=60).run_sync("r1", "pay")
        assert "run the run again here" in str(failed.value)
        locker.unlock()
        if next_store == "the store opened again":  # what a program does after a store failure
            store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
        elif next_store == "the store opened by a relative path":  # the same file, spelled otherwise
            monkeypatch.chdir(tmp_path)
            store = bide.SQLStore("sqlite:///bide.db", busy_timeout=0.2)
        # At once, as the message says: the failed drive's lease, which the locked store kept it from
        # freeing, was RunInFlight ("another driver") for up to lease_ttl.
        again = _agent(store, locker, fired, max_parallel=max_parallel, lease_ttl=60, lease_wait=0)
        done = again.run_sync("r1", "pay")
        assert done.output == "done"
        assert fired.count("c1") == 1
        [result] = [e for e in store.load("r1") if b'"tool_result"' in e.data and b"charge" in e.data]
        assert b"charged c1" in result.data and b'"reconciled":false' in result.data.replace(b" ", b"")
    finally:
        locker.conn.close()
        store.close()
        first.close()


@pytest.fixture
def unjournaled(tmp_path: Path) -> Iterator[tuple[bide.SQLStore, Locker, list[str]]]:
    """A store whose run r1 charged c1 and could not journal the result (the file stayed locked), unlocked
    again; with the locker and the list of charges."""
    path = tmp_path / "bide.db"
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    locker = Locker(path)
    fired: list[str] = []
    try:
        with pytest.raises(bide.StoreError, match="ran and returned"):
            _agent(store, locker, fired).run_sync("r1", "pay")
        locker.unlock()
        yield store, locker, fired
    finally:
        locker.conn.close()
        store.close()


def test_another_process_halts_on_the_call_as_before(
    unjournaled: tuple[bide.SQLStore, Locker, list[str]],
) -> None:
    store, locker, fired = unjournaled
    forget_claims()  # what a restarted process knows of this one's calls: nothing
    with pytest.raises(bide.OutcomeUnknown):
        _agent(store, locker, fired).run_sync("r1", "pay")
    assert fired == ["c1"]


def test_the_same_run_id_in_another_store_does_not_drop_the_kept_result(tmp_path: Path) -> None:
    """The kept results were keyed by run and call id: a run of the same id completing in another store of
    the process dropped this one's, and its next drive halted. They are kept by the attempt's claim."""
    first, other = tmp_path / "a.db", tmp_path / "b.db"
    store = bide.SQLStore(f"sqlite:///{first}", busy_timeout=0.2)
    elsewhere = bide.SQLStore(f"sqlite:///{other}", busy_timeout=0.2)
    locker, idle = Locker(first), Locker(other)
    fired: list[str] = []
    try:
        with pytest.raises(bide.StoreError, match="ran and returned"):
            _agent(store, locker, fired).run_sync("r1", "pay")
        assert _agent(elsewhere, idle, fired).run_sync("r1", "pay").output == "done"
        locker.unlock()
        assert _agent(store, locker, fired).run_sync("r1", "pay").output == "done"
        assert fired == ["c1", "c1"]  # once in each store
    finally:
        locker.conn.close()
        idle.conn.close()
        store.close()
        elsewhere.close()


def test_a_person_cannot_resolve_a_kept_call_as_not_started(
    unjournaled: tuple[bide.SQLStore, Locker, list[str]],
) -> None:
    """In the process that saw the call return, resolving it as not started was accepted, and the next drive
    fired the effect again."""
    store, locker, fired = unjournaled
    time.sleep(2.5)  # past the drive's lease (1 s) and the clock-skew margin (1 s)
    with pytest.raises(bide.ResolveRefused, match="ran in this process and returned"):
        bide.resolve_halt(store, "r1", "c0.0", outcome=bide.Outcome.not_started())
    assert _agent(store, locker, fired).run_sync("r1", "pay").output == "done"
    assert fired == ["c1"]


def test_a_call_past_its_deadline_whose_late_result_cannot_be_written_is_kept(tmp_path: Path) -> None:
    """A synchronous call that ran past its timeout returned while the store was locked: the thread that
    journals late results dropped it without a word, and the next drive halted on a call this process had
    seen return ("crashed")."""
    path = tmp_path / "bide.db"
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    locker = Locker(path)
    fired: list[str] = []
    returned = threading.Event()

    @bide.tool(timeout=0.3)
    def slow(card: str) -> str:
        """Charge slowly."""
        fired.append(card)
        time.sleep(0.8)
        locker.lock()
        returned.set()
        return f"charged {card}"

    def agent() -> bide.Agent:
        model = ScriptedModel([call("slow", card="c1"), reply("done")])
        return bide.Agent(model, store=store, tools=[slow], lease_ttl=1, lease_wait=10)

    try:
        with pytest.raises(bide.OutcomeUnknown, match="still running past its"):
            agent().run_sync("r1", "pay")
        assert returned.wait(10)
        time.sleep(0.5)  # the late write waits out the busy timeout, then fails
        locker.unlock()
        assert agent().run_sync("r1", "pay").output == "done"
        assert fired == ["c1"]
        [result] = [e for e in store.load("r1") if e.key == "result:c0.0"]
        assert b"charged c1" in result.data
    finally:
        locker.conn.close()
        store.close()


def test_a_drive_of_the_same_run_id_on_another_database_leaves_the_unfreed_lease_alone(
    tmp_path: Path,
) -> None:
    """The lease a failed drive could not free was remembered by run id alone: a drive of the same run id
    on another database (a store per tenant) took it, freed nothing there, and the next drive on the first
    database met RunInFlight for lease_ttl."""
    path = tmp_path / "a.db"
    store = bide.SQLStore(f"sqlite:///{path}", busy_timeout=0.2)
    other = bide.open_store(f"sqlite:///{tmp_path / 'b.db'}")
    locker = Locker(path)
    fired: list[str] = []
    try:
        with pytest.raises(bide.StoreError, match="run the run again here"):
            _agent(store, locker, fired, lease_ttl=60).run_sync("r1", "pay")
        locker.unlock()
        done_there = bide.Agent(ScriptedModel([reply("elsewhere")]), store=other).run_sync("r1", "hi")
        assert done_there.answer == "elsewhere"
        done = _agent(store, locker, fired, lease_ttl=60, lease_wait=0).run_sync("r1", "pay")
        assert done.output == "done" and fired.count("c1") == 1
    finally:
        locker.conn.close()
        store.close()
        other.close()
