"""Many processes over one store: agent processes and replica processes, killed with SIGKILL at random and
restarted. Every replica converges to the log-order state, every state is valid, and every scripted call
appended exactly one event (none twice, none lost)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bide
from govern.runtime._agents import event_id_for
from govern.runtime._eventlog import EventLog
from govern.runtime._replica import Replica

from .conftest import POSTGRES_URL
from .machines import order_machine

HERE = Path(__file__).parent
AGENTS, CALLS, REPLICAS = 3, 12, 2


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HERE / script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_killed_and_restarted_processes_converge(log_url: str, log_name: str, tmp_path: Path) -> None:
    # A fresh seed per run explores other kill points and delivery orders; a failure prints it, and
    # BIDE_TEST_SEED=<seed> replays the same scripts, kill choices and delivery orders.
    seed = int(os.environ.get("BIDE_TEST_SEED") or random.SystemRandom().randrange(10**6))
    print(f"seed {seed}")
    rng = random.Random(seed)
    store_url = f"sqlite:///{tmp_path}/journal.db" if log_url.startswith("sqlite") else POSTGRES_URL
    EventLog(log_url, name=log_name).bind(order_machine())
    done = tmp_path / "done"
    runs = [f"{log_name}-agent{i}" for i in range(AGENTS)]
    agent_args = {
        run: (store_url, log_url, log_name, run, str(seed * 100 + i), str(CALLS))
        for i, run in enumerate(runs)
    }
    replica_args = {
        i: (log_url, log_name, str(seed), str(AGENTS * CALLS), str(tmp_path / f"cp{i}.json"), str(done))
        for i in range(REPLICAS)
    }
    agents = {run: spawn("_agent_worker.py", *agent_args[run]) for run in runs}
    replicas = {i: spawn("_replica_worker.py", *replica_args[i]) for i in range(REPLICAS)}
    log = EventLog(log_url, name=log_name)
    kills = 0
    try:
        # Kill two agents mid-run (once a random number of their events, from 2 to CALLS - 2, is in the
        # log: an agent can append all of its events within a few milliseconds) and one replica.
        for victim in rng.sample(runs, 2):
            target = rng.randint(2, CALLS - 2)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                mine = sum(1 for e in log.read() if e.producer == victim)
                if mine >= target or agents[victim].poll() is not None:
                    break
                time.sleep(0.002)
            if agents[victim].poll() is None:
                os.kill(agents[victim].pid, signal.SIGKILL)
                status = agents[victim].wait()
                if status == -signal.SIGKILL:
                    kills += 1
                    agents[victim] = spawn("_agent_worker.py", *agent_args[victim])
                else:  # it finished between the poll and the kill: its output is checked below
                    assert status == 0
        which = rng.randrange(REPLICAS)
        time.sleep(rng.uniform(0.1, 0.4))
        if replicas[which].poll() is None:
            os.kill(replicas[which].pid, signal.SIGKILL)
            replicas[which].wait()
            replicas[which] = spawn("_replica_worker.py", *replica_args[which])
        for run, proc in agents.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"agent {run} failed:\n{err}"
            assert out.strip() == "done"
        done.touch()
        outputs = []
        for i, proc in replicas.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"replica {i} failed:\n{err}"
            outputs.append(json.loads(out))
    finally:
        for proc in [*agents.values(), *replicas.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert kills >= 1

    stored = log.read()
    assert [e.position for e in stored] == list(range(AGENTS * CALLS))
    assert len({e.id for e in stored}) == len(stored)
    store = bide.open_store(store_url)
    for run in runs:
        journal = bide.Journal(store, run).load()
        calls = [r for r in journal.records() if isinstance(r, bide.ToolResult)]
        assert len(calls) == CALLS and not any(r.is_error for r in calls)
        expected = {event_id_for(run, r.call_id, r.tool, r.result["record"]) for r in calls}
        assert expected == {e.id for e in stored if e.producer == run}, "an event was lost or appended twice"
    store.close()

    machine = order_machine()
    reference = Replica(machine, log)
    reference.sync()
    for output in outputs:
        assert output["position"] == len(stored)
        assert output["digest"] == reference.digest()
        assert output["states"] == reference.states()
    for key in reference.records():
        assert machine.is_valid(reference.state_id(key))
