"""`bide cancel`, `bide approve` and `bide resolve` interrupted (SIGINT, Ctrl-C) say what the store
recorded, through a real child process.

The test holds the store's write lock (SQLite: `BEGIN IMMEDIATE` on its own connection; PostgreSQL: `LOCK
TABLE ... IN EXCLUSIVE MODE`), so the command's cancel request waits; it sends SIGINT once it sees the
command waiting (SQLite: a thread of the command asleep in SQLite's busy handler; PostgreSQL: a lock not
granted), then lets the lock go. Once the request is with the store it commits or fails whatever the
command does, so the command waits for the answer and reports it: the run's journal and the command's exit
code and words must agree. A second SIGINT stops the waiting, and the command then says it does not know.
Interrupted before the request is sent (while it reads the run), the command stops and says nothing was
sent.

`bide resolve` takes the run's lease before it writes, and the lease is a write too (on SQLite it waits for
the test's lock): resolve_child.py pauses it once it holds the lease, so that the test takes the lock then,
or interrupts it there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PG_URL, drop_prefix

import bide

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ANSWER_AWAITED = "waiting for its answer"


@contextlib.contextmanager
def write_lock(url: str, prefix: str, *, reads_too: bool = False) -> Iterator[Callable[[], None]]:
    """Hold the store's write lock (reads go on, but with `reads_too` on PostgreSQL) until the yielded
    function is called."""
    if url.startswith("sqlite:///"):
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield lambda: holder.execute("ROLLBACK").close()
        finally:
            holder.close()
        return
    engine = sa.create_engine(url)
    conn = engine.connect()
    transaction = conn.begin()
    mode = "ACCESS EXCLUSIVE" if reads_too else "EXCLUSIVE"
    conn.exec_driver_sql(f"LOCK TABLE {prefix}records IN {mode} MODE")
    try:
        yield transaction.rollback
    finally:
        conn.close()
        engine.dispose()


def sqlite_busy_wait_syscall(path: str) -> str:
    """The system call (its number, as /proc shows it) a thread sleeps in while SQLite waits for the lock
    the test holds: learnt here, by waiting for it too, so that no architecture's numbering is assumed."""
    seen: queue.SimpleQueue[str] = queue.SimpleQueue()
    waiting = threading.Event()

    def wait_for_the_lock() -> None:
        waiter = sqlite3.connect(path, isolation_level=None, timeout=2.0, check_same_thread=False)
        seen.put(str(threading.get_native_id()))
        waiting.set()
        with contextlib.suppress(sqlite3.OperationalError):
            waiter.execute("BEGIN IMMEDIATE")
        waiter.close()

    thread = threading.Thread(target=wait_for_the_lock)
    thread.start()
    waiting.wait()
    task = Path(f"/proc/self/task/{seen.get()}/syscall")
    number = ""
    while thread.is_alive() and not number:
        first = task.read_text().split()[0] if task.exists() else "running"
        number = "" if first in ("running", "-1") else first
    thread.join()
    assert number, "could not see SQLite's busy handler asleep"
    return number


def waits_for_the_lock(pid: int, url: str, prefix: str, sleep_syscall: str) -> bool:
    """Whether the command `pid` waits for the lock the test holds."""
    if url.startswith("sqlite:///"):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError):
                if (task / "syscall").read_text().split()[0] == sleep_syscall:
                    return True
        return False
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = to_regclass(%(table)s)"
            return bool(conn.exec_driver_sql(query, {"table": f"{prefix}records"}).scalar())
    finally:
        engine.dispose()


def lines_of(stream: object) -> queue.SimpleQueue[str]:
    """The lines `stream` gives, as they come (read by a thread: the test waits on them with a deadline)."""
    lines: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read() -> None:
        for line in stream:  # type: ignore[attr-defined]
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def rest(lines: queue.SimpleQueue[str]) -> str:
    out = []
    while line := lines.get(timeout=120):
        out.append(line)
    return "".join(out)


def start_a_run(url: str, prefix: str) -> None:
    store = bide.open_store(url, table_prefix=prefix)
    try:
        bide.Journal(store, "r").load().write([bide.Start(key="run:start", entry="agent:test", input="go")])
    finally:
        store.close()


def cancel_recorded(url: str, prefix: str) -> bool:
    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        return store.get("r", "run:cancel") is not None
    finally:
        store.close()


def interrupted_cancel(
    url: str, prefix: str, *, interrupts: int, reads_too: bool = False
) -> tuple[int, str, str]:
    """`interrupted` on `bide cancel r`."""
    return interrupted(["cancel", "r"], url, prefix, interrupts=interrupts, reads_too=reads_too)


