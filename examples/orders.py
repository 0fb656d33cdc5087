"""Orders: payment, shipping and stock, with one invariant and a declared independent pair.

Run it (`python examples/orders.py`) to build the machine and print its verification report. The
report lists pay/ship and ship/restock as causal-order obligations: a shipment must be delivered
after the payment and the restock it depends on, never before.
"""

from __future__ import annotations

from govern import Registry

registry = Registry("orders")
status = registry.enum("status", ["pending", "paid", "shipped", "cancelled"])
paid = registry.bool("paid")
stock = registry.int("stock", 0, 5)

registry.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
registry.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
registry.event("ship", guard=(status == "paid") & (stock > 0), effect={status: "shipped", stock: stock - 1})
registry.event("restock", guard=stock < 5, effect={stock: stock + 1})
registry.independent("pay", "restock")

if __name__ == "__main__":
    machine = registry.build()
    state = machine.replay(["restock", "pay", "ship"])
    print(machine.report)
    print()
    print("restock, pay, ship ->", dict(state))
