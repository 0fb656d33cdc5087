"""The public surface: __all__ is exactly the public names, each shown under its public path."""

from __future__ import annotations

import bide
import bide.testing


def test_all_matches_public_names() -> None:
    public = {n for n in dir(bide) if not n.startswith("_")} - {
        "testing",
        "audit",
        "approvals",
        "annotations",
    }
    assert sorted(bide.__all__) == sorted(public)
    for name in [
        "tool",
        "ReadOnly",
        "Idempotent",
        "Agent",
        "open_store",
        "resolve_halt",
        "RunHalted",
        "OutcomeUnknown",
        "BideError",
        "OpenAIModel",
        "Gate",
        "Outcome",
    ]:
        assert name in bide.__all__
    assert "ScriptedModel" in bide.testing.__all__


def test_public_classes_report_public_module() -> None:
    for name in bide.__all__:
        obj = getattr(bide, name)
        if isinstance(obj, type):
            assert obj.__module__ == "bide", name
        assert getattr(obj, "__doc__", None) or not callable(obj), f"{name} has no docstring"


def test_error_hierarchy() -> None:
    assert issubclass(bide.OutcomeUnknown, bide.RunHalted)
    assert issubclass(bide.ApprovalPending, bide.RunHalted)
    assert issubclass(bide.RunHalted, bide.BideError)
    assert issubclass(bide.ConfigError, ValueError)
    assert issubclass(bide.StoreURLError, bide.ConfigError)
    assert issubclass(bide.JournalFormatError, bide.StoreError)
    for cls in (bide.HaltInFlight, bide.HaltAlreadyResolved, bide.NoLiveAttempt):
        assert issubclass(cls, bide.ResolveRefused)
