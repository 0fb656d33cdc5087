"""`bide worker` at the edges of operations: a dropped PostgreSQL connection, SIGINT during `--once`, an
`--app` that fails to import or build. Each runs the real command in a child process on a real store.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import PG_URL, drop_prefix

import bide

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), e.get("PYTHONPATH", "")])
    e["OPS_EFFECT_LOG"] = str(tmp_path / "effects.log")
    yield e


def worker_command(url: str, prefix: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--table-prefix", prefix,
            "--app", "ops_app:build", *extra]  # fmt: skip


def crash_run(url: str, prefix: str, run_id: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, str(HERE / "ops_app.py"), url, prefix, run_id], env=env, check=True, timeout=60
    )


def wait_until(predicate: object, what: str, timeout: float = 30.0) -> None:
    assert callable(predicate)
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def status(url: str, prefix: str, run_id: str) -> str:
    store = bide.open_store(url, table_prefix=prefix)
    try:
        return bide.run_status(store, run_id).status
    finally:
        store.close()


def backends(engine: sa.Engine, app_name: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"), {"n": app_name}
            ).scalar_one()
        )


def terminate(engine: sa.Engine, app_name: str) -> int:
    """Kill the backends of `app_name`; how many were killed."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :n"
                ),
                {"n": app_name},
            ).scalar_one()
        )


