"""Machines the governed-agents tests run: an order record with causal-order obligations and a
non-idempotent event, so every delivery rule is exercised."""

from __future__ import annotations

from functools import cache
from typing import Any

import govern
from govern.machine._machine import Machine
from govern.runtime._eventlog import EventLog
from govern.runtime._replica import Checkpoint


@cache
def order_machine() -> Machine:
    """One order: pay/cancel race (an obligation), ship needs payment (a refund after shipping is
    compensated by reopening the order), restock is not idempotent."""
    r = govern.Registry("order")
    status = r.enum("status", ["open", "paid", "shipped", "cancelled"])
    paid = r.bool("paid")
    stock = r.int("stock", 0, 3)
    r.invariant("shipped_orders_are_paid", holds=(status != "shipped") | paid, repair={status: "open"})
    r.event("pay", guard=status == "open", effect={status: "paid", paid: True})
    r.event("ship", guard=(status == "paid") & (stock > 0), effect={status: "shipped", stock: stock - 1})
    r.event("cancel", guard=status == "open", effect={status: "cancelled"})
    r.event("restock", guard=stock < 3, effect={stock: stock + 1})
    r.event("refund", guard=paid, effect={paid: False})
    r.independent("pay", "restock")
    r.independent("cancel", "restock")
    r.independent("refund", "restock")
    return r.build()


def order_log(url: str = "memory://", **options: Any) -> EventLog:
    """An event log for `order_machine`: its first append binds it."""
    return EventLog(url, machine=order_machine(), **options)


def resealed(checkpoint: Checkpoint, **update: Any) -> Checkpoint:
    """`checkpoint` with `update` applied and its seal recomputed: an edit the seal cannot catch, to test
    the checks behind it."""
    edited = Checkpoint(**{**checkpoint.model_dump(), **update})
    return Checkpoint(**{**edited.model_dump(), "seal": edited.expected_seal()})
