"""A gated tool whose arguments hold a set (`set[str]`, a model's `frozenset`, a dict of sets) could never be
approved across processes: the arguments were dumped in each set's hash order, which differs between
processes (string hashes are salted per process), so the digest the approver signed in one process was
not the call's digest in the next, and the worker waited for ever ("the arguments changed between
drives"). Sets are now dumped sorted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import bide_cli

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

DUMP = """
import json
import set_arguments_app as app
print(json.dumps(app.tag.json_arguments(app.tag.validate({arguments}))))
"""
START = """
import sys
import bide
import set_arguments_app as app
store = bide.open_store(sys.argv[1])
try:
    app.build(store).run_sync("r", "tag it")
except bide.ApprovalPending as paused:
    print("paused:", paused.reason)
"""


def _env(tmp_path: Path, seed: int) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": str(seed), "SET_APP_DIR": str(tmp_path)}


def test_the_arguments_of_a_call_are_dumped_the_same_in_every_process(tmp_path: Path) -> None:
    assert bide_cli("keygen", str(tmp_path / "alice.key"), cwd=tmp_path).returncode == 0
    arguments = {
        "item": "x",
        "tags": ["red", "green", "blue", "yellow", "cyan", "magenta"],
        "label": {"name": "l", "aliases": ["a", "b", "c", "d", "e"]},
        "by_colour": {"warm": ["red", "yellow", "pink"], "cold": ["blue", "cyan", "grey"]},
    }
    code = DUMP.format(arguments=repr(arguments))
    dumps = [
        subprocess.run([sys.executable, "-c", code], env=_env(tmp_path, seed), capture_output=True, text=True)
        for seed in range(1, 6)
    ]
    assert all(d.returncode == 0 for d in dumps), [d.stderr for d in dumps]
    assert len({d.stdout for d in dumps}) == 1, [d.stdout for d in dumps]
    dumped = json.loads(dumps[0].stdout)
    assert dumped["tags"] == sorted(arguments["tags"])
    assert dumped["label"]["aliases"] == ["a", "b", "c", "d", "e"]
    assert dumped["by_colour"] == {"warm": ["pink", "red", "yellow"], "cold": ["blue", "cyan", "grey"]}


def test_a_call_with_sets_approved_in_one_process_runs_in_another(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'bide.db'}"
    key = str(tmp_path / "alice.key")
    assert bide_cli("keygen", key, cwd=tmp_path).returncode == 0
    start = [sys.executable, "-c", START, store]
    first = subprocess.run(start, env=_env(tmp_path, 1), capture_output=True, text=True, timeout=120)
    assert "paused:" in first.stdout, (first.stdout, first.stderr)
    approved = bide_cli("approve", "--store", store, "r", "c0.0", "--key", key, cwd=tmp_path)
    assert approved.returncode == 0, approved.stderr
    app = ["--store", store, "--app", "set_arguments_app:build", "--once"]
    worker = [sys.executable, "-m", "bide._cli", "worker", *app]
    second = subprocess.run(worker, env=_env(tmp_path, 2), capture_output=True, text=True, timeout=120)
    assert "1 completed" in second.stdout, (second.stdout, second.stderr)
