"""A checkpoint refused while delivered events wait says which and why `sync()` alone may not clear it.

An event delivered for a position the log has not reached (a transport ahead of the log the replica
reads) waits until the log holds it: the refusal only said "call sync() first", which changed nothing.
"""

from __future__ import annotations

import pytest

from govern.runtime._eventlog import Event, LoggedEvent
from govern.runtime._replica import Replica, ReplicaError

from .machines import order_log, order_machine


def test_a_checkpoint_refused_names_the_event_delivered_ahead_of_the_log() -> None:
    machine = order_machine()
    log = order_log()
    for i in range(3):
        log.append(Event(id=f"e{i}", machine=machine.digest, record="r", event="restock", producer="p"))
    replica = Replica(machine, log)
    replica.sync()
    ahead = LoggedEvent(
        id="later", machine=machine.digest, record="r", event="pay", producer="q", producer_seq=0,
        log=log.name, position=5, record_seq=5, after=(),
    )  # fmt: skip
    replica.deliver([ahead])
    for _ in range(2):
        replica.sync()
        assert replica.pending == 1
        with pytest.raises(ReplicaError) as refused:
            replica.checkpoint()
        message = str(refused.value)
        assert "1 delivered event(s) wait" in message
        assert "first at log position 5; applied so far: 3" in message
        assert "waits until the log holds it" in message
