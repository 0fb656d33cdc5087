"""The public surface: __all__ is exactly the public names, each shown under its public path, loaded lazily:
`import bide` loads only the exceptions, and a name's first use imports the submodule defining it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import bide
import bide.testing

BIDE = Path(bide.__file__).parent
HEAVY = ("bide._agent", "bide._sql", "bide._open", "bide._records", "bide._journal", "bide._worker")


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


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


def test_unknown_names_still_raise_attribute_error() -> None:
    assert not hasattr(bide, "Agnet")
    assert set(bide.__all__) <= set(dir(bide))


def test_import_loads_only_the_exceptions() -> None:
    loaded = python(
        "import sys, bide; print(*sorted(m for m in sys.modules if m.startswith('bide')));"
        "print(bide.RunHalted.__module__, 'Agent' in dir(bide))"
    )
    assert loaded.splitlines() == ["bide bide._errors bide._lazy", "bide True"]
    assert python("import bide; print(bide.Agent)") == "<class 'bide.Agent'>\n"
    opened = "from bide import MemoryStore, open_store; print(type(open_store('memory://')) is MemoryStore)"
    assert python(opened) == "True\n"


def test_import_govern_loads_no_heavy_bide_module() -> None:
    loaded = python(f"import sys, govern; print(*[m for m in {HEAVY!r} if m in sys.modules])")
    assert loaded.split() == []
