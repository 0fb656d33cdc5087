"""The example machines run as scripts and build (or, for the naive one, are rejected) as documented."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from govern import NotConvergent, Registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MACHINES = ["orders.py", "ledger.py", "tickets.py", "naive_pay_ship.py"]


@pytest.mark.parametrize("name", MACHINES)
def test_example_runs_as_a_script(name: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    if name == "naive_pay_ship.py":
        assert "rejected, as intended" in proc.stdout and "order 2: ship then pay" in proc.stdout
    else:
        assert "CONVERGES" in proc.stdout and "oracle" in proc.stdout


@pytest.mark.parametrize("name", MACHINES)
def test_example_defines_a_top_level_registry(name: str) -> None:
    namespace = runpy.run_path(str(EXAMPLES / name), run_name="example")
    registries = [v for v in namespace.values() if isinstance(v, Registry)]
    assert len(registries) == 1
    if name == "naive_pay_ship.py":
        with pytest.raises(NotConvergent):
            registries[0].build()
    else:
        assert registries[0].build().report.cc1


def test_ledger_caps_the_balance_and_flags_the_overflow() -> None:
    namespace = runpy.run_path(str(EXAMPLES / "ledger.py"), run_name="example")
    m = namespace["registry"].build()
    assert dict(m.replay(["deposit"] * 7)) == {"balance": 5, "frozen": False, "flagged": True}
    assert dict(m.replay(["freeze", "withdraw", "deposit"])) == {
        "balance": 1,
        "frozen": True,
        "flagged": False,
    }
    assert ("deposit", "withdraw") in [d.events for d in m.report.obligations]


def test_tickets_need_both_approvals_in_either_order() -> None:
    namespace = runpy.run_path(str(EXAMPLES / "tickets.py"), run_name="example")
    m = namespace["registry"].build()
    one = m.replay(["submit", "lead_approves", "security_approves", "approve"])
    two = m.replay(["submit", "security_approves", "lead_approves", "approve"])
    assert one == two and one["status"] == "approved"
    assert m.replay(["submit", "lead_approves", "approve"])["status"] == "in_review"
