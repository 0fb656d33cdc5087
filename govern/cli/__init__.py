"""The `govern` command (certify, check, show, graph, keygen) and the pictures it draws.

Layer 6, the top: a thin shell over the layers below.
May import: govern._errors, govern.model, govern.verify, govern.oracle, govern.machine,
govern.certificate, govern.runtime.
"""

from ._main import main

__all__ = ["main"]
