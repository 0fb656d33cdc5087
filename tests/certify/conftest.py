"""Shared machines and helpers for the certificate and `govern` command tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from govern import Registry
from govern.certificate._certificate import Certificate
from govern.certificate._make import certify

# A machine file with two registries: one with every rule an expression, one with a Python callable.
MACHINES = '''\
from govern import Registry

orders = Registry("orders")
status = orders.enum("status", ["pending", "paid", "shipped", "cancelled"])
paid = orders.bool("paid")
stock = orders.int("stock", 0, 5)
orders.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
orders.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
orders.event("ship", guard=status == "paid", effect={status: "shipped"})
orders.event("restock", guard=stock < 5, effect={stock: stock + 1})
orders.independent("pay", "restock")
orders.independent("ship", "restock")

lamp = Registry("lamp")
on = lamp.bool("on")
level = lamp.int("level", 0, 3)
lamp.event("switch_on", guard=lambda s: True, effect=lambda s: {"on": True})
lamp.event("brighten", guard=level < 3, effect={level: level + 1})
'''

# Two events that do not commute, checked as independent: not convergent.
DIVERGENT = '''\
from govern import Registry

switch = Registry("switch")
on = switch.bool("on")
switch.event("turn_on", effect={on: True})
switch.event("turn_off", effect={on: False})
'''


def orders_registry() -> Registry:
    namespace: dict[str, object] = {}
    exec(MACHINES, namespace)
    registry = namespace["orders"]
    assert isinstance(registry, Registry)
    return registry


def lamp_registry() -> Registry:
    namespace: dict[str, object] = {}
    exec(MACHINES, namespace)
    registry = namespace["lamp"]
    assert isinstance(registry, Registry)
    return registry


@pytest.fixture(scope="session")
def orders_cert() -> Certificate:
    return certify(orders_registry())


@pytest.fixture(scope="session")
def lamp_cert() -> Certificate:
    return certify(lamp_registry())


@pytest.fixture
def machine_dir(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text(MACHINES)
    (tmp_path / "divergent.py").write_text(DIVERGENT)
    return tmp_path


def govern(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real `govern` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "govern", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
