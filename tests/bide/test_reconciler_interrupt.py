"""A Ctrl-C while a synchronous reconciler is blocked (a lookup that hangs) ends the process at once.

The drive stopped waiting for the reconciler at once, as docs/bide.md says, but the reconciler ran in
asyncio's default executor, whose threads `asyncio.run` waits for as it shuts down: the process stayed up
until the lookup returned (30 s in the tester's case, 600 s in a worker's), and a worker's second stop
signal did nothing either. What a reconciler answers after its drive stopped waiting is not acted on, so
its thread is a daemon of its own now: nothing keeps the process for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

APP = r"""
import pathlib, time
import bide
from bide.testing import ScriptedModel, call, reply

HERE = pathlib.Path(__file__).parent


def look_up(attempt):
    (HERE / "entered").write_text("looking")
    time.sleep(300)  # a lookup that hangs
    return bide.Outcome.not_started()


@bide.tool(timeout=5, reconcile=look_up)
def send(to: str) -> str:
    "Send a message (the connection drops after the request went out)."
    raise OSError("lost after the request went out")


def build(store, clock=None):
    model = ScriptedModel([call("send", to="x"), reply("sent")])
    return bide.Agent(model, store=store, tools=[send], clock=clock or time.time, clock_skew=0.0)
"""


def _halted_run(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The app hangs.py (APP) in `tmp_path`, and a SQLite store there whose run "r" halted on its `send`
    call, its deadline past: (the store's URL, the environment that imports hangs)."""
    (tmp_path / "hangs.py").write_text(APP)
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    path = os.pathsep.join(p for p in (str(tmp_path), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    seed = "import time, bide, hangs\n" \
        "store = bide.open_store(__import__('sys').argv[1])\n" \
        "try:\n" \
        "    hangs.build(store, clock=lambda: time.time() - 60).run_sync('r', 'go')\n" \
        "except bide.OutcomeUnknown:\n" \
        "    pass\n"  # fmt: skip
    seeded = subprocess.run([sys.executable, "-c", seed, url], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    return url, env


CHILD = "import sys, bide, hangs\nhangs.build(bide.open_store(sys.argv[1])).run_sync('r', 'go')\n"


def test_a_ctrl_c_while_a_synchronous_reconciler_hangs_ends_the_process(tmp_path: Path) -> None:
    url, env = _halted_run(tmp_path)
    entered = tmp_path / "entered"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not entered.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the reconciler was never asked"
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        # Not a speed figure: before, the process lived on until the lookup's 300 s were over.
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0 and "KeyboardInterrupt" in err, err
    store = bide.open_store(url)
    try:
        status = bide.run_status(store, "r")
        assert status.status == "halted", status  # nothing was decided: the call waits for a person
    finally:
        store.close()


def test_a_second_signal_cancels_a_once_pass_whose_reconciler_hangs(tmp_path: Path) -> None:
    """`bide worker --once` stopped only taking new runs at a signal, and no signal cancelled its drives: a
    pass whose synchronous reconciler hung could not be stopped but by SIGKILL, and said nothing. A second
    signal cancels its drives, as it does a serving worker's, and it exits 130 saying so; the run stays
    halted, nothing decided."""
    url, env = _halted_run(tmp_path)
    command = [sys.executable, "-m", "bide._cli", "worker", "--store", url, "--app", "hangs:build", "--once"]
    worker = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "entered").exists():
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline, "the reconciler was never asked"
            time.sleep(0.05)
        worker.send_signal(signal.SIGINT)
        time.sleep(1.0)
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=60)  # before: until the lookup's 300 s were over
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 130, err
    assert "cancelling this pass's drives" in err and "the pass was cancelled" in err, err
    store = bide.open_store(url)
    try:
        assert bide.run_status(store, "r").status == "halted"
    finally:
        store.close()
