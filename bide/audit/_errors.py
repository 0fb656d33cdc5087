"""Errors of `bide.audit`: every verification failure is exactly one of these two."""

from __future__ import annotations

from .._errors import BideError, ConfigError

__all__ = ["AuditError", "JournalDamaged", "NotVerified", "RecordPastHead", "UnreadableInput"]


class AuditError(BideError):
    """Base class of `bide.audit` errors."""


class NotVerified(AuditError):
    """The artifact was read and understood, and what it claims does not hold (a wrong signature, a proof
    that does not lead to the signed root, a recount that differs). Treat the artifact as forged or
    corrupt."""


class JournalDamaged(NotVerified):
    """The store's journal is not the one its audit tree was built from: a record was changed, removed or
    inserted behind bide (or the audit tables were). Nothing is signed, proven or exported over it: a head
    or proof would vouch for records the journal no longer holds. Restore the store from a backup, and
    compare it with the heads you anchored."""


class UnreadableInput(AuditError):
    """The input is not a well-formed artifact of the expected kind (not JSON, duplicate or unknown keys,
    bad base64, wrong types, too large, wrong format tag, unreadable key file). Nothing was verified; ask the
    sender for the artifact `bide-audit export` produced."""


class RecordPastHead(AuditError, ConfigError):
    """The record asked for is in the journal but not among the records the head covers: it was committed
    after the head's journal was read (a live run goes on). No proof was made; sign a head that covers it
    (`bide-audit export` again)."""
