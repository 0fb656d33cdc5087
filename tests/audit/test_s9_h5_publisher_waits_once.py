"""`DirectoryPublisher.publish_checked` took its per-process lock with no timeout, then waited up to
LOCK_WAIT_S for the directory's lock: threads of one process appending while another process held the
directory's lock (a paused export) gave up one after another, at 1, 2, 3 times LOCK_WAIT_S, and one stuck
inside its publication kept the others waiting for ever. Each now waits at most LOCK_WAIT_S in all, then
AnchorError (the append committed)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import bide
import bide.audit._anchor as anchor_module
from bide.audit import AnchorError, AuditedStore, AuditLog, DirectoryPublisher, SigningKey
from bide.audit._anchor import LOCK_FILE

pytestmark = pytest.mark.slow  # waits for locks

_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _start(store: bide.Store, run_id: str) -> None:
    bide.Journal(store, run_id).load().write([bide.Start(key="run:start", entry="agent:test", input="go")])


def test_threads_behind_another_process_s_lock_each_give_up_after_one_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(anchor_module, "LOCK_WAIT_S", 1.0)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    inner = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    store = AuditedStore(inner, AuditLog(inner, SigningKey.generate(), DirectoryPublisher(anchor)))
    runs = ("r1", "r2", "r3")
    try:
        for run_id in runs:
            _start(store, run_id)
        published = sorted(anchor.rglob("*.json"))
        # Another process holds the directory's lock for 2.5 waits: a thread still waiting then would get it.
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(anchor / LOCK_FILE), "2.5"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            threads = [
                threading.Thread(
                    target=lambda r=run_id: bide.Journal(store, r)
                    .load()
                    .write([bide.GateRecord(key="approval:x", data=1)])
                )
                for run_id in runs
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
        finally:
            holder.wait(timeout=60)
        assert not any(thread.is_alive() for thread in threads)
        # Every append committed; none was anchored: each gave up while the other process held the lock.
        assert all(any(e.key == "approval:x" for e in inner.load(r)) for r in runs)
        assert [type(e) for e in store.errors] == [AnchorError] * 3, store.errors
        assert all("stayed locked by another publisher for 1 s" in str(e) for e in store.errors)
        assert sorted(anchor.rglob("*.json")) == published
    finally:
        store.close()


def test_a_publication_stuck_in_this_process_does_not_keep_another_waiting_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(anchor_module, "LOCK_WAIT_S", 0.5)
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    publisher = DirectoryPublisher(anchor)
    log = AuditLog(store, SigningKey.generate(), publisher)
    outcome: list[BaseException] = []

    def sign() -> None:
        try:
            log.sign_head("r1")
        except BaseException as exc:
            outcome.append(exc)

    try:
        _start(store, "r1")
        publisher._publishing.acquire()  # another thread's publication, stuck
        try:
            thread = threading.Thread(target=sign)
            thread.start()
            thread.join(timeout=30)
            assert not thread.is_alive(), "publish_checked still waits for this process's other publication"
        finally:
            publisher._publishing.release()
            thread.join(timeout=30)
        assert len(outcome) == 1 and isinstance(outcome[0], AnchorError), outcome
        assert "stayed locked" in str(outcome[0]) and list(anchor.rglob("*.json")) == []
    finally:
        store.close()
