"""The public surface of bide.approvals and bide.audit: __all__ is exactly the public names, each class
shown under its public path, loaded lazily (importing the package loads at most its exceptions, and a name's
first use imports the submodule defining it), and the pinning API is part of it."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

import bide.approvals
import bide.audit

PACKAGES = [bide.approvals, bide.audit]
HEAVY = ("sqlalchemy", "cryptography", "pydantic", "bide._journal", "bide._records", "bide._sql")
by_name = pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@by_name
def test_all_is_the_public_surface(package: types.ModuleType) -> None:
    public = {n for n in dir(package) if not n.startswith("_") and n != "annotations"}
    assert sorted(package.__all__) == sorted(public)
    for name in package.__all__:
        obj = getattr(package, name)
        if isinstance(obj, type):
            assert obj.__module__ == package.__name__, name
            assert obj.__doc__, name


def test_import_loads_only_the_exceptions() -> None:
    loaded = python(
        "import sys, bide.audit, bide.approvals\n"
        "print(*sorted(m for m in sys.modules if m.startswith(('bide.', 'cryptography', 'pydantic'))))\n"
        "print(bide.audit.NotVerified.__module__, 'AuditLog' in dir(bide.audit), "
        "'count' in dir(bide.approvals))"
    )
    assert loaded.splitlines() == [
        "bide._errors bide._lazy bide.approvals bide.audit bide.audit._errors",
        "bide.audit True True",
    ]


@pytest.mark.parametrize(
    ("expression", "printed"),
    [
        ("bide.audit.MerkleTree", "<class 'bide.audit.MerkleTree'>"),
        ("bide.audit.AuditLog", "<class 'bide.audit.AuditLog'>"),
        ("bide.approvals.ApprovalGate", "<class 'bide.approvals.ApprovalGate'>"),
        ("bide.approvals.UntrustedPolicy.__mro__[1]", "<class 'bide.audit.NotVerified'>"),
    ],
)
def test_first_use_loads_the_defining_submodule(expression: str, printed: str) -> None:
    assert python(f"import bide.audit, bide.approvals; print({expression})") == printed + "\n"


def test_the_tree_math_needs_no_heavy_library() -> None:
    """govern's event log uses bide.audit.MerkleTree: that must not bring the key and artifact libraries."""
    loaded = python(
        f"import sys; from bide.audit import MerkleTree; print(*[m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert loaded.split() == []


def test_pinning_is_public() -> None:
    assert {"ApprovalTrust", "UntrustedPolicy", "verify_approvals"} <= set(bide.approvals.__all__)
    assert issubclass(bide.approvals.UntrustedPolicy, bide.audit.NotVerified)
