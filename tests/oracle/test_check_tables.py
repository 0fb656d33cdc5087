"""The oracle front end against a plain brute-force checker written here from docs/semantics.md.

Random small machines given by tables, including the ones that must be rejected (repair cycles,
non-commuting pairs, CC2 failures, invalid initial states), with both domain modes and declared pairs;
plus input validation (malformed input never yields a verdict) and the fail-closed paths, and the
untrusted witness (normal forms and repair depths): it gives the verdict given without it, or none.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import govern.oracle as oracle
from govern import GovernError
from govern.oracle import (
    ORACLE_IDENTITY,
    OracleInputError,
    OracleNoVerdict,
    TableVerdict,
    check_tables,
)

from ._strategies import machines

ROOT = Path(__file__).parents[2]


@dataclass
class Brute:
    wfc: bool
    nf: list[int]
    max_depth: int
    initial_valid: bool
    cc1: bool
    witness: tuple[int, int, int] | None
    cc2: bool
    domain_size: int
    certified: bool


def brute(valid: list[bool], repair: list[int], apply: list[list[int]],
          pairs: list[tuple[int, int]] | None, domain: str, initial: int) -> Brute:
    n, e = len(valid), len(apply)
    nf, depth, wfc = [0] * n, [0] * n, True
    for s in range(n):
        seen, cur = set(), s
        while not valid[cur]:
            if cur in seen:
                wfc = False
                break
            seen.add(cur)
            cur = repair[cur]
        nf[s], depth[s] = cur, len(seen)
    if not wfc:
        return Brute(False, nf, 0, valid[initial], False, None, False, 0, False)

    def step(ev: int, s: int) -> int:
        return nf[apply[ev][s]]

    cc2 = all(nf[apply[ev][s]] == nf[apply[ev][nf[s]]] for ev in range(e) for s in range(n))
    if not valid[initial]:
        return Brute(True, nf, max(depth), False, False, None, cc2, 0, False)
    if domain == "valid":
        dom = [s for s in range(n) if valid[s]]
    else:
        reach, todo = {initial}, [initial]
        while todo:
            s = todo.pop()
            for ev in range(e):
                t = step(ev, s)
                if t not in reach:
                    reach.add(t)
                    todo.append(t)
        dom = sorted(reach)
    checked = pairs if pairs is not None else [(a, b) for a in range(e) for b in range(a + 1, e)]
    witness = None
    for a, b in checked:
        bad = [s for s in dom if step(b, step(a, s)) != step(a, step(b, s))]
        if bad:
            witness = (a, b, bad[0])
            break
    cc1 = witness is None
    return Brute(True, nf, max(depth), True, cc1, witness, cc2, len(dom), cc1)


def run(m: dict[str, Any], dtype: type[np.integer[Any]] = np.int64,
        witness: tuple[list[int], list[int]] | None = None) -> TableVerdict:
    n = len(m["valid"])
    apply = np.array(m["apply"], dtype=dtype).reshape(len(m["apply"]), n)
    extra: dict[str, Any] = {}
    if witness is not None:
        extra = {"nf": np.array(witness[0], dtype=dtype), "depth": np.array(witness[1], dtype=dtype)}
    return check_tables(valid=np.array(m["valid"], dtype=bool), repair=np.array(m["repair"], dtype=dtype),
                        apply=apply, pairs=m["pairs"], domain=m["domain"], initial=m["initial"], **extra)


def true_witness(m: dict[str, Any]) -> tuple[list[int], list[int]] | None:
    """The normal form and the number of repair steps of every state, or None on a repair cycle."""
    nf, depth = [], []
    for s in range(len(m["valid"])):
        cur, k = s, 0
        while not m["valid"][cur]:
            if k > len(m["valid"]):
                return None
            cur, k = m["repair"][cur], k + 1
        nf.append(cur)
        depth.append(k)
    return nf, depth


def same(a: TableVerdict, b: TableVerdict) -> None:
    assert (a.certified, a.wfc, a.max_depth, a.initial_valid, a.cc1, a.cc1_witness, a.cc2, a.domain_size,
            a.theorem) == (b.certified, b.wfc, b.max_depth, b.initial_valid, b.cc1, b.cc1_witness, b.cc2,
                           b.domain_size, b.theorem)
    assert [int(x) for x in a.nf] == [int(x) for x in b.nf]


def agree(m: dict[str, Any]) -> TableVerdict:
    got = run(m)
    # the engine hands int32 tables, used as they are; other integer dtypes are converted
    same(run(m, np.int32), got)
    same(run(m, np.uint16), got)
    w = true_witness(m)
    if w is not None:  # the true witness changes nothing (check_tables_w_eq)
        same(run(m, np.int32, w), got)
    want = brute(m["valid"], m["repair"], m["apply"], m["pairs"], m["domain"], m["initial"])
    assert got.certified == want.certified
    assert got.wfc == want.wfc
    if not got.certified:
        want_theorem = (oracle.THEOREM_WITNESS if got.cc1_witness
                        else oracle.THEOREM_NO_WFC if not got.wfc else oracle.THEOREM_TABLES)
        assert got.theorem == want_theorem
    elif got.cc2 and m["domain"] == "valid":
        assert got.theorem == oracle.THEOREM_CONVERGENCE
    else:
        assert got.theorem == oracle.THEOREM_TRACE
    assert got.theorem in ORACLE_IDENTITY.theorems
    if want.wfc:
        assert [int(x) for x in got.nf] == want.nf
        assert got.max_depth == want.max_depth
        assert got.cc2 == want.cc2
        assert got.initial_valid == want.initial_valid
        if want.initial_valid:
            assert got.cc1 == want.cc1
            assert got.cc1_witness == want.witness
            assert got.domain_size == want.domain_size
    return got


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines())
def test_oracle_agrees_with_brute_force(m: dict[str, Any]) -> None:
    agree(m)


@settings(max_examples=150, deadline=None)
@given(machines(terminating=False))
def test_repair_cycles_are_rejected_exactly_when_present(m: dict[str, Any]) -> None:
    agree(m)


def test_a_repair_cycle_is_never_certified() -> None:
    m = {"valid": [True, False, False], "repair": [0, 2, 1], "apply": [[1, 1, 1]], "pairs": None,
         "domain": "valid", "initial": 0}
    v = agree(m)
    assert not v.wfc and not v.certified


def test_non_commuting_pair_gives_a_witness() -> None:
    # counter 0..2 with "inc" (saturating) and "reset": inc;reset != reset;inc from 0
    m = {"valid": [True, True, True], "repair": [0, 1, 2], "apply": [[1, 2, 2], [0, 0, 0]], "pairs": None,
         "domain": "valid", "initial": 0}
    v = agree(m)
    assert not v.certified and v.cc1_witness == (0, 1, 0)


def test_cc2_failure_is_reported_but_does_not_reject() -> None:
    # states: 0 pending, 1 paid, 2 shipped-unpaid (invalid, repaired to 0); pay: pending -> paid only
    m = {"valid": [True, True, False], "repair": [0, 1, 0], "apply": [[1, 1, 2]], "pairs": None,
         "domain": "valid", "initial": 0}
    v = agree(m)
    assert v.certified and not v.cc2


def test_reachable_domain_ignores_unreachable_disagreements() -> None:
    # from 0 only state 0 is reachable; events disagree at state 1
    m = {"valid": [True, True, True], "repair": [0, 1, 2], "apply": [[0, 2, 2], [0, 0, 2]], "pairs": None,
         "domain": "reachable", "initial": 0}
    assert agree(m).certified
    m["domain"] = "valid"
    assert agree(m).cc1_witness == (0, 1, 1)


def test_invalid_initial_state_is_not_certified() -> None:
    m = {"valid": [False, True], "repair": [1, 1], "apply": [], "pairs": None, "domain": "valid",
         "initial": 0}
    v = agree(m)
    assert not v.certified and not v.initial_valid


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(machines(), st.data())
def test_any_witness_gives_the_plain_verdict_or_none(m: dict[str, Any], data: st.DataObject) -> None:
    """A witness is untrusted input: whatever it says, the verdict is the one without it, or no verdict."""
    n = len(m["valid"])
    true = true_witness(m)
    nf = data.draw(st.lists(st.integers(0, n), min_size=n, max_size=n))
    depth = data.draw(st.lists(st.integers(0, n + 1), min_size=n, max_size=n))
    if true is not None and data.draw(st.booleans()):  # near misses: the true witness, one entry changed
        nf, depth = list(true[0]), list(true[1])
        s = data.draw(st.integers(0, n - 1))
        if data.draw(st.booleans()):
            nf[s] = data.draw(st.integers(0, n - 1))
        else:
            depth[s] = data.draw(st.integers(0, n))
    try:
        plain: TableVerdict | None = run(m)
    except OracleInputError:
        plain = None
    try:
        got = run(m, np.int32, (nf, depth))
    except OracleInputError:
        return
    assert plain is not None and true is not None
    assert (nf, depth) == true  # only the true witness passes the check
    same(got, plain)


def test_a_wrong_witness_gives_no_verdict() -> None:
    m = {"valid": [True, False, False], "repair": [0, 0, 1], "apply": [[1, 2, 2]], "pairs": None,
         "domain": "valid", "initial": 0}
    assert true_witness(m) == ([0, 0, 0], [0, 1, 2])
    assert run(m, np.int32, ([0, 0, 0], [0, 1, 2])).wfc
    for nf, depth in [([0, 0, 0], [0, 1, 3]), ([0, 0, 0], [0, 0, 0]), ([0, 0, 1], [0, 1, 2]),
                      ([0, 1, 2], [0, 1, 2]), ([0, 0, 0], [1, 2, 3])]:
        with pytest.raises(OracleInputError, match="witness"):
            run(m, np.int32, (nf, depth))
    # a repair cycle has no witness: depth would have to decrease forever
    cyc = {**m, "repair": [0, 2, 1]}
    for depth in ([0, 1, 2], [0, 2, 1], [0, 1, 1]):
        with pytest.raises(OracleInputError):
            run(cyc, np.int32, ([0, 0, 0], depth))
    with pytest.raises(OracleInputError, match="both"):
        check_tables(valid=np.array(m["valid"]), repair=np.array(m["repair"]), apply=np.array(m["apply"]),
                     pairs=None, domain="valid", initial=0, nf=np.array([0, 0, 0]))
    with pytest.raises(OracleInputError, match="nf must have shape"):
        run(m, np.int32, ([0, 0, 0, 0], [0, 1, 2]))


GOOD: dict[str, Any] = {
    "valid": np.array([True, False]),
    "repair": np.array([0, 0]),
    "apply": np.array([[1, 1]]),
    "pairs": None,
    "domain": "valid",
    "initial": 0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"valid": np.array([1, 0])},
        {"valid": np.array([], dtype=bool)},
        {"valid": [True, False]},
        {"repair": np.array([0, 2])},
        {"repair": np.array([0, -1])},
        {"repair": np.array([0.0, 0.0])},
        {"repair": np.array([0, 0, 0])},
        {"apply": np.array([1, 1])},
        {"apply": np.array([[1, 5]])},
        {"pairs": [(0, 0)]},
        {"pairs": [(0, 1)]},
        {"pairs": [(True, 0)]},
        {"pairs": [[0, 1]]},
        {"domain": "all"},
        {"initial": 2},
        {"initial": True},
        {"repair": np.array([1, 0])},  # repair moves a valid state: rejected by the checker itself
        {"repair": np.array([0, 2**63], dtype=np.uint64)},  # beyond int64: never wrapped to negative
        {"apply": np.array([[1, 2**64 - 1]], dtype=np.uint64)},
    ],
)
def test_malformed_input_gives_no_verdict(change: dict[str, Any]) -> None:
    with pytest.raises(OracleInputError) as info:
        check_tables(**{**GOOD, **change})
    assert isinstance(info.value, GovernError)


def test_an_exception_inside_the_extracted_code_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    from govern.oracle import _prims

    def boom(*_: object) -> object:
        raise MemoryError("simulated")

    monkeypatch.setattr(_prims, "vgather", boom)
    with pytest.raises(OracleNoVerdict):
        check_tables(**GOOD)


def test_int32_tables_are_used_without_a_copy() -> None:
    valid = np.array([True, False, True])
    repair = np.array([0, 2, 2], dtype=np.int32)
    apply = np.array([[1, 1, 2], [0, 0, 0]], dtype=np.int32)
    v = check_tables(valid=valid, repair=repair, apply=apply, pairs=None, domain="valid", initial=0)
    assert v.certified is False and v.cc1_witness is not None  # set-to-1 then reset differs from 2
    assert repair.flags.writeable and apply.flags.writeable  # the caller's arrays are untouched
    assert [int(x) for x in v.nf] == [0, 2, 2]


def test_a_wrong_numbering_of_the_valid_states_gives_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    # vrank is not trusted: the checker verifies that it numbers the valid states (pos_ok)
    from govern.oracle import _prims

    tables: dict[str, Any] = {**GOOD, "valid": np.array([False, True]), "repair": np.array([1, 1]),
                              "initial": 1}
    assert check_tables(**tables).certified
    monkeypatch.setattr(_prims, "vrank", lambda m: _prims.viota(m.shape[0]))  # wrong: 1 is the 0th valid
    with pytest.raises(OracleInputError, match="number"):
        check_tables(**tables)


def test_a_tampered_generated_module_gives_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oracle, "_GENERATED_OK", False)
    with pytest.raises(OracleNoVerdict):
        check_tables(**GOOD)


def test_identity_matches_the_committed_files() -> None:
    def sha(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    assert ORACLE_IDENTITY.generated_sha256 == sha(ROOT / "govern" / "oracle" / "_generated.py")
    assert ORACLE_IDENTITY.json_sha256 == sha(ROOT / "rocq" / "extracted" / "oracle.json")
    assert ORACLE_IDENTITY.generator_sha256 == sha(ROOT / "rocq" / "gen" / "jsonpy.py")
    assert ORACLE_IDENTITY.prims_sha256 == sha(ROOT / "govern" / "oracle" / "_prims.py")
    assert ORACLE_IDENTITY.frontend_sha256 == sha(ROOT / "govern" / "oracle" / "__init__.py")
    assert ORACLE_IDENTITY.axiom_gate_sha256 == sha(ROOT / "rocq" / "gen" / "gate.py")
    assert ORACLE_IDENTITY.coq_version == "8.16.1"
    assert oracle.THEOREM_TABLES in ORACLE_IDENTITY.theorems
    assert oracle._generated_matches()


def test_generated_module_says_it_is_generated() -> None:
    head = (ROOT / "govern" / "oracle" / "_generated.py").read_text().splitlines()[:2]
    assert head[0].startswith("# GENERATED by rocq/gen/jsonpy.py")
    assert "Never edit by hand" in head[1]


@pytest.mark.parametrize("name", ["_prims.py", "__init__.py", "_generated.py"])
def test_an_edited_trusted_file_gives_no_verdict(tmp_path: Path, name: str) -> None:
    """A copy of govern whose primitives, front end or generated module differ (by one comment line)
    from the hashes in PROVENANCE refuses to give any verdict."""
    shutil.copytree(ROOT / "govern", tmp_path / "govern", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "govern" / "oracle" / name
    target.write_text(target.read_text() + "\n# edited\n")
    script = (
        "import numpy as np\n"
        "from govern.oracle import check_tables, OracleNoVerdict\n"
        "try:\n"
        "    check_tables(valid=np.array([True]), repair=np.array([0]),"
        " apply=np.zeros((0, 1), dtype=np.int64), pairs=None, domain='valid', initial=0)\n"
        "except OracleNoVerdict as exc:\n"
        "    print('REFUSED', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("REFUSED") and "PROVENANCE" in out.stdout
