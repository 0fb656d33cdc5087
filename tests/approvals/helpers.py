"""An approved 2-of-3 run and the tools of a forger who holds the log key: rewrite records, re-sign."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bide
from bide.approvals import ApprovalGate, submit_decision
from bide.audit import AuditLog, EvidencePackage, SigningKey
from bide.testing import ScriptedModel, call, reply

ROOT = Path(__file__).resolve().parents[2]
APPROVERS = {n: SigningKey.generate() for n in ("alice", "bob", "carol")}
LOG_KEY = SigningKey.generate()


def approved_run(
    approvers: dict[str, SigningKey] = APPROVERS, safety: Any = None, run_id: str = "r"
) -> tuple[bide.MemoryStore, str]:
    """A run whose `wire(amount=100, to="acme")` call bob denied and alice and carol approved; it ran."""
    gate = ApprovalGate.k_of_n(2, {n: k.public for n, k in approvers.items()})
    kwargs: dict[str, Any] = {"gate": gate} if safety is None else {"gate": gate, "safety": safety}

    @bide.tool(**kwargs)
    def wire(amount: int, to: str) -> str:
        """Wire money."""
        return f"sent {amount} to {to}"

    store = bide.MemoryStore()

    def agent() -> bide.Agent:
        model = ScriptedModel([call("wire", amount=100, to="acme"), reply("done")])
        return bide.Agent(model, store=store, tools=[wire])

    try:
        agent().run_sync(run_id, "pay acme")
        raise AssertionError("the gate did not pause the run")
    except bide.ApprovalPending as pause:
        call_id = pause.call_id
    names = list(approvers)
    submit_decision(store, run_id, call_id, approvers[names[1]], approve=False)
    submit_decision(store, run_id, call_id, approvers[names[0]], approve=True)
    submit_decision(store, run_id, call_id, approvers[names[2]], approve=True)
    assert agent().run_sync(run_id, "pay acme").answer == "done"
    return store, call_id


def records(store: bide.Store, run_id: str = "r") -> list[tuple[str, dict[str, Any]]]:
    """The run's records, decoded, in journal order."""
    return [(e.key, json.loads(e.data)) for e in store.load(run_id)]


def rewrite(
    store: bide.Store,
    change: Callable[[str, dict[str, Any]], dict[str, Any] | None],
    run_id: str = "r",
) -> bide.MemoryStore:
    """A copy of the run with every record passed through `change(key, record)` (None drops it): what an
    operator can do to the journal before exporting it with the log key."""
    forged = bide.MemoryStore()
    for key, rec in records(store, run_id):
        new = change(key, json.loads(json.dumps(rec)))
        if new is not None:  # stored under the original key; verifiers read the key inside the bytes
            forged.insert_many(run_id, [(key, bide.canonical_json(new))])
    return forged


def evidence(store: bide.Store, run_id: str = "r") -> EvidencePackage:
    """The evidence package of the run, signed with the log key."""
    return AuditLog(store, LOG_KEY).evidence(run_id)


def _module_cli(module: str, args: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in a subprocess, the worktree on the path."""
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def audit_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`bide-audit ARGS` in a subprocess (the worktree on the path)."""
    return _module_cli("bide.audit._cli", args, cwd)


def bide_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`bide ARGS` in a subprocess (the worktree on the path)."""
    return _module_cli("bide._cli", args, cwd)