@pytest.mark.postgres
def test_worker_rides_over_a_dropped_postgres_connection_and_keeps_resuming(
    env: dict[str, str], tmp_path: Path
) -> None:
    prefix = f"ops_{uuid.uuid4().hex[:8]}_"
    app_name = f"bide_ops_{uuid.uuid4().hex[:8]}"
    bide.open_store(PG_URL, table_prefix=prefix).close()
    env["PGAPPNAME"] = app_name
    engine = sa.create_engine(PG_URL)
    with open(tmp_path / "worker.err", "w") as err:
        worker = subprocess.Popen(
            worker_command(PG_URL, prefix, "--poll", "0.2"),
            env=env, cwd=HERE, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        wait_until(lambda: backends(engine, app_name) > 0, "the worker to connect")
        time.sleep(0.5)
        assert terminate(engine, app_name) >= 1
        time.sleep(1.5)
        assert worker.poll() is None, (tmp_path / "worker.err").read_text()
        # A run that crashes after the drop is still resumed.
        crash_run(PG_URL, prefix, "after-drop", env)
        wait_until(lambda: status(PG_URL, prefix, "after-drop") == "completed", "the run to be resumed")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        engine.dispose()
        drop_prefix(PG_URL, prefix)
    # The store sent the listing again on a new connection: the worker never saw the drop.
    assert "failed" not in (tmp_path / "worker.err").read_text()


def test_worker_survives_a_listing_that_fails_and_keeps_resuming(env: dict[str, str], tmp_path: Path) -> None:
    """A listing that fails (here the runs table is renamed away under the worker, then put back) is logged
    and retried with a backoff; the worker keeps running and resumes a run that crashes afterwards."""
    import sqlite3

    db = tmp_path / "ops.db"
    url, prefix = f"sqlite:///{db}", "bide_"
    bide.open_store(url, table_prefix=prefix).close()
    errors = tmp_path / "worker.err"
    with open(errors, "w") as err:
        worker = subprocess.Popen(
            worker_command(url, prefix, "--poll", "0.2"), env=env, cwd=HERE, stdout=subprocess.DEVNULL,
            stderr=err,
        )  # fmt: skip
    try:
        # The worker is up and listing once it resumed a run (renamed before it opened the store, the table
        # would only be made again).
        crash_run(url, prefix, "before-failure", env)
        wait_until(lambda: status(url, prefix, "before-failure") == "completed", "the worker to resume a run")
        with sqlite3.connect(db) as conn:
            conn.execute(f"ALTER TABLE {prefix}runs RENAME TO {prefix}runs_away")
        wait_until(lambda: "listing the runs to recover failed" in errors.read_text(), "a failed listing")
        with sqlite3.connect(db) as conn:
            conn.execute(f"ALTER TABLE {prefix}runs_away RENAME TO {prefix}runs")
        assert worker.poll() is None, errors.read_text()
        crash_run(url, prefix, "after-failure", env)
        wait_until(lambda: status(url, prefix, "after-failure") == "completed", "the run to be resumed")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, errors.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_sigint_during_worker_once_keeps_the_side_effects_result(env: dict[str, str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'once.db'}"
    crash_run(url, "bide_", "r0", env)
    env["OPS_EFFECT_SECONDS"] = "1.5"
    log = Path(env["OPS_EFFECT_LOG"])
    worker = subprocess.Popen(
        worker_command(url, "bide_", "--once"), env=env, cwd=HERE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: log.exists() and "start o" in log.read_text(), "the side effect to start")
        worker.send_signal(signal.SIGINT)
        out, errors = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert log.read_text().splitlines() == ["start o", "end o"]
    assert worker.returncode == 0, errors
    assert "1 completed" in out
    assert status(url, "bide_", "r0") == "completed"


def _effect_running(
    env: dict[str, str], tmp_path: Path, seconds: float, *, asynchronous: bool = True
) -> tuple[str, subprocess.Popen[str]]:
    """A worker (no --once) driving a crashed run into a side effect of `seconds` (an async one, else a
    synchronous one, which runs in a thread), started."""
    url = f"sqlite:///{tmp_path / 'forever.db'}"
    crash_run(url, "bide_", "r0", env)
    env["OPS_EFFECT_SECONDS"], env["OPS_EFFECT_ASYNC"] = str(seconds), "1" if asynchronous else "0"
    log = Path(env["OPS_EFFECT_LOG"])
    worker = subprocess.Popen(
        worker_command(url, "bide_", "--poll", "0.2"), env=env, cwd=HERE,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_until(lambda: log.exists() and "start o" in log.read_text(), "the side effect to start")
    return url, worker


def _stopped_by(worker: subprocess.Popen[str], signum: signal.Signals, *, timeout: float) -> str:
    """Send `signum` to the worker and wait for it to end (killed if it outlives `timeout`); its stderr."""
    try:
        worker.send_signal(signum)
        _, errors = worker.communicate(timeout=timeout)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return errors


@pytest.mark.slow
def test_sigterm_lets_a_worker_drive_finish_however_long_its_side_effect_runs(
    env: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM stops `bide worker` taking runs and waits for its drives: an async side effect running past
    the library's default grace (30 s, after which the worker used to cancel it and leave the run halted
    for a person) still has its result journaled."""
    url, worker = _effect_running(env, tmp_path, 32.0)
    errors = _stopped_by(worker, signal.SIGTERM, timeout=90)
    assert worker.returncode == 0, errors
    assert "waiting for the 1 drive(s) in flight to finish" in errors
    assert Path(env["OPS_EFFECT_LOG"]).read_text().splitlines() == ["start o", "end o"]
    assert status(url, "bide_", "r0") == "completed"


def test_sighup_stops_a_worker_as_sigterm_does(env: dict[str, str], tmp_path: Path) -> None:
    """A closed terminal or ssh session (SIGHUP) ended the worker at once, in the middle of a side effect,
    and its run halted for a person; it stops the worker as SIGTERM does."""
    url, worker = _effect_running(env, tmp_path, 2.0)
    errors = _stopped_by(worker, signal.SIGHUP, timeout=60)
    assert worker.returncode == 0, errors
    assert Path(env["OPS_EFFECT_LOG"]).read_text().splitlines() == ["start o", "end o"]
    assert status(url, "bide_", "r0") == "completed"


def test_a_second_signal_cancels_the_drives_a_stopping_worker_waits_for(
    env: dict[str, str], tmp_path: Path
) -> None:
    url, worker = _effect_running(env, tmp_path, 120.0)
    try:
        worker.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert worker.poll() is None  # still waiting for the drive
        worker.send_signal(signal.SIGINT)
        _, errors = worker.communicate(timeout=10)  # at once, not after a grace period
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, errors
    assert Path(env["OPS_EFFECT_LOG"]).read_text().splitlines() == ["start o"]
    # The call was interrupted: its outcome is unknown, and a person decides (nothing fires it again).
    assert status(url, "bide_", "r0") == "halted"


def test_a_second_signal_during_a_synchronous_side_effect_frees_the_lease_once_its_result_is_journaled(
    env: dict[str, str], tmp_path: Path
) -> None:
    """The drive is cancelled, the synchronous call runs on in its thread, and a keeper journals its result
    and then frees the run's lease. The worker closed its store before the keeper was done: the result was
    journaled but the lease stayed held (its expiry not 0), so no worker could resume the run for
    lease_ttl plus the clock skew (about 31 s by default). The log said only "run r0 interrupted: "."""
    from bide._store import EVERY_LEASE_MS

    url, worker = _effect_running(env, tmp_path, 3.0, asynchronous=False)
    log = Path(env["OPS_EFFECT_LOG"])
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    errors = _stopped_by(worker, signal.SIGINT, timeout=60)
    assert worker.returncode == 0, errors
    assert log.read_text().splitlines() == ["start o", "end o"]
    assert "run r0 interrupted: CancelledError (the drive was cancelled or interrupted)" in errors
    store = bide.open_store(url)
    try:
        [lease] = [lease for lease in store.expired_leases(now_ms=EVERY_LEASE_MS) if lease.run_id == "r0"]
        assert lease.expires_ms == 0, lease  # freed by its holder, not left to expire
        assert bide.run_status(store, "r0").status == "running"  # its result journaled: no person needed
    finally:
        store.close()


def test_a_third_signal_ends_a_worker_waiting_for_a_synchronous_call(
    env: dict[str, str], tmp_path: Path
) -> None:
    """After the second signal a synchronous call runs on in its thread, and the worker waited for it with
    its handlers still taking signals: a third one did nothing, and nothing said what it waited for. It says
    so, and a third signal exits at once (128 + the signal), as SIGKILL would: the call's run is left to a
    person."""
    _, worker = _effect_running(env, tmp_path, 120.0, asynchronous=False)
    log = Path(env["OPS_EFFECT_LOG"])
    said: list[str] = []
    assert worker.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(worker.stderr or ()), daemon=True)
    reader.start()
    try:
        # Each signal once the one before was taken (two SIGINTs pending at once would be one), by what the
        # worker says.
        for signum, then in (
            (signal.SIGTERM, "stopping; waiting for the 1 drive(s) in flight"),
            (signal.SIGINT, "a synchronous tool call among them runs on in its thread until it returns"),
        ):
            worker.send_signal(signum)
            wait_until(lambda then=then: any(then in line for line in said), f"the worker to say {then!r}")
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)  # long before the call's 120 s
        reader.join(10)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    errors = "".join(said)
    assert worker.returncode == 128 + signal.SIGTERM, errors
    assert "exiting now, without waiting for the calls still running" in errors
    assert log.read_text().splitlines() == ["start o"]


def worker_once_with(
    tmp_path: Path, module: str, source: str, *more: str
) -> subprocess.CompletedProcess[str]:
    """`bide worker --once` with the app `module:build` (written from `source` in `tmp_path`), on a new
    SQLite store there."""
    (tmp_path / f"{module}.py").write_text(source)
    url = f"sqlite:///{tmp_path / 'w.db'}"
    bide.open_store(url).close()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", f"{module}:build", "--once",
         *more],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    "bad",
    [
        ["--concurrency", "0"], ["--concurrency", "-3"], ["--concurrency", "2.5"], ["--poll", "0"],
        ["--poll", "-1"], ["--poll", "nan"], ["--poll", "inf"], ["--poll", "1e-12"],
    ],
)  # fmt: skip
def test_bad_worker_arguments_are_refused_before_the_store_is_touched(tmp_path: Path, bad: list[str]) -> None:
    """They were refused (exit 2) only once the store was open, after bide's tables had been created in the
    user's database; and --poll inf (a worker that looks once) or 1e-12 (one that spins) were taken."""
    db = tmp_path / "theirs.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE theirs (x)")
    conn.close()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [*worker_command(f"sqlite:///{db}", "bide_"), "--once", *bad],
        capture_output=True, text=True, env=env, cwd=HERE, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"argument {bad[0]}:" in done.stderr
    with sqlite3.connect(db) as conn:
        assert [name for (name,) in conn.execute("SELECT name FROM sqlite_master")] == ["theirs"]
    conn.close()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def build(store:\n", "SyntaxError"),
        ("raise RuntimeError('no config')\n", "RuntimeError: no config"),
        ("def build(store):\n    raise KeyError('API_KEY')\n", "KeyError: 'API_KEY'"),
        # A module the app imports is missing: the app's to fix, not where the worker starts.
        ("import no_such_dependency\n", "No module named 'no_such_dependency'\n"),
    ],
    ids=["syntax-error", "raises-on-import", "build-raises", "its-import-missing"],
)
def test_worker_app_that_cannot_load_is_a_usage_error(tmp_path: Path, source: str, expected: str) -> None:
    done = worker_once_with(tmp_path, "brokenapp", source)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr
    assert "this is a bug" not in done.stderr


def test_an_app_module_not_found_says_where_the_worker_looks(tmp_path: Path) -> None:
    """The worker imports --app from the directory it starts in and PYTHONPATH; started elsewhere, it only
    said 'No module named myapp'."""
    (tmp_path / "elsewhere").mkdir()
    url = f"sqlite:///{tmp_path / 'w.db'}"
    bide.open_store(url).close()
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "myapp.agents:build",
         "--once"],
        capture_output=True, text=True, cwd=tmp_path / "elsewhere", timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "No module named 'myapp'; the worker imports it from the directory it starts in" in done.stderr
    assert f"({tmp_path / 'elsewhere'}) and PYTHONPATH" in done.stderr