def bide_command(
    arguments: list[str], url: str, prefix: str, *, cwd: Path = REPO, pause: Path | None = None
) -> subprocess.Popen[str]:
    """Start `bide ARGUMENTS` on the store; with `pause` (a directory), through resolve_child.py, which
    stops once the resolver holds the run's lease until the test creates `pause`/go."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    program = [sys.executable, "-m", "bide._cli"]
    if pause is not None:
        program = [sys.executable, str(Path(__file__).with_name("resolve_child.py")), str(pause)]
    command = [*program, *arguments, "--store", url, "--table-prefix", prefix]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )


def wait_until_paused(child: subprocess.Popen[str], pause: Path) -> None:
    """Wait until the child of `bide_command(..., pause=pause)` holds the run's lease and waits for go."""
    while not (pause / "leased").exists():
        assert child.poll() is None, child.communicate()
        time.sleep(0.02)


def interrupted(
    arguments: list[str],
    url: str,
    prefix: str,
    *,
    interrupts: int,
    reads_too: bool = False,
    cwd: Path = REPO,
    pause: Path | None = None,
) -> tuple[int, str, str]:
    """Run `bide ARGUMENTS` while the test holds the lock (`write_lock`), send it SIGINT once it waits for
    the lock (a second one once it answered the first, if `interrupts` is 2), then let the lock go. With
    `pause` the lock is taken once the command paused holding the run's lease (`bide_command`). Returns
    the exit code, stdout and stderr."""
    child = None
    try:
        if pause is not None:
            child = bide_command(arguments, url, prefix, cwd=cwd, pause=pause)
            wait_until_paused(child, pause)
        with write_lock(url, prefix, reads_too=reads_too) as release:
            sqlite = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
            sleep_syscall = sqlite_busy_wait_syscall(sqlite) if sqlite else ""
            if pause is None:
                child = bide_command(arguments, url, prefix, cwd=cwd)
            else:
                (pause / "go").touch()
            assert child is not None
            errors = lines_of(child.stderr)
            while not waits_for_the_lock(child.pid, url, prefix, sleep_syscall):
                assert child.poll() is None, rest(errors)
                time.sleep(0.02)
            child.send_signal(signal.SIGINT)
            # Until the command answers the interrupt, the lock stays held: nothing can commit behind its
            # back. (No answer in 20 s means it ignored the interrupt; the lock goes anyway.)
            answered = ""
            with contextlib.suppress(queue.Empty):
                answered = errors.get(timeout=20)
            if interrupts == 2:
                child.send_signal(signal.SIGINT)
                child.wait(timeout=60)
            release()
            out, _ = child.communicate(timeout=120)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
    return child.returncode, out, answered + rest(errors)


def caught_before_sending(code: int, out: str, said: str, recorded: bool) -> bool:
    """Whether a command that said it sent nothing kept its word. On SQLite a read of the command can, now
    and then, wait in SQLite's busy handler too (the test holds the write lock), and the test cannot tell
    that wait from the write's: the SIGINT then lands before anything was sent. That is still a case of
    the rule under test: nothing recorded, exit 130, no answer awaited."""
    return code == 130 and out == "" and not recorded and ANSWER_AWAITED not in said


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupted_cancel_says_what_the_store_recorded(
    durable_store_spec: tuple[str, str], interrupts: int
) -> None:
    url, prefix = durable_store_spec
    start_a_run(url, prefix)
    code, out, said = interrupted_cancel(url, prefix, interrupts=interrupts)
    recorded = cancel_recorded(url, prefix)
    if "no cancel request was sent" in said:  # see `caught_before_sending`
        assert caught_before_sending(code, out, said, recorded)
        return
    if interrupts == 1:  # the command waited for the store's answer: it reports it
        reported = code == 0 and "cancel requested for run r" in out
        assert reported == recorded, (recorded, code, out, said)
        assert recorded  # the lock was let go, so the request committed
    else:  # it stopped waiting: it says it does not know
        assert code == 130 and out == "", (code, out)
        assert "may or may not have been recorded" in said and "bide show r" in said, said
    assert ANSWER_AWAITED in said, said


@pytest.mark.postgres
def test_a_cancel_interrupted_before_its_request_is_sent_sends_none() -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    start_a_run(PG_URL, prefix)
    try:
        # The test's lock holds up the command's reading of the run, before it sends anything.
        code, out, said = interrupted_cancel(PG_URL, prefix, interrupts=1, reads_too=True)
        assert not cancel_recorded(PG_URL, prefix)
        assert code == 130 and out == "", (code, out, said)
        assert "no cancel request was sent for run r" in said, said
    finally:
        drop_prefix(PG_URL, prefix)


