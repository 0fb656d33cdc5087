"""Conversions between Python values and the representations of the generated modules."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

NIL: tuple[Any, ...] = (0,)


def cons(items: list[Any]) -> tuple[Any, ...]:
    out: tuple[Any, ...] = NIL
    for x in reversed(items):
        out = (1, x, out)
    return out


def uncons(lst: tuple[Any, ...]) -> list[Any]:
    out = []
    while lst[0] == 1:
        out.append(lst[1])
        lst = lst[2]
    assert lst == NIL
    return out


def vec(xs: list[int]) -> npt.NDArray[np.int64]:
    a = np.array(xs, dtype=np.int64)
    a.flags.writeable = False
    return a


def mask(bs: list[bool]) -> npt.NDArray[np.bool_]:
    a = np.array(bs, dtype=np.bool_)
    a.flags.writeable = False
    return a


def option_pairs(pairs: list[list[int]] | None) -> tuple[Any, ...]:
    if pairs is None:
        return (1,)
    return (0, cons([(0, a, b) for a, b in pairs]))


def summary(raw: tuple[Any, ...]) -> list[int]:
    """The same summary as rocq/gen/vectors.py computes inside Coq."""
    _, wf, cert, wfc, depth, init_ok, dom_ok, cc1, witness, cc2, nf, dsize, obl, nid = raw
    out = [int(wf), int(cert), int(wfc), depth, int(init_ok), int(dom_ok), int(cc1), int(cc2), dsize]
    if witness == (1,):
        out.append(0)
    else:
        (_, (_, a, b), s) = witness[1]
        out += [1, a, b, s]
    pairs = uncons(obl)
    out.append(len(pairs))
    for _, a, b in pairs:
        out += [a, b]
    events = uncons(nid)
    out += [len(events), *events]
    if wfc:
        out += [int(x) for x in nf]
    return out
