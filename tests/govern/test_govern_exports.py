"""govern's public names are loaded lazily: `import govern` loads only the exceptions, the first use of a name
imports the module defining it, and each name is that module's object under its public path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import govern
from govern import Registry, implies, max_

GOVERN = Path(govern.__file__).parent


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_loads_only_the_exceptions() -> None:
    loaded = python(
        "import sys, govern; print(*sorted(m for m in sys.modules if m.startswith(('govern', 'bide'))));"
        "print(govern.NotConvergent.__module__, govern.CertificateInvalid.__module__, 'numpy' in sys.modules)"
    )
    assert loaded.splitlines() == [
        "bide bide._errors bide._lazy govern govern._errors govern.certificate govern.certificate._errors",
        "govern govern False",
    ]


def test_a_composed_machine_loads_when_only_machine_is_used(tmp_path: Path) -> None:
    """Composed and symbolic machine files are read by loaders their modules register when imported: a
    program that never touches `Registry` must still load them."""
    reg = Registry("two")
    for i in range(2):
        stage = reg.int(f"stage{i}", 0, 3)
        paid = reg.bool(f"paid{i}")
        reg.invariant(f"booked_paid{i}", holds=implies(stage >= 2, paid), repair={paid: True})
        reg.event(f"book{i}", effect={stage: max_(stage, 2)})
        reg.event(f"pay{i}", effect={paid: True})
    path = tmp_path / "two.npz"
    reg.build(compose=True).save(path)
    loaded = python(f"import govern; print(type(govern.Machine.load({str(path)!r})).__name__)")
    assert loaded == "ComposedMachine\n"
