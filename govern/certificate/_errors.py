"""Errors about certificates and signing keys, split by what the reader should conclude.

    GovernError
    └── CertificateError
        ├── CertificateUnreadable   the bytes are not a well-formed certificate (`govern check` exit 4)
        ├── CertificateInvalid      well-formed, but a claim in it does not hold (exit 1)
        ├── CertificateTooLarge     the machine's tables or rules exceed what a certificate may hold
        └── SigningKeyError         a key file is malformed, weak, or too widely readable
            └── KeyFileUnreadable   a key file is missing or cannot be read (`govern` exit 4)
"""

from __future__ import annotations

from .._errors import GovernError

__all__ = [
    "CertificateError",
    "CertificateInvalid",
    "CertificateTooLarge",
    "CertificateUnreadable",
    "KeyFileUnreadable",
    "SigningKeyError",
]


class CertificateError(GovernError):
    """A certificate or a key used with one could not be produced, read or verified."""


class CertificateUnreadable(CertificateError):
    """The input is not a well-formed certificate: truncated, oversized, unknown or duplicate fields,
    wrong types, bad base64 or compression, or not in canonical form. Nothing in it was trusted."""


class CertificateInvalid(CertificateError):
    """The certificate was read, and one of its claims is false: digest mismatch, bad or missing
    signature, tables the oracle rejects, tables that are not what the rules define, or a verdict
    that does not match the tables. Do not rely on the machine it describes."""


class CertificateTooLarge(CertificateError):
    """The machine does not fit in a certificate: more states or apply entries than one may hold (2^24 and
    2^26), or rules nested so deep that the certificate would exceed the format's 240 levels. Raised before
    anything is encoded."""


class SigningKeyError(CertificateError):
    """A signing or verification key cannot be used; the message says which file and why."""


class KeyFileUnreadable(SigningKeyError):
    """A key file does not exist or cannot be read (a directory, no permission); the message names it."""