def a_call_waiting_for_alice(url: str, prefix: str, keys: Path) -> str:
    """Run `r` of an agent whose `wire` tool needs alice's approval (1 of 1) until it waits for it; alice's
    key file is `keys/alice.key`. Returns the waiting call's id."""
    from bide.approvals import ApprovalGate
    from bide.audit import generate_key
    from bide.testing import ScriptedModel, call, reply

    alice = generate_key(keys / "alice.key")

    @bide.tool(gate=ApprovalGate.k_of_n(1, {"alice": alice.public}))
    def wire(amount: int) -> str:
        """Wire money."""
        return f"sent {amount}"

    store = bide.open_store(url, table_prefix=prefix)
    try:
        agent = bide.Agent(ScriptedModel([call("wire", amount=5), reply("done")]), store=store, tools=[wire])
        with pytest.raises(bide.ApprovalPending) as pause:
            agent.run_sync("r", "pay")
        return pause.value.call_id
    finally:
        store.close()


def approved_by(url: str, prefix: str) -> list[str]:
    from bide.approvals import pending_approvals

    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        [waiting] = pending_approvals(store)
        return list(waiting.approved_by)
    finally:
        store.close()


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupted_approval_says_what_the_store_recorded(
    durable_store_spec: tuple[str, str], interrupts: int, tmp_path: Path
) -> None:
    """`bide approve`, as `bide cancel`: it printed "interrupted" (130) while closing the store committed
    the signed approval. Now a first SIGINT once the decision is with the store waits for the answer and
    reports it; a second says it does not know."""
    url, prefix = durable_store_spec
    call_id = a_call_waiting_for_alice(url, prefix, tmp_path)
    arguments = ["approve", "r", call_id, "--key", "alice.key"]
    code, out, said = interrupted(arguments, url, prefix, interrupts=interrupts, cwd=tmp_path)
    recorded = approved_by(url, prefix) == ["alice"]
    if "no approval was sent" in said:  # see `caught_before_sending`
        assert caught_before_sending(code, out, said, recorded)
        return
    if interrupts == 1:
        reported = code == 0 and "Recorded the signed approval" in out
        assert reported == recorded, (recorded, code, out, said)
        assert recorded, (code, out, said)  # the lock was let go, so the decision committed
    else:
        assert code == 130 and out == "", (code, out)
        assert "may or may not have been recorded" in said and "bide pending" in said, said
    assert ANSWER_AWAITED in said, said


@bide.tool(timeout=30)
def send(to: str) -> str:
    """Send a message (the connection drops after the request went out)."""
    raise OSError("lost after the request went out")


def a_halted_call(url: str, prefix: str) -> str:
    """Leave run `r` halted on its `send` call, whose outcome is unknown, past the call's deadline (the
    tests resolve with --clock-skew 0). Returns the call's id. The agent's clock runs a minute behind, so
    the deadline its marker records has passed already, while the call had all its 30 s to start (a short
    timeout, waited out, failed on a loaded machine: the call could not start in time)."""
    from bide.testing import ScriptedModel, call, reply

    store = bide.open_store(url, table_prefix=prefix)
    try:
        model = ScriptedModel([call("send", to="x"), reply("ok")])
        agent = bide.Agent(model, store=store, tools=[send], clock=lambda: time.time() - 60)
        with pytest.raises(bide.OutcomeUnknown) as halt:
            agent.run_sync("r", "send it")
    finally:
        store.close()
    return halt.value.call_id


def where_run_r_stands(url: str, prefix: str) -> tuple[str, int]:
    """Run r's status and its number of records."""
    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        status = bide.run_status(store, "r")
        return status.status, status.records
    finally:
        store.close()


def lease_is_free(url: str, prefix: str) -> bool:
    """Whether another driver gets run r's lease now (it is given back again at once)."""
    store = bide.open_store(url, table_prefix=prefix, create=False)
    try:
        lease = store.lease("r", "another driver", now_ms=int(time.time() * 1000), ttl_ms=60_000)
        if lease.held:
            store.release("r", "another driver", lease.token)
        return lease.held
    finally:
        store.close()


def resolve_arguments(call_id: str) -> list[str]:
    return ["resolve", "r", call_id, "--succeeded", '"sent"', "--clock-skew", "0"]


