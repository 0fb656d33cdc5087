"""When a build runs the oracle's rules checker, and that the report says so either way."""

from __future__ import annotations

import govern
from govern.oracle._gate import RULES_CHECK_MAX_ENTRIES


def _chain(n: int) -> govern.Registry:
    r = govern.Registry(f"chain{n}")
    flags = [r.bool(f"f{i}") for i in range(n)]
    for i in range(n - 1):
        r.invariant(f"c{i}", holds=~flags[i] | flags[i + 1], repair={flags[i + 1]: True})
    for i in range(n):
        r.event(f"set{i}", effect={flags[i]: True})
    return r


def test_small_machines_have_their_rules_checked_on_every_build() -> None:
    machine = _chain(8).build()
    assert machine.report.oracle is not None
    assert machine.report.oracle["rules_checked"].startswith("checked")


def test_large_machines_defer_the_rules_check_unless_asked() -> None:
    n = 18
    assert (1 << n) * (n + 1) > RULES_CHECK_MAX_ENTRIES
    deferred = _chain(n).build()
    assert deferred.report.oracle is not None
    assert deferred.report.oracle["rules_checked"].startswith("deferred")
    assert "deferred" in deferred.report.text()
    forced = _chain(n).build(rules_check="always")
    assert forced.report.oracle is not None
    assert forced.report.oracle["rules_checked"].startswith("checked")
