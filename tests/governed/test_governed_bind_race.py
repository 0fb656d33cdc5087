"""Two handles binding one new log to different machines at the same moment: exactly one binds it.

On PostgreSQL the bind's `SELECT ... FOR UPDATE` locks no row while the log has none, and its INSERT does
nothing when a concurrent binder's row is already there: the loser's bind returned as if it had bound the
log to its own machine (10 of 15 races in two processes), and an event tool built on it then failed on
every call. The row that stands names the log's machine, and the loser gets `MachineMismatch`.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

import govern
from govern.runtime import _eventlog
from govern.runtime._eventlog import EventLog, MachineMismatch

from .machines import order_machine


def _other_machine() -> govern.Machine:
    r = govern.Registry("other")
    flag = r.bool("flag")
    r.event("go", effect={flag: True})
    return r.build()


def test_a_bind_that_lost_the_race_for_a_new_log_is_refused(
    log_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"log-{uuid.uuid4().hex[:12]}"
    first, second = EventLog(log_url, name=name), EventLog(log_url, name=name)
    looked = threading.Event()  # the first bind found no row and is about to create it
    go_on = threading.Event()
    create = _eventlog._SqlTx.create

    def paused_create(self: Any, machine: str, names: tuple[str, ...]) -> Any:
        if threading.current_thread().name == "first-binder":
            looked.set()
            go_on.wait(timeout=30)
        return create(self, machine, names)

    outcome: list[BaseException | None] = []

    def bind_first() -> None:
        try:
            first.bind(order_machine())
            outcome.append(None)
        except Exception as exc:  # reported by the assertions below
            outcome.append(exc)

    monkeypatch.setattr(_eventlog._SqlTx, "create", paused_create)
    binder = threading.Thread(target=bind_first, name="first-binder")
    binder.start()
    sqlite = log_url.startswith("sqlite")
    try:
        assert looked.wait(timeout=30)
        if sqlite:
            # SQLite's BEGIN IMMEDIATE serializes the binds: the second waits for the first, then is refused.
            go_on.set()
            binder.join(timeout=60)
            with pytest.raises(MachineMismatch):
                second.bind(_other_machine())
        else:
            second.bind(_other_machine())  # creates the row while the first waits to create it
    finally:
        go_on.set()
        binder.join(timeout=60)
    winner = order_machine() if sqlite else _other_machine()
    assert first.machine() == second.machine() == winner.digest
    [first_bind] = outcome
    assert first_bind is None if sqlite else isinstance(first_bind, MachineMismatch), first_bind
    first.close()
    second.close()
