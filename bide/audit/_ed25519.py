"""Refuse Ed25519 public keys that do not name a single signer.

A key must decode canonically to a point of the prime-order subgroup other than the identity. A small-order
key (the identity, or one of the 7 other points of order 2, 4 or 8) lets anyone produce signatures that
verify for it without any private key, and a mixed-order key lets its holder make several signatures
verify for one message; OpenSSL's verification does not refuse either, so we do, once per key (cached).
Pure integer arithmetic on the Edwards curve (about a millisecond per new key).
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["is_strong_public_key"]

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = (-121665 * pow(121666, _P - 2, _P)) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)

_Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z
_IDENTITY: _Point = (0, 1, 1, 0)


def _decode(raw: bytes) -> _Point | None:
    if len(raw) != 32:
        return None
    y = int.from_bytes(raw, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    if y >= _P:
        return None  # non-canonical encoding
    u = (y * y - 1) % _P
    v = (_D * y * y + 1) % _P
    x = (u * pow(v, 3, _P) * pow(u * pow(v, 7, _P), (_P - 5) // 8, _P)) % _P
    if (v * x * x - u) % _P != 0:
        x = (x * _SQRT_M1) % _P
        if (v * x * x - u) % _P != 0:
            return None  # not on the curve
    if x == 0 and sign:
        return None  # non-canonical encoding of x = 0
    if x & 1 != sign:
        x = _P - x
    return (x, y, 1, (x * y) % _P)


def _add(a: _Point, b: _Point) -> _Point:
    # Unified addition on -x^2 + y^2 = 1 + d x^2 y^2 (RFC 8032 section 5.1.4).
    x1, y1, z1, t1 = a
    x2, y2, z2, t2 = b
    aa = (y1 - x1) * (y2 - x2) % _P
    bb = (y1 + x1) * (y2 + x2) % _P
    cc = 2 * t1 * t2 * _D % _P
    dd = 2 * z1 * z2 % _P
    e, f, g, h = bb - aa, dd - cc, dd + cc, bb + aa
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _mul(k: int, p: _Point) -> _Point:
    acc = _IDENTITY
    while k:
        if k & 1:
            acc = _add(acc, p)
        p = _add(p, p)
        k >>= 1
    return acc


def _is_identity(p: _Point) -> bool:
    x, y, z, _ = p
    return x % _P == 0 and (y - z) % _P == 0


@lru_cache(maxsize=4096)
def is_strong_public_key(raw: bytes) -> bool:
    """True when `raw` encodes, canonically, a point of prime order L (the only keys real signers have)."""
    point = _decode(raw)
    if point is None or _is_identity(point):
        return False
    return _is_identity(_mul(_L, point))
