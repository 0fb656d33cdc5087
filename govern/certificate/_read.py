"""Reading a certificate of any format, told by its format member: the one function for whoever holds only
the file (`govern.read_certificate`)."""

from __future__ import annotations

from ._certificate import Certificate, table_certificate
from ._composed import ComposedCertificate, composed_of
from ._encoding import DEFAULT_MAX_BYTES, parse_strict_json
from ._model import COMPOSED_FORMAT
from ._symbolic import SYMBOLIC_FORMAT, SymbolicCertificate, parse_symbolic

__all__ = ["read_certificate"]


def read_certificate(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> Certificate | SymbolicCertificate | ComposedCertificate:
    """Parse and decode a certificate strictly, without judging its claims: any certificate `certify`
    makes, told by its format member: a table certificate (`govern-certificate/1`, a `Certificate`), a
    symbolic one (`govern-symbolic-certificate/1`) or a composed one (`govern-certificate/composed-1`).

    Raises `CertificateUnreadable` for anything that is not a well-formed certificate of those formats.
    """
    value = parse_strict_json(data, max_bytes=max_bytes)
    fmt = value.get("format") if isinstance(value, dict) else None
    if fmt == SYMBOLIC_FORMAT:
        return SymbolicCertificate(parse_symbolic(value))
    if fmt == COMPOSED_FORMAT:
        return composed_of(value, max_bytes=max_bytes)
    return table_certificate(value)
