"""The axiom gate (rocq/gen/gate.py) fails on a theorem that rests on an axiom or an admitted proof.

Runs the real `coqc` (installed by `make test`, see tests/infra/ensure-coq.sh) on a throwaway theory.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GATE = Path(__file__).parents[2] / "rocq" / "gen" / "gate.py"

SOURCE = """
Axiom magic : forall P : Prop, P.
Theorem clean : 1 + 1 = 2.
Proof. reflexivity. Qed.
Theorem dirty : 1 + 1 = 3.
Proof. apply magic. Qed.
Theorem admitted : 2 + 2 = 5.
Proof. Admitted.
"""


def gate(tmp_path: Path, *theorems: str) -> subprocess.CompletedProcess[str]:
    coqc = shutil.which("coqc")
    assert coqc, "coqc is required (run tests/infra/ensure-coq.sh, as `make test` does)"
    (tmp_path / "theories").mkdir(exist_ok=True)
    (tmp_path / "theories" / "T.v").write_text(SOURCE)
    (tmp_path / "_build").mkdir(exist_ok=True)
    subprocess.run([coqc, "-Q", "theories", "Govern", "theories/T.v"], cwd=tmp_path, check=True,
                   capture_output=True)
    return subprocess.run([sys.executable, str(GATE), coqc, "_build", *theorems], cwd=tmp_path,
                          capture_output=True, text=True)


def test_gate_passes_a_closed_theorem(tmp_path: Path) -> None:
    res = gate(tmp_path, "Govern.T.clean")
    assert res.returncode == 0, res.stderr
    assert "Closed under the global context" in res.stdout


@pytest.mark.parametrize("theorem", ["Govern.T.dirty", "Govern.T.admitted"])
def test_gate_fails_on_an_axiom_or_an_admit(tmp_path: Path, theorem: str) -> None:
    res = gate(tmp_path, "Govern.T.clean", theorem)
    assert res.returncode == 1
    assert f"{theorem} is NOT closed" in res.stderr
