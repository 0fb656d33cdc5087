"""The convergence oracle extracted from our Rocq proof (rocq/), run in-process.

`check_tables` re-checks a machine from its tables: the validity flags, the ONE-STEP repair table and the
raw event tables.  It establishes termination of repair itself, computes the normal forms, the checked
domain, CC1 on the domain for the checked pairs and CC2 on every state.  Its verdict is computed by
`_generated.py`, Python translated mechanically from Coq's extraction of `TableCheck.check_tables`, whose
soundness is the theorem named in the verdict (see rocq/README.md).  Handed the normal forms and repair
depths as a witness, it runs `TableCheck.check_tables_w`, which checks the witness (a ranking and the
normal form) instead of iterating repair and then gives the same verdict (`check_tables_w_eq`).
`check_rules` recomputes the tables from the machine's rules (the expression AST of docs/semantics.md)
with the extracted `Rules.check_rules` and says whether the given tables are exactly those.  This front
end only validates and converts inputs; malformed input raises `OracleInputError`, and any failure
inside the extracted code raises `OracleNoVerdict`: neither is ever turned into a True or False.
It gives no verdict at all when the generated module, the primitives or this file differ from the
hashes in PROVENANCE.

Layer 2, beside verification and independent of it; `_gate.py` holds a build to the oracle's verdict.
May import: govern._errors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._errors import OracleError
from . import _prims

__all__ = [
    "ORACLE_IDENTITY",
    "OracleError",
    "OracleIdentity",
    "OracleInputError",
    "OracleNoVerdict",
    "RulesVerdict",
    "TableVerdict",
    "check_decomposition",
    "check_rules",
    "check_tables",
]

# Coq names of the theorems a verdict rests on (rocq/theories/*.v, listed in rocq/README.md).
THEOREM_TABLES = "Govern.TableCheck.check_tables_sound"
THEOREM_TRACE = "Govern.TableCheck.check_tables_trace"
THEOREM_CC2 = "Govern.TableCheck.check_tables_cc2"
THEOREM_CONVERGENCE = "Govern.Bridge.check_tables_convergence"
THEOREM_WITNESS = "Govern.TableCheck.check_tables_witness"
THEOREM_NO_WFC = "Govern.TableCheck.check_tables_wfc_complete"
THEOREM_RULES = "Govern.Rules.check_rules_sound"
THEOREM_DELIVERY = "Govern.Delivery.check_tables_delivery"
THEOREM_REPLICA = "Govern.Delivery.check_tables_replica"
THEOREM_DUPLICATE = "Govern.Delivery.check_tables_duplicate"
THEOREM_DECOMPOSITION = "Govern.Compose.check_decomposition_sound"
THEOREM_COMPOSE = "Govern.Compose.compose_unique_normal_forms"

_MAX_STATES = 2**31 - 1
_INT64_MAX = 2**63 - 1


# OracleError is govern's one oracle error class (govern.OracleError): the two below are the oracle's own
# "no verdict" cases, so a caller catching govern.OracleError sees every way the oracle did not certify.


class OracleInputError(OracleError):
    """The tables handed to the oracle are malformed (types, shapes, ranges); fix the caller. No verdict."""


class OracleNoVerdict(OracleError):
    """The extracted checker raised or returned something outside its type: no verdict, report a bug."""


@dataclass(frozen=True)
class OracleIdentity:
    """What the verdicts come from: the pinned proof, its extraction, the generated module, the
    generator, and the other files a verdict trusts (the numpy primitives, this front end, the axiom
    gate), each by SHA-256 (govern/oracle/PROVENANCE, written by `make -C rocq check`)."""

    coq_version: str
    proof_sha256: str
    json_sha256: str
    generated_sha256: str
    generator_sha256: str
    theorems: tuple[str, ...]
    prims_sha256: str
    frontend_sha256: str
    axiom_gate_sha256: str


@dataclass(frozen=True)
class TableVerdict:
    """The oracle's verdict on a machine given by tables.

    `certified` is True exactly when the inputs are well formed, repair terminates from every state
    (`wfc`), the initial state is valid, the checked domain was computed and checked closed, and every
    checked pair commutes on it (`cc1`).  `cc1_witness` is `(a, b, s)`: events a, b disagree from domain
    state s.  `cc2` is computed whenever `wfc` holds.  `nf` is the normal-form table (meaningful only when
    `wfc`), `max_depth` the largest number of repair steps.  `theorem` names the Coq theorem a True
    verdict rests on: `Govern.Bridge.check_tables_convergence` (CC2 holds, domain "valid": the full
    rewrite system converges under any interleaving), else `Govern.TableCheck.check_tables_trace`
    (trace equivalence of normalized runs from the domain). A False verdict with a `cc1_witness` rests on
    `Govern.TableCheck.check_tables_witness` (the witness is a real disagreement), one with `wfc` False on
    `Govern.TableCheck.check_tables_wfc_complete` (some state never reaches a valid state); the other False
    verdicts (invalid initial state) name `Govern.TableCheck.check_tables_sound`.  A verdict computed with
    a witness (see `check_tables`) is that same verdict, by `Govern.TableCheck.check_tables_w_eq`.

    When certified, `obligations` lists (sorted) every pair `(a, b)`, `a < b`, of events that do not
    commute at some state of the checked domain D (always empty when every pair is checked), and
    `not_idempotent` every event whose second application changes some state of D; both are exactly
    right on D (`Govern.Delivery.check_tables_delivery`). Empty when not certified.
    """

    certified: bool
    wfc: bool
    max_depth: int
    initial_valid: bool
    cc1: bool
    cc1_witness: tuple[int, int, int] | None
    cc2: bool
    nf: npt.NDArray[np.integer[Any]]
    domain_size: int
    theorem: str
    obligations: tuple[tuple[int, int], ...] = ()
    not_idempotent: tuple[int, ...] = ()


def _read_identity() -> OracleIdentity:
    text = resources.files(__package__).joinpath("PROVENANCE").read_text(encoding="utf-8")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            fields[key.strip()] = value.strip()
    try:
        return OracleIdentity(
            coq_version=fields["coq_version"],
            proof_sha256=fields["proof_sha256"],
            json_sha256=fields["json_sha256"],
            generated_sha256=fields["generated_sha256"],
            generator_sha256=fields["generator_sha256"],
            theorems=tuple(t for t in fields["theorems"].split(",") if t),
            prims_sha256=fields["prims_sha256"],
            frontend_sha256=fields["frontend_sha256"],
            axiom_gate_sha256=fields["axiom_gate_sha256"],
        )
    except KeyError as err:  # pragma: no cover - PROVENANCE is generated by `make -C rocq check`
        raise OracleNoVerdict(
            f"govern/oracle/PROVENANCE lacks {err}; regenerate with `make -C rocq regen`"
        ) from err


ORACLE_IDENTITY = _read_identity()


def _generated_matches() -> bool:
    """The generated module, the primitives it calls and this front end are the files PROVENANCE names."""
    expected = {
        "_generated.py": ORACLE_IDENTITY.generated_sha256,
        "_prims.py": ORACLE_IDENTITY.prims_sha256,
        "__init__.py": ORACLE_IDENTITY.frontend_sha256,
    }
    files = resources.files(__package__)
    return all(
        hashlib.sha256(files.joinpath(name).read_bytes()).hexdigest() == sha for name, sha in expected.items()
    )


_GENERATED_OK = _generated_matches()
if _GENERATED_OK:  # load it now, with the package, not inside the first check (never when tampered with)
    from . import _generated  # noqa: F401


def _generated_entry(name: str) -> Callable[..., Any]:
    from . import _generated

    entry: Callable[..., Any] = getattr(_generated, name)
    return entry

# Coq lists and options as the generated module represents them (constructor index first).
_NIL: tuple[Any, ...] = (0,)
_NONE: tuple[Any, ...] = (1,)


def _cons_list(items: list[Any]) -> tuple[Any, ...]:
    out: tuple[Any, ...] = _NIL
    for item in reversed(items):
        out = (1, item, out)
    return out


def _is_int(x: object) -> bool:
    return type(x) is int


def _as_vec(a: npt.NDArray[Any], n: int, what: str) -> npt.NDArray[np.int64]:
    """A read-only vec: int32 and int64 tables are used as they are (no copy); other integer dtypes are
    converted to int64, refusing entries beyond it."""
    if a.dtype.kind not in "iu":
        raise OracleInputError(f"{what} must hold integers, got dtype {a.dtype}")
    if a.shape != (n,):
        raise OracleInputError(f"{what} must have shape ({n},), got {a.shape}")
    # Entries must be naturals; the extracted checker itself checks that they are below n.
    if n and int(a.min()) < 0:
        raise OracleInputError(f"{what} has negative entries")
    if a.dtype in (np.dtype(np.int32), np.dtype(np.int64)):
        out = a.view()
    else:
        if n and int(a.max()) > _INT64_MAX:
            raise OracleInputError(f"{what} has entries beyond int64")
        out = a.astype(np.int64)
    out.flags.writeable = False
    return out


def check_tables(
    *,
    valid: npt.NDArray[Any],
    repair: npt.NDArray[Any],
    apply: npt.NDArray[Any],
    pairs: list[tuple[int, int]] | None,
    domain: Literal["valid", "reachable"],
    initial: int,
    nf: npt.NDArray[Any] | None = None,
    depth: npt.NDArray[Any] | None = None,
) -> TableVerdict:
    """Re-check a machine from its tables with the extracted checker; see `TableVerdict`.

    valid: (N,) bool; repair: (N,) one-step repair table (repair[s] == s for valid s); apply: (E, N) raw
    event table before normalization; pairs: the checked pairs (None = every unordered pair); domain:
    "valid" or "reachable" (from `initial`).  Optionally a witness, both or neither: nf, the (N,)
    normal form of every state, and depth, the (N,) number of repair steps from every state.  The
    witness is not trusted: the extracted `check_tables_w` checks it (instead of pointer doubling) and
    then gives exactly the verdict it gives without one (`Govern.TableCheck.check_tables_w_eq`); a wrong
    witness is malformed input.  Raises OracleInputError on malformed input and OracleNoVerdict when the
    extracted code fails; never returns a verdict in either case.
    """
    if not isinstance(valid, np.ndarray) or valid.dtype != np.bool_ or valid.ndim != 1:
        raise OracleInputError("valid must be a 1-D numpy bool array")
    n = int(valid.shape[0])
    if n < 1 or n > _MAX_STATES:
        raise OracleInputError(f"the machine must have 1..{_MAX_STATES} states, got {n}")
    if not isinstance(repair, np.ndarray):
        raise OracleInputError("repair must be a numpy array")
    if not isinstance(apply, np.ndarray) or apply.ndim != 2 or apply.shape[1] != n:
        raise OracleInputError(f"apply must be a numpy array of shape (E, {n})")
    e = int(apply.shape[0])
    if domain not in ("valid", "reachable"):
        raise OracleInputError(f'domain must be "valid" or "reachable", got {domain!r}')
    if not _is_int(initial) or not 0 <= initial < n:
        raise OracleInputError(f"initial must be an int in 0..{n - 1}, got {initial!r}")
    vrow = valid.view()
    vrow.flags.writeable = False
    rep = _as_vec(repair, n, "repair")
    rows = [_as_vec(apply[i], n, f"apply[{i}]") for i in range(e)]
    if pairs is None:
        cpairs: tuple[Any, ...] = _NONE
    else:
        if not isinstance(pairs, list):
            raise OracleInputError("pairs must be a list of (a, b) tuples or None")
        items = []
        for p in pairs:
            if not isinstance(p, tuple) or len(p) != 2 or not all(_is_int(x) for x in p):
                raise OracleInputError(f"pair {p!r} is not a tuple of two ints")
            a, b = p
            if not (0 <= a < e and 0 <= b < e) or a == b:
                raise OracleInputError(f"pair {p!r} must name two distinct events in 0..{e - 1}")
            items.append((0, a, b))
        cpairs = (0, _cons_list(items))
    witness: tuple[Any, ...] = ()
    if (nf is None) != (depth is None):
        raise OracleInputError("give both nf and depth (the witness) or neither")
    if nf is not None and depth is not None:
        if not isinstance(nf, np.ndarray) or not isinstance(depth, np.ndarray):
            raise OracleInputError("nf and depth must be numpy arrays")
        witness = (_as_vec(nf, n, "nf"), _as_vec(depth, n, "depth"))
    if not _GENERATED_OK:
        raise OracleNoVerdict(
            "govern/oracle/_generated.py, _prims.py or __init__.py does not match PROVENANCE; regenerate "
            "with `make -C rocq regen`"
        )
    entry: Callable[..., Any] = _generated_entry("c_check_tables_w" if witness else "c_check_tables")
    try:
        raw = entry(vrow, rep, _cons_list(rows), cpairs, domain == "reachable", initial, *witness)
    except Exception as err:
        raise OracleNoVerdict(f"the extracted checker failed: {type(err).__name__}: {err}") from err
    finally:
        _prims.reset()
    return _decode(raw, n, domain == "valid", bool(witness))


def _decode(raw: Any, n: int, valid_domain: bool, witnessed: bool = False) -> TableVerdict:
    def bad(why: str) -> OracleNoVerdict:
        return OracleNoVerdict(f"the extracted checker returned a malformed verdict ({why})")

    if not isinstance(raw, tuple) or len(raw) != 14 or raw[0] != 0:
        raise bad("shape")
    _, wf, certified, wfc, depth, init_ok, dom_ok, cc1, witness, cc2, nf, dsize, obl, nid = raw
    for flag in (wf, certified, wfc, init_ok, dom_ok, cc1, cc2):
        if type(flag) is not bool:
            raise bad("flag type")
    if not _is_int(depth) or not _is_int(dsize):
        raise bad("number type")
    if not wf:
        raise OracleInputError(
            "the extracted checker found the tables malformed (shapes or ranges), "
            + ("or the witness wrong (nf is not the normal form or depth not the repair depth of every "
               "state), " if witnessed else "")
            + "or could not number the valid states (a primitive failed its own check)"
        )
    wit: tuple[int, int, int] | None
    if witness == _NONE:
        wit = None
    elif isinstance(witness, tuple) and len(witness) == 2 and witness[0] == 0:
        try:
            (_, (_, a, b), s) = witness[1]
        except (TypeError, ValueError) as err:
            raise bad("witness") from err
        if not all(_is_int(x) for x in (a, b, s)):
            raise bad("witness type")
        wit = (a, b, s)
    else:
        raise bad("witness")
    if not isinstance(nf, np.ndarray) or nf.shape != (n,):
        raise bad("nf")
    if certified != (wfc and init_ok and dom_ok and cc1):
        raise bad("certified is not the conjunction of its parts")
    obligations = tuple(sorted(_decode_pairs(_uncons(obl, bad), bad)))
    not_idempotent = tuple(sorted(_uncons(nid, bad)))
    if not all(_is_int(e) for e in not_idempotent) or len(set(not_idempotent)) != len(not_idempotent):
        raise bad("not-idempotent events")
    if len(set(obligations)) != len(obligations):
        raise bad("obligations repeat")
    # What a certified verdict rests on: with CC2 on the "valid" domain, the full convergence theorem
    # (any interleaving of compensation); otherwise trace equivalence of normalized runs from D.
    if not certified:
        theorem = THEOREM_WITNESS if wit is not None else (THEOREM_NO_WFC if not wfc else THEOREM_TABLES)
    elif cc2 and valid_domain:
        theorem = THEOREM_CONVERGENCE
    else:
        theorem = THEOREM_TRACE
    return TableVerdict(
        certified=certified,
        wfc=wfc,
        max_depth=depth,
        initial_valid=init_ok,
        cc1=cc1,
        cc1_witness=wit,
        cc2=cc2,
        nf=nf,
        domain_size=dsize,
        theorem=theorem,
        obligations=obligations,
        not_idempotent=not_idempotent,
    )


def _uncons(lst: Any, bad: Callable[[str], OracleNoVerdict]) -> list[Any]:
    out = []
    while isinstance(lst, tuple) and len(lst) == 3 and lst[0] == 1:
        out.append(lst[1])
        lst = lst[2]
    if lst != _NIL:
        raise bad("list")
    return out


def _decode_pairs(items: list[Any], bad: Callable[[str], OracleNoVerdict]) -> list[tuple[int, int]]:
    out = []
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 3 and item[0] == 0
                and _is_int(item[1]) and _is_int(item[2])):
            raise bad("obligation pair")
        out.append((item[1], item[2]))
    return out


# ---- the rules checker --------------------------------------------------------------------------------

_OPS: dict[str, tuple[int, int]] = {  # op -> (constructor index in Rules.expr, number of sub-expressions)
    "add": (2, 2), "sub": (3, 2), "min": (4, 2), "max": (5, 2), "ite": (6, 3), "eq": (7, 2), "lt": (8, 2),
    "le": (9, 2), "and": (10, 2), "or": (11, 2), "not": (12, 1),
}
_MAX_DEPTH = 120
_MAX_VARS = 400


@dataclass(frozen=True)
class RulesVerdict:
    """Whether the given tables are exactly the tables the rules define (with no domain violation).

    `matches` True rests on `theorem`; otherwise `detail` says which table differs first.
    """

    matches: bool
    detail: str
    theorem: str


def _expr(node: Any, k: int, depth: int, where: str) -> tuple[Any, ...]:
    if depth > _MAX_DEPTH:
        raise OracleInputError(f"{where}: expression nested deeper than {_MAX_DEPTH}")
    if not isinstance(node, list) or not node or not isinstance(node[0], str):
        raise OracleInputError(f"{where}: expected an expression [op, args...], got {node!r}")
    op, args = node[0], node[1:]
    if op == "var":
        if len(args) != 1 or not _is_int(args[0]) or not 0 <= args[0] < k:
            raise OracleInputError(f"{where}: ['var', i] needs a variable position in 0..{k - 1}")
        return (0, args[0])
    if op == "lit":
        if len(args) != 1 or not _is_int(args[0]):
            raise OracleInputError(f"{where}: ['lit', n] needs an int")
        return (1, args[0])
    if op not in _OPS:
        raise OracleInputError(f"{where}: unknown expression node {op!r}")
    tag, arity = _OPS[op]
    if len(args) != arity:
        raise OracleInputError(f"{where}: {op!r} takes {arity} operands, got {len(args)}")
    return (tag, *(_expr(a, k, depth + 1, where) for a in args))


def _assignment(node: Any, k: int, where: str) -> tuple[Any, ...]:
    if not isinstance(node, list):
        raise OracleInputError(f"{where}: expected an assignment [[i, expr], ...], got {node!r}")
    items, last = [], -1
    for pair in node:
        if not isinstance(pair, list) or len(pair) != 2 or not _is_int(pair[0]):
            raise OracleInputError(f"{where}: expected [i, expr], got {pair!r}")
        i = pair[0]
        if not last < i < k:
            raise OracleInputError(f"{where}: assigned positions must be increasing, distinct, in 0..{k - 1}")
        last = i
        items.append((0, i, _expr(pair[1], k, 0, where)))
    return _cons_list(items)


def _rule(node: Any, cond: str, body: str, k: int, where: str) -> tuple[Any, ...]:
    if not isinstance(node, dict):
        raise OracleInputError(f"{where}: expected an object")
    if node.get(cond) is None or node.get(body) is None:
        raise OracleInputError(f"{where} is a Python callable (no expression): the rules checker cannot "
                               "read it; such a machine is checked through its tables only")
    return (0, _expr(node[cond], k, 0, f"{where}.{cond}"), _assignment(node[body], k, f"{where}.{body}"))


def _variables(rules: dict[str, Any]) -> list[tuple[int, int]]:
    variables = rules.get("variables")
    if not isinstance(variables, list) or not 1 <= len(variables) <= _MAX_VARS:
        raise OracleInputError(f"rules.variables must list 1..{_MAX_VARS} variables")
    out = []
    for i, v in enumerate(variables):
        kind = v.get("kind") if isinstance(v, dict) else None
        if kind == "bool":
            out.append((0, 2))
        elif kind == "enum":
            labels = v.get("labels")
            if not isinstance(labels, list) or len(labels) < 2:
                raise OracleInputError(f"variable {i}: an enum needs at least 2 labels")
            out.append((0, len(labels)))
        elif kind == "int":
            lo, hi = v.get("min"), v.get("max")
            if not _is_int(lo) or not _is_int(hi) or lo > hi:
                raise OracleInputError(f"variable {i}: an int needs integer min <= max")
            out.append((lo, hi - lo + 1))
        else:
            raise OracleInputError(f"variable {i}: unknown kind {kind!r}")
    return out


def _rules_detail(code: int, events: list[str]) -> str:
    if code == 0:
        return "the tables do not have the number of states the variables define"
    if code == 1:
        return "the validity flags differ from the invariants"
    if code == 2:
        return "the repair table differs from the invariants' repairs"
    if code == 3:
        return "a repair assigns a value outside its variable's domain, or the number of event tables differs"
    k, kind = divmod(code - 4, 2)
    name = events[k] if 0 <= k < len(events) else f"#{k}"
    if kind == 0:
        return f"the table of event {name!r} differs from its guard and effect"
    return f"event {name!r} assigns a value outside its variable's domain"


def check_rules(
    *,
    rules: dict[str, Any],
    valid: npt.NDArray[Any],
    repair: npt.NDArray[Any],
    apply: npt.NDArray[Any],
) -> RulesVerdict:
    """Recompute the tables from the machine's rules (docs/semantics.md, "The machine as data") with the
    extracted rules checker and compare them with the given ones.

    Raises OracleInputError when the rules or tables are malformed (or a rule has no expression) and
    OracleNoVerdict when the extracted code fails.
    """
    if not isinstance(rules, dict):
        raise OracleInputError("rules must be the machine JSON object")
    variables = _variables(rules)
    k = len(variables)
    invs, events = rules.get("invariants"), rules.get("events")
    if not isinstance(invs, list) or not isinstance(events, list):
        raise OracleInputError("rules.invariants and rules.events must be lists")
    cinvs = _cons_list([_rule(r, "holds", "repair", k, f"invariant {i}") for i, r in enumerate(invs)])
    cevs = _cons_list([_rule(r, "guard", "effect", k, f"event {i}") for i, r in enumerate(events)])
    if not isinstance(valid, np.ndarray) or valid.dtype != np.bool_ or valid.ndim != 1:
        raise OracleInputError("valid must be a 1-D numpy bool array")
    n = int(valid.shape[0])
    if not isinstance(apply, np.ndarray) or apply.ndim != 2 or apply.shape[1] != n:
        raise OracleInputError(f"apply must be a numpy array of shape (E, {n})")
    if not isinstance(repair, np.ndarray):
        raise OracleInputError("repair must be a numpy array")
    vrow = valid.view()
    vrow.flags.writeable = False
    rep = _as_vec(repair, n, "repair")
    rows = [_as_vec(apply[i], n, f"apply[{i}]") for i in range(int(apply.shape[0]))]
    if not _GENERATED_OK:
        raise OracleNoVerdict(
            "govern/oracle/_generated.py, _prims.py or __init__.py does not match PROVENANCE; regenerate "
            "with `make -C rocq regen`"
        )
    entry = _generated_entry("c_check_rules")
    cvars = _cons_list([(0, lo, size) for lo, size in variables])
    try:
        raw = entry(cvars, cinvs, cevs, vrow, rep, _cons_list(rows))
    except Exception as err:
        raise OracleNoVerdict(f"the extracted rules checker failed: {type(err).__name__}: {err}") from err
    finally:
        _prims.reset()
    if raw == _NONE:
        return RulesVerdict(True, "", THEOREM_RULES)
    if isinstance(raw, tuple) and len(raw) == 2 and raw[0] == 0 and _is_int(raw[1]):
        names = [str(e.get("name", f"#{i}")) for i, e in enumerate(events)]
        return RulesVerdict(False, _rules_detail(raw[1], names), THEOREM_RULES)
    raise OracleNoVerdict("the extracted rules checker returned a malformed answer")


# ---- the decomposition checker ---------------------------------------------------------------------


def _labels(value: Any, length: int, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) != length or not all(_is_int(x) and x >= 0 for x in value):
        raise OracleInputError(f"{what} must list {length} component numbers (naturals)")
    return list(value)


def check_decomposition(
    *, rules: dict[str, Any], variables: list[int], invariants: list[int], events: list[int]
) -> bool:
    """Whether the claimed components are disjoint and closed: with `variables[i]` the component of
    variable i (so components are disjoint) and `invariants[k]`, `events[k]` the component of each rule,
    the extracted `Compose.check_decomposition` checks that every rule reads and writes only variables
    of its own component (`Govern.Compose.check_decomposition_sound`). True or False is its verdict.

    Raises OracleInputError when the rules or labels are malformed (or a rule has no expression) and
    OracleNoVerdict when the extracted code fails."""
    if not isinstance(rules, dict):
        raise OracleInputError("rules must be the machine JSON object")
    k = len(_variables(rules))
    invs, evs = rules.get("invariants"), rules.get("events")
    if not isinstance(invs, list) or not isinstance(evs, list):
        raise OracleInputError("rules.invariants and rules.events must be lists")
    cinvs = _cons_list([_rule(r, "holds", "repair", k, f"invariant {i}") for i, r in enumerate(invs)])
    cevs = _cons_list([_rule(r, "guard", "effect", k, f"event {i}") for i, r in enumerate(evs)])
    lab = _cons_list(_labels(variables, k, "variables"))
    inv_lab = _cons_list(_labels(invariants, len(invs), "invariants"))
    ev_lab = _cons_list(_labels(events, len(evs), "events"))
    if not _GENERATED_OK:
        raise OracleNoVerdict(
            "govern/oracle/_generated.py, _prims.py or __init__.py does not match PROVENANCE; regenerate "
            "with `make -C rocq regen`"
        )
    entry = _generated_entry("c_check_decomposition")
    try:
        raw = entry(lab, cinvs, inv_lab, cevs, ev_lab)
    except Exception as err:
        raise OracleNoVerdict(
            f"the extracted decomposition checker failed: {type(err).__name__}: {err}"
        ) from err
    finally:
        _prims.reset()
    if raw is True or raw is False:
        return raw
    raise OracleNoVerdict("the extracted decomposition checker returned a malformed answer")