CLOSE_FAILS_APP = """
import bide
from bide.testing import ScriptedModel, reply


def build(store):
    real_close = store.close

    def close():
        real_close()
        raise bide.StoreError("closing: the disk went away")

    store.close = close
    return bide.Agent(ScriptedModel([reply("ok")]), store=store)
"""


def test_worker_once_json_whose_store_fails_to_close_still_prints_its_one_report(tmp_path: Path) -> None:
    """What the pass did stands and was reported: a failure closing the store afterwards is said on stderr
    only, so stdout stays one JSON document and the exit code is the pass's."""
    done = worker_once_with(tmp_path, "closeapp", CLOSE_FAILS_APP, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["driven"] == 0 and report["failed"] == 0
    assert "closing the store failed: closing: the disk went away" in done.stderr
    assert "Traceback" not in done.stderr


NOISY_APP = '''
import subprocess

import bide
import ops_app
from bide.testing import ScriptedModel, call, reply

print("noisy app imported")


@bide.tool
def effect(order: str) -> str:
    """A side effect that talks."""
    print("the tool prints")
    subprocess.run(["echo", "and so does its subprocess"], check=False)  # (fails on a closed stdout)
    return "done"


def build(store):
    print("building")
    script = ScriptedModel([call("peek", order="o"), call("effect", order="o"), reply("finished")])
    return bide.Agent(script, store=store, tools=[ops_app.peek, effect], name="ops")
'''


def test_what_the_app_prints_does_not_break_the_json_report(env: dict[str, str], tmp_path: Path) -> None:
    """`worker --once --json` printed the app's own lines (at import, in build, in a tool and its
    subprocess) before its report: stdout was not one JSON document. They go to stderr."""
    (tmp_path / "noisy.py").write_text(NOISY_APP)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    url = f"sqlite:///{tmp_path / 'noisy.db'}"
    crash_run(url, "bide_", "r0", env)
    done = subprocess.run(
        [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "noisy:build", "--once",
         "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["completed"] == 1
    for line in ("noisy app imported", "building", "the tool prints", "and so does its subprocess"):
        assert line in done.stderr, done.stderr
    assert status(url, "bide_", "r0") == "completed"


def test_a_once_pass_reports_runs_a_live_lease_keeps_from_it(env: dict[str, str], tmp_path: Path) -> None:
    """Right after a crash, the dead driver's lease is still live: `--once` drove nothing and its report
    was all zeros, as for a store with nothing to recover. It counts such runs (`leased`) and says a later
    pass takes those whose driver died."""
    url, prefix = f"sqlite:///{tmp_path / 'leased.db'}", "bide_"
    for run_id in ("crashed", "free"):
        crash_run(url, prefix, run_id, env)  # its first model turn failed: unfinished, its lease released
    store = bide.open_store(url, table_prefix=prefix)
    try:  # as a driver killed a moment ago leaves it: a lease live for another minute
        assert store.lease("crashed", "dead-driver", now_ms=int(time.time() * 1000), ttl_ms=60_000).held
    finally:
        store.close()
    command = worker_command(url, prefix, "--once")
    json_pass = subprocess.run([*command, "--json"], env=env, cwd=HERE, capture_output=True, text=True)
    text_pass = subprocess.run(command, env=env, cwd=HERE, capture_output=True, text=True)
    report = json.loads(json_pass.stdout)
    assert json_pass.returncode == 0 and (report["leased"], report["completed"]) == (1, 1), json_pass.stderr
    assert status(url, prefix, "crashed") != "completed" and status(url, prefix, "free") == "completed"
    assert text_pass.returncode == 0, text_pass.stderr
    assert "; 1 held by a live lease (driven elsewhere, or its driver died" in text_pass.stdout


@pytest.mark.parametrize("key", ["@journal", "run:start"])
def test_a_once_pass_leaves_a_run_with_a_damaged_record_to_a_person(
    env: dict[str, str], tmp_path: Path, key: str
) -> None:
    """A record edited in the database failed the drive as the store failing: --once exited 6 (a store
    down, which cron retries) and every pass drove the run again to fail the same way. The run is
    unresumable, said once, and the pass exits 4 (a person must act)."""
    import sqlite3

    url, prefix = f"sqlite:///{tmp_path / 'damaged.db'}", "bide_"
    crash_run(url, prefix, "damaged", env)
    crash_run(url, prefix, "sound", env)
    with sqlite3.connect(tmp_path / "damaged.db") as db:
        db.execute(
            f"UPDATE {prefix}records SET data = ? WHERE run_id = 'damaged' AND key = ?", (b"{not json", key)
        )
    done = subprocess.run(
        [*worker_command(url, prefix, "--once"), "--json"], env=env, cwd=HERE, capture_output=True, text=True
    )
    report = json.loads(done.stdout)
    assert done.returncode == 4, done.stderr
    assert report["completed"] == 1 and report["failed"] == 0 and report["causes"] == {}, report
    assert f"its record {key!r} is damaged" in report["unresumable"]["damaged"]
    assert "restore the store from a backup" in report["unresumable"]["damaged"]


def test_a_run_in_another_journal_format_is_left_to_the_bide_that_wrote_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A run whose header names another journal format was 'the store failed' to bide cancel and resolve
    (exit 6) and to every pass of bide worker (exit 6 again at each pass), bide show said it was unreadable
    (exit 4). All say so now: exit 4, and the worker leaves it as unresumable."""
    import sqlite3

    url, prefix = f"sqlite:///{tmp_path / 'formats.db'}", "bide_"
    crash_run(url, prefix, "newer", env)
    with sqlite3.connect(tmp_path / "formats.db") as db:
        where = "run_id = 'newer' AND key = '@journal'"
        (data,) = db.execute(f"SELECT data FROM bide_records WHERE {where}").fetchone()
        header = json.loads(data) | {"format": "bide.journal/2"}
        db.execute(f"UPDATE bide_records SET data = ? WHERE {where}", (json.dumps(header).encode(),))
    command = [sys.executable, "-m", "bide._cli"]
    for args in (["cancel", "newer"], ["resolve", "newer", "c0.0", "--not-started", "--json"]):
        done = subprocess.run([*command, *args, "--store", url], env=env, capture_output=True, text=True)
        assert done.returncode == 4 and "is in journal format 'bide.journal/2'" in done.stderr, done.stderr
    assert json.loads(done.stdout)["reason"] == "unreadable"
    passed = subprocess.run(
        [*worker_command(url, prefix, "--once"), "--json"], env=env, cwd=HERE, capture_output=True, text=True
    )
    assert passed.returncode == 4, passed.stderr
    assert "is in journal format 'bide.journal/2'" in json.loads(passed.stdout)["unresumable"]["newer"]


def _serving_line(worker: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """Read the worker's stderr up to the line saying it serves (its stop signals are its own from then)."""
    assert worker.stderr is not None
    stream, lines = worker.stderr, queue.Queue[str]()

    def read() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)
            if "bide worker: serving" in line:
                return
        lines.put("")  # it ended

    threading.Thread(target=read, daemon=True).start()
    while True:
        line = lines.get(timeout=timeout)
        assert line, f"the worker ended before serving: {worker.communicate()}"
        if "bide worker: serving" in line:
            return line


def test_a_worker_started_under_nohup_outlives_sighup(env: dict[str, str], tmp_path: Path) -> None:
    """Handling SIGHUP replaced the "ignore" nohup sets: logging out stopped a worker meant to outlive the
    terminal."""
    url = f"sqlite:///{tmp_path / 'nohup.db'}"
    bide.open_store(url).close()
    worker = subprocess.Popen(
        worker_command(url, "bide_", "--poll", "0.2"), env=env, cwd=HERE, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )  # fmt: skip
    try:
        # Its loop is up and the stop signals are its own once it says so (a fixed sleep of 2 s was too
        # short under load: the SIGTERM below then met Python's default and ended it with -15).
        said = _serving_line(worker)
        # The line docs/operations.md quotes (a supervisor may wait for it), with the default table prefix.
        assert said.strip() == (
            f"bide worker: serving 1 agent(s) on {url}, looking for runs to recover every 0.2 s; SIGINT, "
            "SIGTERM or SIGHUP stops it"
        )
        worker.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert worker.poll() is None, "the worker stopped on an ignored SIGHUP"
        worker.send_signal(signal.SIGTERM)
        _, errors = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, errors


def test_a_worker_run_in_the_process_prints_its_report_where_it_is_captured_and_keeps_its_handlers(
    env: dict[str, str], tmp_path: Path
) -> None:
    """In the process: the --json report went to descriptor 1 past a redirect of sys.stdout, and the loop's
    end left SIGHUP at its default, so the host's next SIGHUP ended it."""
    url = f"sqlite:///{tmp_path / 'inproc.db'}"
    crash_run(url, "bide_", "r0", env)
    code = (
        "import contextlib, io, json, signal, sys\n"
        "from bide._cli import main\n"
        "def mine(signum, frame): pass\n"
        "signal.signal(signal.SIGHUP, mine)\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    code = main(['worker', '--store', sys.argv[1], '--app', 'ops_app:build', '--once', '--json'])\n"
        "print(code, json.loads(out.getvalue())['completed'], signal.getsignal(signal.SIGHUP) is mine)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, env=env,
                          cwd=HERE, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 1 True", done.stdout


def test_a_worker_with_a_closed_standard_output_or_error_still_drives_its_runs(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Standard output closed (`>&-`): the worker crashed before its pass (exit 1, two tracebacks); it
    drives the runs and says its report is lost (exit 2). Standard error closed (`2>&-`): the saved copy of
    standard output took descriptor 2, and a side effect printing to it halted its run for a person."""
    (tmp_path / "noisy.py").write_text(NOISY_APP)  # its tool prints: to a closed stdout, as before, nothing
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    url = f"sqlite:///{tmp_path / 'closed.db'}"
    crash_run(url, "bide_", "r0", env)
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "noisy:build",
               "--once", "--json"]  # fmt: skip
    no_stdout = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=HERE, timeout=60, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert no_stdout.returncode == 2, no_stdout.stderr
    assert "Traceback" not in no_stdout.stderr and "could not be written" in no_stdout.stderr
    assert status(url, "bide_", "r0") == "completed"
    results = [json.loads(e.data) for e in _store_entries(url, "r0") if e.key.startswith("result:")]
    assert results and not any(r["is_error"] for r in results), results  # the printing tool ran as it does
    crash_run(url, "bide_", "r1", env)
    no_stderr = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                               cwd=HERE, timeout=60, preexec_fn=lambda: os.close(2))  # fmt: skip
    assert no_stderr.returncode == 0
    assert json.loads(no_stderr.stdout)["completed"] == 1
    assert status(url, "bide_", "r1") == "completed"
    crash_run(url, "bide_", "r2", env)
    with open("/dev/full", "w") as full:  # the report cannot be written: said, exit 2, not a bug (exit 3)
        no_room = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True, env=env, cwd=HERE,
                                 timeout=60)  # fmt: skip
    assert no_room.returncode == 2, no_room.stderr
    assert "could not be written" in no_room.stderr and "Traceback" not in no_room.stderr
    assert status(url, "bide_", "r2") == "completed"


@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_serving_worker_whose_standard_error_cannot_be_written_goes_on(
    env: dict[str, str], tmp_path: Path, stderr: str
) -> None:
    """The line saying the worker serves, written to a closed or full standard error, ended the worker at
    once (exit 1). It serves: it drives a run, and stops on SIGTERM with exit 0."""
    url = f"sqlite:///{tmp_path / 'quiet.db'}"
    crash_run(url, "bide_", "r0", env)
    with open("/dev/full", "w") as full:
        worker = subprocess.Popen(
            worker_command(url, "bide_", "--poll", "0.2"), env=env, cwd=HERE, stdout=subprocess.DEVNULL,
            stderr=full, preexec_fn=(lambda: os.close(2)) if stderr == "closed" else None,
        )  # fmt: skip
    try:
        wait_until(lambda: status(url, "bide_", "r0") == "completed", "the worker to resume the run", 60)
        assert worker.poll() is None
    finally:
        _stopped_by(worker, signal.SIGTERM, timeout=30)
    assert worker.returncode == 0


def _store_entries(url: str, run_id: str) -> list[bide.Entry]:
    store = bide.open_store(url)
    try:
        return store.load(run_id)
    finally:
        store.close()
