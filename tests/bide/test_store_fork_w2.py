"""A child made by os.fork() closes its stores without the parent's finishers: the registry of work a close
waits for (synchronous calls under way, the threads that journal their late outcomes, a deferred close)
is the parent's, and it was copied into the child. There a close waited `HANDOVER_S` (5 s) for a call the
child does not run, or was skipped as already under way when the parent had a close pending, or hung on
the registry's lock when another thread of the parent held it at the fork."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from forked import in_child

import bide
from bide._store import HANDOVER_S, Finishing, close_after_finishers, finish_before_close


def closes(tmp_path: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bide-store-close"]


def test_a_childs_close_does_not_wait_for_a_call_under_way_in_the_parent(tmp_path: Path) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    call = Finishing()  # a synchronous call of the parent's, under way as it forks
    finish_before_close(store, call)

    def child() -> None:
        started = time.monotonic()
        store.close()
        for waiting in closes(tmp_path):  # a deferred close: what the end of the child's process waits for
            waiting.join()
        took = time.monotonic() - started
        assert took < HANDOVER_S / 2, f"the child's close took {took:.1f} s"

    try:
        in_child(child, tmp_path)
    finally:
        call.done()
        store.close()


def test_a_childs_close_is_not_skipped_for_a_close_pending_in_the_parent(tmp_path: Path) -> None:
    store = object()  # any store: the registry knows stores by identity
    release = threading.Event()
    finisher = threading.Thread(target=release.wait, args=(30,))  # a late outcome still to journal
    finisher.start()
    finish_before_close(store, finisher)
    parent_closed: list[str] = []
    close_after_finishers(store, lambda: parent_closed.append("parent"))  # pending: it waits for `finisher`
    assert parent_closed == []

    def child() -> None:
        closed: list[str] = []
        close_after_finishers(store, lambda: closed.append("child"))
        assert closed == ["child"], "the child's close was skipped (the parent's close was pending)"

    try:
        in_child(child, tmp_path)
    finally:
        release.set()
        finisher.join()
    deadline = time.monotonic() + 10
    while parent_closed != ["parent"]:  # the parent's own close still happens, once its finisher is done
        assert time.monotonic() < deadline, parent_closed
        time.sleep(0.01)


def test_a_child_forked_while_another_thread_held_the_registry_closes_its_store(tmp_path: Path) -> None:
    from bide import _store

    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with _store._FINISHERS_LOCK:  # as finish_before_close does, for a moment, in a drive's thread
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)

    def child() -> None:
        store.close()  # hung for ever on the lock the parent's thread held

    try:
        in_child(child, tmp_path, timeout=10)
    finally:
        release.set()
        thread.join()
        store.close()
