"""The root of every error the `govern` package raises.

Each subclass says whose fault it is and what to do next; catch `GovernError` to catch them all.
"""

from __future__ import annotations

__all__ = ["GovernError"]


class GovernError(Exception):
    """Base class of every error raised by `govern`."""
