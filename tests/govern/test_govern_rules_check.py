"""Every build runs the oracle's rules checker when every rule is an expression, whatever the size, and
the report says so (and says when it cannot: rules written as Python callables)."""

from __future__ import annotations

import govern


def _chain(n: int, *, callables: bool = False) -> govern.Registry:
    r = govern.Registry(f"chain{n}")
    flags = [r.bool(f"f{i}") for i in range(n)]
    for i in range(n - 1):
        r.invariant(f"c{i}", holds=~flags[i] | flags[i + 1], repair={flags[i + 1]: True})
    for i in range(n):
        if callables:
            r.event(f"set{i}", effect=lambda s, i=i: {f"f{i}": True})
        else:
            r.event(f"set{i}", effect={flags[i]: True})
    return r


def test_small_machines_have_their_rules_checked_on_every_build() -> None:
    machine = _chain(8).build()
    assert machine.report.oracle is not None
    assert machine.report.oracle["rules_checked"].startswith("checked")


def test_large_machines_have_their_rules_checked_too() -> None:
    """chain(18): 262,144 states x 19 tables, five million entries (builds used to defer above four)."""
    machine = _chain(18).build()
    assert machine.report.oracle is not None
    assert machine.report.oracle["rules_checked"].startswith("checked")
    assert "Govern.Rules.check_rules_sound" in machine.report.text()


def test_callable_rules_cannot_be_checked_and_the_report_says_so() -> None:
    machine = _chain(4, callables=True).build()
    assert machine.report.oracle is not None
    assert machine.report.oracle["rules_checked"].startswith("not applicable")
