"""The coordination protocols, model-checked exhaustively by SPIN (see docs/protocols.md).

Each model is checked for its stated bound with every assertion it makes; each also has a seeded bug
(a `-DBUG_...` variant) that the checker must reject, so a model that can no longer fail is caught.
`make test` installs spin and gcc when they are missing; without them these tests fail, never skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Verdict:
    errors: int
    states: int
    output: str


def check(model: str, tmp_path: Path, *defines: str) -> Verdict:
    """Generate, compile and run the exhaustive safety verifier of `model` with `defines`."""
    for tool in ("spin", "gcc"):
        assert shutil.which(tool), f"{tool} is missing: run tests/infra/ensure-spin.sh (make test does)"
    source = MODELS / model
    subprocess.run(["spin", "-a", *defines, str(source)], cwd=tmp_path, check=True, capture_output=True)
    # Safety properties only; COLLAPSE compresses states without losing any (the search stays exhaustive).
    subprocess.run(
        ["gcc", "-O2", "-DSAFETY", "-DCOLLAPSE", "-w", "-o", "pan", "pan.c"], cwd=tmp_path, check=True
    )
    # -E: the models end their helper processes in loops, which are not errors; -m: depth bound.
    run = subprocess.run(["./pan", "-m1000000", "-E"], cwd=tmp_path, capture_output=True, text=True)
    output = run.stdout + run.stderr
    found = re.search(r"errors: (\d+)", output)
    stored = re.search(r"(\d+) states, stored", output)
    assert found and stored, output
    assert "max search depth too small" not in output, output
    return Verdict(int(found.group(1)), int(stored.group(1)), output)


CORRECT = ["claim.pml", "approval.pml", "eventlog.pml"]
SEEDED_BUGS = [
    ("claim.pml", "BUG_NO_WINDOW", "fired<=1"),
    ("claim.pml", "BUG_EARLY_DECIDE", "fired<=1"),
    ("claim.pml", "BUG_NO_SEAL_NO_FENCE", "assertion violated"),
    ("approval.pml", "BUG_NO_TURN", "assertion violated"),
    ("eventlog.pml", "BUG_LOOKUP_OUTSIDE", "log[i]!=log[j]"),
]


@pytest.mark.slow
@pytest.mark.parametrize("model", CORRECT)
def test_model_holds_for_its_bound(model: str, tmp_path: Path) -> None:
    verdict = check(model, tmp_path)
    assert verdict.errors == 0, verdict.output
    assert verdict.states > 1000  # the search really explored the model


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model", "bug", "violated"), SEEDED_BUGS, ids=[f"{m}:{b}" for m, b, _ in SEEDED_BUGS]
)
def test_seeded_bug_is_found(model: str, bug: str, violated: str, tmp_path: Path) -> None:
    verdict = check(model, tmp_path, f"-D{bug}")
    assert verdict.errors >= 1, verdict.output
    assert violated in verdict.output
