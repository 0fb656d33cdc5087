"""An `EventLog` opened in a parent and used after os.fork() (gunicorn --preload, multiprocessing with the
fork start method): every child appends through the handle it inherited, as if it had opened it itself."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from forked import fork, wait_all

from govern.runtime._eventlog import Event, EventLog

from .machines import order_log, order_machine

CHILDREN, EACH = 3, 40


def event(event_id: str, producer: str, record: str, name: str = "restock") -> Event:
    return Event(id=event_id, machine=order_machine().digest, record=record, event=name, producer=producer)


def test_forked_children_append_through_the_inherited_handle(
    log_url: str, log_name: str, tmp_path: Path
) -> None:
    """Before, the children used the parent's pooled connections: on PostgreSQL one child read another's
    answers (append raised a bare KeyError or IndexError, psycopg "cannot exit pipeline mode while busy",
    and an append reported failed had committed). Now each child opens its own connections and the
    parent's stay its own: every event is in the log once, at the position its append returned."""
    log = order_log(log_url, name=log_name, timeout=20)
    log.append(event("parent-0", "parent", "r0"))
    assert log.length() == 1  # the parent holds pooled connections (and, on SQLite, its writer) now

    def child(k: int) -> Callable[[], None]:
        def work() -> None:
            acked = []
            for i in range(EACH):
                done = log.append(event(f"c{k}-{i}", f"c{k}", f"r{i % 3}"))
                assert done.event.id == f"c{k}-{i}" and done.created, done
                acked.append(f"{done.event.id} {done.event.position}\n")
            (tmp_path / f"acked{k}").write_text("".join(acked))

        return work

    errors = [tmp_path / f"errors{k}" for k in range(CHILDREN)]
    pids = [fork(child(k), errors[k]) for k in range(CHILDREN)]
    wait_all(pids, errors)
    # The parent's own handle still works, on the connections it had before the children ran.
    for i in range(5):
        assert log.append(event(f"parent-{i + 1}", "parent", "r0")).created

    fresh = EventLog(log_url, name=log_name)
    stored = fresh.read()  # (raises on a gap in the positions)
    ids = [e.id for e in stored]
    expected = {"parent-0", *(f"parent-{i + 1}" for i in range(5))}
    expected |= {f"c{k}-{i}" for k in range(CHILDREN) for i in range(EACH)}
    assert len(ids) == len(set(ids)) == len(expected)
    assert set(ids) == expected
    position = {e.id: e.position for e in stored}
    for k in range(CHILDREN):
        for line in (tmp_path / f"acked{k}").read_text().splitlines():
            event_id, at = line.split()
            assert position[event_id] == int(at), line
        seqs = [e.producer_seq for e in stored if e.producer == f"c{k}"]
        assert seqs == list(range(EACH))
    fresh.close()
    log.close()


def test_forked_children_get_writer_tokens_of_their_own(log_url: str, log_name: str, tmp_path: Path) -> None:
    """Before, a child kept its parent's writer token prefix and call counter, so two children's first
    appends carried the same token: both appends of one event reported `created=True`, the second taking
    the first's write for its own. Now exactly one of them created it."""
    log = order_log(log_url, name=log_name, timeout=20)
    log.append(event("parent-0", "parent", "r0"))

    def child(k: int) -> Callable[[], None]:
        def work() -> None:
            done = log.append(event("shared", "both", "r1"))
            (tmp_path / f"created{k}").write_text(str(done.created))

        return work

    errors = [tmp_path / f"errors{k}" for k in range(2)]
    pids = []
    for k in range(2):  # one after the other: the second finds the event the first wrote
        pids.append(fork(child(k), errors[k]))
        wait_all(pids[-1:], errors[k : k + 1])
    assert sorted((tmp_path / f"created{k}").read_text() for k in range(2)) == ["False", "True"]
    assert log.append(event("shared", "both", "r1")).created is False
    log.close()
