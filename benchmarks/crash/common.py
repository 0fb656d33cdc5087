"""What the three crash-benchmark workflows share: the external effect ledger, the crash points, and the
command line every workflow script answers to.

The workflow (the same for every framework): `prepare` reads the order from `order.json`, `charge` and
`send_receipt` are side effects, then an answer. A side effect appends one JSON line to `effects.log` in the
state directory and fsyncs it before returning, so how often it fired is counted outside the process that
fired it: a SIGKILL cannot take a fired effect back.

A workflow script is run as

    python <framework>_flow.py --state DIR --workflow ID [--crash POINT] [--kill-after SECONDS]
    python <framework>_flow.py --state DIR --bench N
    python bide_flow.py ... --reconcile         (bide with a reconciler on each side effect)

and prints one JSON line at the end: `{"status": "completed" | "halted", ...}` for a run, or the per-workflow
durations for `--bench`. A process that died printed nothing (its exit status is -9).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEDGER = "effects.log"
ORDER = "order.json"
EFFECTS = ("charge", "send_receipt")
# Where a first process may be told to die: just before a side effect fires, or in the window after it
# fired (appended and fsynced) and before the framework could record that it did.
CRASH_POINTS = tuple(f"{when}:{effect}" for effect in EFFECTS for when in ("before", "after"))

_crash_point: str | None = None


@dataclass(frozen=True)
class Options:
    state: Path
    workflow: str
    crash: str | None
    kill_after: float | None
    bench: int
    reconcile: bool


def parse_args(description: str) -> Options:
    """Parse the shared command line and arm the crash point it names (if any)."""
    global _crash_point
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--state", type=Path, required=True, help="the trial's directory (databases, ledger)")
    ap.add_argument("--workflow", default="order-1", help="the workflow (run, thread) id")
    ap.add_argument("--crash", choices=CRASH_POINTS, help="SIGKILL this process at this point")
    ap.add_argument("--kill-after", type=float, help="SIGKILL this process this many seconds into the run")
    ap.add_argument("--bench", type=int, default=0, help="run N clean workflows and print their durations")
    ap.add_argument("--reconcile", action="store_true", help="bide only: give each side effect a reconciler")
    ns = ap.parse_args()
    ns.state.mkdir(parents=True, exist_ok=True)
    _crash_point = ns.crash
    return Options(ns.state, ns.workflow, ns.crash, ns.kill_after, ns.bench, ns.reconcile)


def write_order(state: Path, workflow: str) -> None:
    """The record `prepare` reads (written by the driver before the first process starts)."""
    (state / ORDER).write_text(json.dumps({"workflow": workflow, "customer": "alice", "cents": 500}))


def read_order(state: Path) -> dict[str, Any]:
    """The read step: the order to charge."""
    order: dict[str, Any] = json.loads((state / ORDER).read_text())
    return order


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def fire(state: Path, workflow: str, effect: str, result: str, key: str = "") -> str:
    """Perform side effect `effect` of `workflow`: append one line to the ledger and fsync it. Dies at the
    armed crash point. Returns `result` (what the effect reports back to the framework)."""
    if _crash_point == f"before:{effect}":
        _die()
    line = json.dumps({"workflow": workflow, "effect": effect, "key": key, "result": result}) + "\n"
    fd = os.open(state / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if _crash_point == f"after:{effect}":
        _die()
    return result


def ledger(state: Path) -> list[dict[str, str]]:
    """Every effect that fired in this state directory, in order."""
    path = state / LEDGER
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fired(state: Path, workflow: str) -> Counter[str]:
    """How many times each side effect of `workflow` fired."""
    return Counter(e["effect"] for e in ledger(state) if e["workflow"] == workflow)


def arm_kill(after: float | None) -> None:
    """SIGKILL this process `after` seconds from now (a random moment chosen by the driver)."""
    if after is not None:
        timer = threading.Timer(after, _die)
        timer.daemon = True
        timer.start()


def answer(order: dict[str, Any], charged: str, receipt: str) -> str:
    return f"order {order['workflow']}: {charged}; {receipt}"


def charge_result(order: dict[str, Any]) -> str:
    return f"charged {order['customer']} {order['cents']} cents"


def receipt_result(order: dict[str, Any]) -> str:
    return f"receipt sent to {order['customer']}"


def report(status: str, started: float, **extra: Any) -> None:
    """Print the run's outcome line for the driver (`elapsed` is seconds since the run was started)."""
    print(json.dumps({"status": status, "elapsed": time.perf_counter() - started, **extra}), flush=True)


def report_bench(durations: list[float], **extra: Any) -> None:
    """Print the clean workflows' durations (seconds) for the driver, with any framework-specific figure."""
    print(json.dumps({"durations": durations, **extra}), flush=True)
