"""Operators govern rules do not have are refused with the ones they have, not Python's bare TypeError."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest

import govern


@pytest.mark.parametrize(
    "op",
    [operator.mul, operator.truediv, operator.floordiv, operator.mod, operator.pow, operator.lshift,
     operator.rshift],
)  # fmt: skip
@pytest.mark.parametrize("side", ["left", "right"])
def test_an_operator_rules_lack_says_which_they_have(op: Callable[[Any, Any], Any], side: str) -> None:
    r = govern.Registry("m")
    n = r.int("n", 0, 3)
    with pytest.raises(govern.DeclarationError, match=r"govern rules have no \*.*they take \+ and -"):
        op(n, 2) if side == "left" else op(2, n)
