"""govern: governed shared state machines whose convergence is verified and certified."""

from __future__ import annotations

from ._errors import GovernError

__all__ = ["GovernError"]