@pytest.mark.parametrize("waiting", ["holding the lease", "for the store"])
def test_a_resolve_interrupted_before_sending_records_nothing_and_gives_back_the_lease(
    durable_store_spec: tuple[str, str], waiting: str, tmp_path: Path
) -> None:
    """Interrupted before the resolution is sent (paused with the run's lease; or waiting for the store,
    which the test holds: SQLite for the lease, PostgreSQL for the first read), `bide resolve` says no
    resolution was recorded, sends none, gives back the lease it took and exits 130."""
    url, prefix = durable_store_spec
    call_id = a_halted_call(url, prefix)
    before = where_run_r_stands(url, prefix)
    assert before[0] == "halted"
    if waiting == "holding the lease":
        child = bide_command(resolve_arguments(call_id), url, prefix, pause=tmp_path)
        try:
            wait_until_paused(child, tmp_path)
            child.send_signal(signal.SIGINT)
            errors = lines_of(child.stderr)
            answered = errors.get(timeout=20)
            (tmp_path / "go").touch()  # on it goes, to where it would send the resolution
            out, _ = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
        code, said = child.returncode, answered + rest(errors)
    else:
        code, out, said = interrupted(resolve_arguments(call_id), url, prefix, interrupts=1, reads_too=True)
    assert code == 130 and out == "", (code, out, said)
    assert f"no resolution was recorded for call {call_id} of run r" in said, said
    assert where_run_r_stands(url, prefix) == before
    assert lease_is_free(url, prefix)


@pytest.mark.parametrize("interrupts", [1, 2])
def test_an_interrupted_resolve_says_what_the_store_recorded(
    durable_store_spec: tuple[str, str], interrupts: int, tmp_path: Path
) -> None:
    """`bide resolve`, as `bide cancel`: once its resolution is with the store (the test takes the lock
    while the command pauses holding the run's lease, before it writes), a first SIGINT waits for the
    answer and reports it; a second says it does not know and exits at once."""
    url, prefix = durable_store_spec
    call_id = a_halted_call(url, prefix)
    before = where_run_r_stands(url, prefix)
    code, out, said = interrupted(
        resolve_arguments(call_id), url, prefix, interrupts=interrupts, pause=tmp_path
    )
    status, records = where_run_r_stands(url, prefix)
    if "no resolution was recorded" in said:  # see `caught_before_sending`: its read waited, not its write
        assert caught_before_sending(code, out, said, (status, records) != before)
        return
    if interrupts == 1:  # it waited: the lock was let go, so the resolution committed, and it says so
        assert code == 0 and f"resolved call {call_id} of run r as succeeded" in out, (code, out, said)
        assert status == "running" and records > before[1], (status, records)
        assert lease_is_free(url, prefix)
    else:  # it stopped waiting while its write waited for the lock: it says it does not know
        assert code == 130 and out == "", (code, out, said)
        assert "may or may not have been recorded" in said and "bide show r" in said, said
        assert (status, records) == before  # the write died with the command, before the lock went
    assert ANSWER_AWAITED in said, said


@pytest.mark.parametrize("command", ["cancel", "approve", "resolve"])
def test_two_interrupts_while_the_store_closes_keep_the_answer(
    durable_store_spec: tuple[str, str],
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Once the store has answered, two SIGINTs while the command closes the store stop that wait, not the
    report: the command says what was recorded and exits 0 (the second SIGINT was a traceback). In process:
    the store's own close sends the signals, so that they land in that moment."""
    from bide._cli import main
    from bide._sql import SQLStore

    url, prefix = durable_store_spec
    if command == "cancel":
        start_a_run(url, prefix)
        arguments, reported = ["cancel", "r"], "cancel requested for run r"
    elif command == "approve":
        call_id = a_call_waiting_for_alice(url, prefix, tmp_path)
        arguments = ["approve", "r", call_id, "--key", str(tmp_path / "alice.key")]
        reported = "Recorded the signed approval"
    else:
        arguments, reported = resolve_arguments(a_halted_call(url, prefix)), "resolved call"
    close = SQLStore.close
    left_open: list[SQLStore] = []

    def interrupted_close(store: SQLStore) -> None:
        left_open.append(store)
        os.kill(os.getpid(), signal.SIGINT)  # "waiting for its answer"
        os.kill(os.getpid(), signal.SIGINT)  # stops the wait: raised here, before the close proper
        close(store)

    monkeypatch.setattr(SQLStore, "close", interrupted_close)
    code = main([*arguments, "--store", url, "--table-prefix", prefix])
    monkeypatch.undo()
    for store in left_open:
        close(store)
    out, said = capsys.readouterr()
    assert code == 0 and reported in out, (code, out, said)
    assert ANSWER_AWAITED in said and "may or may not" not in said, said
    if command == "cancel":
        assert cancel_recorded(url, prefix)
    elif command == "approve":
        assert approved_by(url, prefix) == ["alice"]
    else:
        assert where_run_r_stands(url, prefix)[0] != "halted"
