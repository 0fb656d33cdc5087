"""A shared ledger with a balance cap, a compliance freeze and an overflow flag.

Deposits are always accepted; a deposit that would push the balance over the cap is compensated
(clamped to the cap) and flagged for review. Withdrawals need funds and an unfrozen account.
Deposits commute with freezing and unfreezing, and reviews commute with freezing and with
withdrawals; the build proves it. What does not commute (a withdrawal racing the deposit that funds
it, a review racing the overflow it clears) is reported as a causal-order obligation.
"""

from __future__ import annotations

from govern import Registry

CAP = 5

registry = Registry("ledger")
balance = registry.int("balance", 0, CAP + 1)  # one slot above the cap: an overflowing deposit lands there
frozen = registry.bool("frozen")
flagged = registry.bool("flagged")

registry.invariant("balance_cap", holds=balance <= CAP, repair={balance: CAP, flagged: True})
registry.event("deposit", guard=balance <= CAP, effect={balance: balance + 1})
registry.event("withdraw", guard=~frozen & (balance > 0), effect={balance: balance - 1})
registry.event("freeze", effect={frozen: True})
registry.event("unfreeze", effect={frozen: False})
registry.event("review", effect={flagged: False})
for a, b in [
    ("deposit", "freeze"),
    ("deposit", "unfreeze"),
    ("review", "freeze"),
    ("review", "unfreeze"),
    ("review", "withdraw"),
]:
    registry.independent(a, b)

if __name__ == "__main__":
    machine = registry.build()
    print(machine.report.text(witnesses=False))
    print()
    full = machine.replay(["deposit"] * 7)
    print("seven deposits ->", dict(full))
