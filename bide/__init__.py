"""bide: durable AI agents whose side effects fire at most once, on a verifiable journal."""

from __future__ import annotations

from ._errors import BideError

__all__ = ["BideError"]
