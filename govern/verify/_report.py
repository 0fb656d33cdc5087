"""The success report of a build: what was checked, on which domain, what it guarantees, and why.

A `Report` is structured data (`to_dict()` is JSON-ready and versioned by `REPORT_FORMAT`); the text
rendering (`text()`, `str()`) is derived from it. Each guarantee names the condition it rests on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._counterexample import Divergence, divergence_from_dict

__all__ = ["REPORT_FORMAT", "PrunedPair", "Report", "guarantee_text"]

REPORT_FORMAT = "govern.report.v1"


@dataclass(frozen=True)
class PrunedPair:
    """A pair whose CC1 check was skipped, and why that is sound."""

    a: str
    b: str
    reason: str


@dataclass(frozen=True)
class Report:
    """Everything a build established. Fields:

    - `states` (N), `valid_states`, `domain` ("valid"/"reachable") and `domain_states` (|D|).
    - `pair_mode`: "all" (no declaration: every pair checked) or "declared"; `pairs_checked` (the
      pairs CC1 holds for), `pairs_pruned` (subset skipped by sound footprint pruning, with reasons),
      `undeclared_pairs` (declared mode: pairs checked only for obligations).
    - `max_repair_depth`: most repair steps any state needs (WFC holds, or there is no machine).
    - `cc2` and `cc2_witness`: whether NF(apply(e, s)) = NF(apply(e, NF(s))) for every e and s.
    - `obligations`: undeclared pairs that do not commute on D, each with a witness: deliver them in
      one fixed causal order. `not_idempotent`: events whose redelivery changes the state: dedupe them.
    - `guarantee` and `theorems`: what holds, and the results it rests on.
    - `trusted_callables`: rules given as Python callables (traced, but trusted to be pure).
    - `oracle`: the proof-derived oracle's identity and verdict; `timings`: seconds per phase.
    """

    machine: str
    domain: str
    states: int
    valid_states: int
    domain_states: int
    initial: dict[str, Any]
    events: tuple[str, ...]
    invariants: tuple[str, ...]
    pair_mode: str
    pairs_checked: tuple[tuple[str, str], ...]
    pairs_pruned: tuple[PrunedPair, ...]
    undeclared_pairs: int
    max_repair_depth: int
    cc2: bool
    cc2_failing_events: tuple[str, ...]
    cc2_witness: Divergence | None
    obligations: tuple[Divergence, ...]
    not_idempotent: tuple[Divergence, ...]
    guarantee: str
    theorems: tuple[str, ...]
    trusted_callables: tuple[str, ...]
    footprints: dict[str, tuple[str, ...]]
    oracle: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    wfc: bool = True
    cc1: bool = True
    #: "enumeration" (tables over every state, re-checked by the proof-derived oracle) or "symbolic"
    #: (decided on the rules' AST by `solver`; `valid_states`/`domain_states` are then -1: not counted).
    method: str = "enumeration"
    solver: dict[str, Any] | None = None

    @property
    def total_seconds(self) -> float:
        """Wall-clock seconds of the whole build."""
        return sum(self.timings.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (floats only in `timings`)."""
        return {
            "format": REPORT_FORMAT,
            "machine": self.machine,
            "domain": self.domain,
            "states": self.states,
            "valid_states": self.valid_states,
            "domain_states": self.domain_states,
            "initial": dict(self.initial),
            "events": list(self.events),
            "invariants": list(self.invariants),
            "pair_mode": self.pair_mode,
            "pairs_checked": [list(p) for p in self.pairs_checked],
            "pairs_pruned": [{"a": p.a, "b": p.b, "reason": p.reason} for p in self.pairs_pruned],
            "undeclared_pairs": self.undeclared_pairs,
            "wfc": self.wfc,
            "cc1": self.cc1,
            "max_repair_depth": self.max_repair_depth,
            "cc2": self.cc2,
            "cc2_failing_events": list(self.cc2_failing_events),
            "cc2_witness": self.cc2_witness.to_dict() if self.cc2_witness else None,
            "obligations": [d.to_dict() for d in self.obligations],
            "not_idempotent": [d.to_dict() for d in self.not_idempotent],
            "guarantee": self.guarantee,
            "theorems": list(self.theorems),
            "trusted_callables": list(self.trusted_callables),
            "footprints": {k: list(v) for k, v in self.footprints.items()},
            "oracle": self.oracle,
            "timings": dict(self.timings),
            "method": self.method,
            "solver": self.solver,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        """Rebuild a report from `to_dict()` output."""
        return cls(
            machine=d["machine"],
            domain=d["domain"],
            states=d["states"],
            valid_states=d["valid_states"],
            domain_states=d["domain_states"],
            initial=dict(d["initial"]),
            events=tuple(d["events"]),
            invariants=tuple(d["invariants"]),
            pair_mode=d["pair_mode"],
            pairs_checked=tuple((a, b) for a, b in d["pairs_checked"]),
            pairs_pruned=tuple(PrunedPair(p["a"], p["b"], p["reason"]) for p in d["pairs_pruned"]),
            undeclared_pairs=d["undeclared_pairs"],
            max_repair_depth=d["max_repair_depth"],
            cc2=d["cc2"],
            cc2_failing_events=tuple(d["cc2_failing_events"]),
            cc2_witness=divergence_from_dict(d["cc2_witness"]) if d["cc2_witness"] else None,
            obligations=tuple(divergence_from_dict(x) for x in d["obligations"]),
            not_idempotent=tuple(divergence_from_dict(x) for x in d["not_idempotent"]),
            guarantee=d["guarantee"],
            theorems=tuple(d["theorems"]),
            trusted_callables=tuple(d["trusted_callables"]),
            footprints={k: tuple(v) for k, v in d["footprints"].items()},
            oracle=d["oracle"],
            timings=dict(d["timings"]),
            wfc=d["wfc"],
            cc1=d["cc1"],
            method=d.get("method", "enumeration"),
            solver=d.get("solver"),
        )

    def text(self, *, witnesses: bool = True) -> str:
        """A readable rendering; `witnesses=False` leaves out the witness traces."""
        pruned = len(self.pairs_pruned)
        compared = len(self.pairs_checked) - pruned
        if self.method == "symbolic":
            counted = f"{self.states:,} (not enumerated); checked domain D = every valid state"
        else:
            counted = (
                f"{self.states:,} ({self.valid_states:,} valid); "
                f"checked domain D = {self.domain} states: {self.domain_states:,}"
            )
        lines = [
            f"machine {self.machine!r}: CONVERGES",
            f"  states        {counted}",
            f"  initial       {_fmt(self.initial)}",
            f"  events        {len(self.events)}: {', '.join(self.events)}",
            f"  invariants    {len(self.invariants)}: {', '.join(self.invariants) or '(none)'}",
            "  WFC           holds: repair terminates from every state; "
            f"max repair depth {self.max_repair_depth}",
            f"  CC1           holds on D for {len(self.pairs_checked)} pair(s) "
            f"({'every pair' if self.pair_mode == 'all' else 'declared pairs'}): {compared} compared, "
            f"{pruned} pruned",
        ]
        for p in self.pairs_pruned[:5]:
            lines.append(f"                pruned {p.a}/{p.b}: {p.reason}")
        if pruned > 5:
            lines.append(f"                ... and {pruned - 5} more pruned for the same reason kind")
        if self.cc2:
            lines.append("  CC2           holds for every event and state")
        else:
            lines.append(
                f"  CC2           fails for {', '.join(self.cc2_failing_events)}; the runtime normalizes "
                "before every apply (enforced by the step table)"
            )
            if witnesses and self.cc2_witness:
                lines += ["                " + x for x in self.cc2_witness.render().splitlines()]
        if self.pair_mode == "declared":
            lines.append(
                f"  undeclared    {self.undeclared_pairs} pair(s); {len(self.obligations)} do not commute"
            )
        if self.obligations:
            lines.append("  OBLIGATIONS   deliver these pairs in one fixed causal order:")
            for d in self.obligations:
                lines.append(f"                {d.events[0]} / {d.events[1]}")
                if witnesses:
                    lines += ["                  " + x for x in d.render().splitlines()[1:]]
        if self.not_idempotent:
            lines.append(
                "  NOT IDEMPOTENT deduplicate redeliveries of: "
                + ", ".join(d.events[0] for d in self.not_idempotent)
            )
        else:
            lines.append("  idempotent    every event: a redelivered event changes nothing")
        if self.trusted_callables:
            lines.append(
                "  trusted       callables (footprints traced; purity trusted): "
                + ", ".join(self.trusted_callables)
            )
        lines.append("  guarantee     " + self.guarantee)
        lines.append("  theorems      " + "; ".join(self.theorems))
        if self.solver:
            lines.append(
                f"  method        symbolic: every verdict above rests on {self.solver.get('name', '?')} "
                f"{self.solver.get('version', '?')} ({self.solver.get('package', '?')}); its "
                "unsatisfiable answers are not re-checked by the proof-derived oracle, its "
                "counterexamples were replayed through the concrete semantics"
            )
        if self.oracle:
            lines.append(
                f"  oracle        {self.oracle.get('verdict', '?')} by {self.oracle.get('theorem', '?')} "
                f"(generated module sha256 {str(self.oracle.get('module_sha256', '?'))[:16]}...)"
            )
            if self.oracle.get("rules_checked"):
                lines.append(f"  rules oracle  {self.oracle['rules_checked']}")
        if self.timings:
            lines.append(
                "  timings       "
                + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in self.timings.items())
                + f"; total {self.total_seconds * 1000:.1f} ms"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def guarantee_text(
    *, cc2: bool, pair_mode: str, obligations: int, not_idempotent: int = 0, domain: str
) -> tuple[str, tuple[str, ...]]:
    """The guarantee a verdict supports, one sentence per claim, each naming in brackets the Rocq theorem
    it rests on (rocq/README.md); and those theorems, with what each says in words."""
    where = (
        "From every valid state"
        if domain == "valid"
        else "From the initial state (and every state reachable from it)"
    )
    if pair_mode == "all":
        scope = "any two delivery orders of the same events reach the same state"
    else:
        scope = (
            "event sequences that differ only by swapping adjacent declared-independent events reach "
            "the same state"
        )
    sentences = [
        f"{where}, {scope}, with the state normalized after each event (Machine.apply does this) "
        f"[{_TRACE}]."
    ]
    theorems = [f"{_TRACE} (trace equivalence from D under eager compensation: WFC + CC1 on D)"]
    if pair_mode == "declared":
        sentences.append(
            f"{obligations} undeclared pair(s) do not commute and must be delivered in one fixed causal "
            f"order (see obligations); every other pair commutes on D [{_DELIVERY}]."
            if obligations
            else f"Every undeclared pair commutes as well [{_DELIVERY}]."
        )
    else:
        sentences.append(f"No pair needs a causal order: every pair commutes on D [{_DELIVERY}].")
    theorems.append(f"{_DELIVERY} (the obligations and not-idempotent events are exactly right on D)")
    sentences.append(
        "A replica that applies every logged event once, keeping each obligation pair in log order, "
        f"reaches the state the log order reaches [{_REPLICA}]."
    )
    theorems.append(
        f"{_REPLICA} (any delivery order keeping the obligation pairs reaches the log-order state)"
    )
    sentences.append(
        f"Delivering {not_idempotent} event(s) twice can change the state (see not_idempotent): deduplicate "
        "them; a redelivery of any other event is absorbed unless an obligation partner of it arrives "
        f"between the two copies [{_DUPLICATE}]."
        if not_idempotent
        else "Every event is idempotent on D: a redelivery is absorbed unless an obligation partner of it "
        f"arrives between the two copies [{_DUPLICATE}]."
    )
    theorems.append(
        f"{_DUPLICATE} (when a duplicate delivery is absorbed, and that both conditions are needed)"
    )
    if cc2:
        if domain == "valid":
            sentences.append(
                "CC2 holds too, so compensation may interleave with delivery in any way and the result "
                f"is still the same valid state [{_CONVERGENCE}]."
            )
            theorems.append(
                f"{_CONVERGENCE} (confluence of the full rewrite system: WFC + CC1 + CC2, Newman's lemma)"
            )
        else:
            # Governance.v needs CC1 on every valid state; a "reachable" build checked fewer states.
            sentences.append(
                "CC2 holds too (NF(apply(e, s)) = NF(apply(e, NF(s))) at every state), so repairing "
                "before or after an event gives the same normal form; the Rocq confluence theorem covers "
                f"only the domain of every valid state [{_CC2}]."
            )
            theorems.append(f"{_CC2} (the CC2 flag is exactly CC2 on every state)")
    return " ".join(sentences), tuple(theorems)


_TRACE = "Govern.TableCheck.check_tables_trace"
_CC2 = "Govern.TableCheck.check_tables_cc2"
_CONVERGENCE = "Govern.Bridge.check_tables_convergence"
_DELIVERY = "Govern.Delivery.check_tables_delivery"
_REPLICA = "Govern.Delivery.check_tables_replica"
_DUPLICATE = "Govern.Delivery.check_tables_duplicate"


def _fmt(s: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v!r}" for k, v in s.items()) + "}"
