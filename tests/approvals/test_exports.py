"""The public surface of bide.approvals and bide.audit: __all__ is exactly the public names, each class
shown under its public path, and the pinning API is part of it."""

from __future__ import annotations

import types

import pytest

import bide.approvals
import bide.audit


@pytest.mark.parametrize("package", [bide.approvals, bide.audit], ids=lambda p: p.__name__)
def test_all_is_the_public_surface(package: types.ModuleType) -> None:
    public = {
        n
        for n, v in vars(package).items()
        if not n.startswith("_") and n != "annotations" and not isinstance(v, types.ModuleType)
    }
    assert sorted(package.__all__) == sorted(public)
    for name in package.__all__:
        obj = getattr(package, name)
        if isinstance(obj, type):
            assert obj.__module__ == package.__name__, name
            assert obj.__doc__, name


def test_pinning_is_public() -> None:
    assert {"ApprovalTrust", "UntrustedPolicy", "verify_approvals"} <= set(bide.approvals.__all__)
    assert issubclass(bide.approvals.UntrustedPolicy, bide.audit.NotVerified)
