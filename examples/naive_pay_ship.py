"""Rejected on purpose: the classic naive pay/ship machine that footprint shortcuts used to certify.

`pay` writes `paid`; `ship` is guarded on `paid` and writes `shipped`. No invariant links them, so
their write sets look disjoint, yet delivering `ship` before `pay` leaves the order unshipped while
`pay` then `ship` ships it. With no independence declared every pair is checked, and the build
refuses the machine with that counterexample (the guard's read of `paid` is part of the footprint).
"""

from __future__ import annotations

import sys

from govern import NotConvergent, Registry

registry = Registry("naive_pay_ship")
paid = registry.bool("paid")
shipped = registry.bool("shipped")

registry.event("pay", effect={paid: True})
registry.event("ship", guard=paid, effect={shipped: True})

if __name__ == "__main__":
    try:
        registry.build()
    except NotConvergent as exc:
        print("rejected, as intended:\n")
        print(exc)
        sys.exit(0)
    print("BUG: the naive pay/ship machine was accepted")
    sys.exit(1)
