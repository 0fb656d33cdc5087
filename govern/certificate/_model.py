"""The certificate document (format `govern-certificate/1`) as strict pydantic models.

These models are the format: every field, its type and its bounds. Reading is strict (no unknown
fields, no coercion: `1` is not a string, `true` is not an integer); structural rules a type cannot
say (expression arity, variable positions, sorted pairs, state-space bounds) are checked by
`validate_machine`. docs/certificate.md and certs/schema/ describe the same thing for people and
for other tools.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import CertificateUnreadable
from ._signing import is_signing_time

__all__ = [
    "ARITY",
    "COMPOSED_FORMAT",
    "FORMAT",
    "MAX_NAME",
    "MAX_STATES",
    "MAX_TABLE_ENTRIES",
    "BoolVariable",
    "CertificateModel",
    "ComponentEntry",
    "ComposedCertificateModel",
    "ComposedVerdict",
    "EnumVariable",
    "EventRule",
    "IntVariable",
    "InvariantRule",
    "MachineRules",
    "SignatureBlock",
    "Tables",
    "ToolInfo",
    "Verdict",
    "domain_sizes",
    "has_rules",
    "initial_state",
    "parse_document",
    "validate_machine",
    "validate_model",
]

M = TypeVar("M", bound=BaseModel)

FORMAT: Final = "govern-certificate/1"

#: A checker refuses machines whose tables would exceed these (before decompressing anything).
MAX_STATES: Final = 1 << 24
MAX_TABLE_ENTRIES: Final = 1 << 26
#: The longest name (of the machine, a variable, a label, an invariant or an event) a certificate holds.
MAX_NAME: Final = 200

#: Every integer in a machine (bounds, literals) lies in the 64-bit range, as the engine requires.
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

#: Every expression node and the number of arguments it takes.
ARITY: Final = {
    "var": 1, "lit": 1, "add": 2, "sub": 2, "min": 2, "max": 2, "ite": 3,
    "eq": 2, "lt": 2, "le": 2, "and": 2, "or": 2, "not": 1,
}

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
NonNeg = Annotated[int, Field(ge=0)]


class BoolVariable(BaseModel):
    """A variable with values 0 (False) and 1 (True)."""

    model_config = _STRICT
    name: Name
    kind: Literal["bool"]


class EnumVariable(BaseModel):
    """A variable whose values are the positions 0..m-1 of its labels."""

    model_config = _STRICT
    name: Name
    kind: Literal["enum"]
    labels: Annotated[list[Name], Field(min_length=2)]


class IntVariable(BaseModel):
    """A variable over the integers min..max inclusive."""

    model_config = _STRICT
    name: Name
    kind: Literal["int"]
    min: int
    max: int


Variable = Annotated[BoolVariable | EnumVariable | IntVariable, Field(discriminator="kind")]


class InvariantRule(BaseModel):
    """An invariant: its condition and repair as AST, or null when declared with a Python callable."""

    model_config = _STRICT
    name: Name
    holds: list[Any] | None
    repair: list[Any] | None


class EventRule(BaseModel):
    """An event: guard and effect as AST, or null when declared with a Python callable."""

    model_config = _STRICT
    name: Name
    guard: list[Any] | None
    effect: list[Any] | None


class MachineRules(BaseModel):
    """The machine exactly as `Machine.rules()` gives it (docs/semantics.md, "The machine as data")."""

    model_config = _STRICT
    name: Name
    variables: Annotated[list[Variable], Field(min_length=1)]
    initial: list[int]
    invariants: list[InvariantRule]
    events: Annotated[list[EventRule], Field(min_length=1)]
    independent: list[Annotated[list[NonNeg], Field(min_length=2, max_length=2)]] | None
    domain: Literal["valid", "reachable"]


class Verdict(BaseModel):
    """What the build established; a checker recomputes every field from the tables."""

    model_config = _STRICT
    wfc: Literal[True]
    cc1: Literal[True]
    max_repair_depth: NonNeg
    states: Annotated[int, Field(ge=1)]
    valid_states: Annotated[int, Field(ge=1)]
    domain: Literal["valid", "reachable"]
    domain_states: Annotated[int, Field(ge=1)]
    pairs: Literal["declared", "all"]
    pairs_checked: list[Annotated[list[NonNeg], Field(min_length=2, max_length=2)]]
    cc2: bool
    causal_order_obligations: list[Annotated[list[NonNeg], Field(min_length=2, max_length=2)]]
    not_idempotent: list[NonNeg]
    guarantee: Literal["interleaved-repair", "repair-before-apply"]


class Tables(BaseModel):
    """The three tables, each zlib-compressed and base64-encoded (docs/certificate.md, "Tables")."""

    model_config = _STRICT
    valid: Annotated[str, Field(min_length=4)]
    repair: Annotated[str, Field(min_length=4)]
    apply: Annotated[str, Field(min_length=4)]


class ToolInfo(BaseModel):
    """The program that produced the certificate."""

    model_config = _STRICT
    name: Literal["govern"]
    version: Annotated[str, Field(min_length=1, max_length=100)]


class SignatureBlock(BaseModel):
    """An Ed25519 signature over the digest, the key id and the signing time (outside the digest)."""

    model_config = _STRICT
    algorithm: Literal["ed25519"]
    key_id: Annotated[str, Field(pattern=r"^ed25519:[0-9a-f]{64}$")]
    public_key: Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{43}=$")]
    signed_at: Annotated[str, Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")]
    value: Annotated[str, Field(pattern=r"^[A-Za-z0-9+/]{86}==$")]


class CertificateModel(BaseModel):
    """A whole certificate document (of a machine whose tables it holds)."""

    model_config = _STRICT
    format: Literal["govern-certificate/1"]
    tool: ToolInfo
    machine: MachineRules
    verdict: Verdict
    tables: Tables
    oracle: dict[Annotated[str, Field(min_length=1, max_length=100)], Annotated[str, Field(max_length=4096)]]
    digest: Digest
    signature: SignatureBlock | None = None


COMPOSED_FORMAT: Final = "govern-certificate/composed-1"


class ComposedVerdict(BaseModel):
    """A composed machine's verdict (whole-machine positions); a checker recomputes it from the
    components' verdicts. `pairs_checked` are the pairs checked on component tables; a pair across
    components needs no table (Govern.Compose.compose_cross)."""

    model_config = _STRICT
    wfc: Literal[True]
    cc1: Literal[True]
    components: Annotated[int, Field(ge=2)]
    max_repair_depth: NonNeg
    states: Annotated[int, Field(ge=1)]
    valid_states: Annotated[int, Field(ge=1)]
    domain: Literal["valid", "reachable"]
    domain_states: Annotated[int, Field(ge=1)]
    pairs: Literal["declared", "all"]
    pairs_checked: list[Annotated[list[NonNeg], Field(min_length=2, max_length=2)]]
    cc2: bool
    causal_order_obligations: list[Annotated[list[NonNeg], Field(min_length=2, max_length=2)]]
    not_idempotent: list[NonNeg]
    guarantee: Literal["interleaved-repair", "repair-before-apply"]


class ComponentEntry(BaseModel):
    """One component: its variables, invariants and events (whole-machine positions, increasing) and
    its own certificate, whose machine must be exactly the whole machine's projection on them."""

    model_config = _STRICT
    variables: Annotated[list[NonNeg], Field(min_length=1)]
    invariants: list[NonNeg]
    events: Annotated[list[NonNeg], Field(min_length=1)]
    certificate: dict[str, Any]  # a whole govern-certificate/1 document, read by read_table_certificate


class ComposedCertificateModel(BaseModel):
    """A certificate of a machine built by components (format `govern-certificate/composed-1`)."""

    model_config = _STRICT
    format: Literal["govern-certificate/composed-1"]
    tool: ToolInfo
    machine: MachineRules
    verdict: ComposedVerdict
    components: Annotated[list[ComponentEntry], Field(min_length=2)]
    oracle: dict[Annotated[str, Field(min_length=1, max_length=100)], Annotated[str, Field(max_length=4096)]]
    digest: Digest
    signature: SignatureBlock | None = None


def validate_model(model_class: type[M], value: Any, what: str) -> M:
    """Validate a parsed JSON value as one of the certificate models (`what` names it in errors);
    `CertificateUnreadable` lists what is wrong."""
    if not isinstance(value, dict):
        raise CertificateUnreadable("a certificate is a JSON object")
    if "signature" in value and value["signature"] is None:
        raise CertificateUnreadable("signature: omit the field instead of writing null")
    try:
        return model_class.model_validate(value)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:5]:
            where = ".".join(str(part) for part in error["loc"]) or "(document)"
            problems.append(f"{where}: {error['msg']}")
        more = f" (and {exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
        raise CertificateUnreadable(f"not a {what}: " + "; ".join(problems) + more) from None


def parse_document(value: Any) -> CertificateModel:
    """Validate a parsed JSON value as a certificate; `CertificateUnreadable` lists what is wrong."""
    model = validate_model(CertificateModel, value, "govern certificate")
    validate_machine(model.machine)
    if model.signature is not None and not is_signing_time(model.signature.signed_at):
        raise CertificateUnreadable("signature.signed_at is not a date and time that exists")
    return model


def domain_sizes(machine: MachineRules) -> list[tuple[int, int]]:
    """(lowest value, number of values) for each variable, in declaration order."""
    sizes = []
    for variable in machine.variables:
        if isinstance(variable, BoolVariable):
            sizes.append((0, 2))
        elif isinstance(variable, EnumVariable):
            sizes.append((0, len(variable.labels)))
        else:
            sizes.append((variable.min, variable.max - variable.min + 1))
    return sizes


def initial_state(machine: MachineRules) -> int:
    """The dense id of the machine's initial state (docs/semantics.md numbering, first variable fastest)."""
    identifier, stride = 0, 1
    for value, (low, size) in zip(machine.initial, domain_sizes(machine), strict=True):
        identifier += (value - low) * stride
        stride *= size
    return identifier


def _check_expression(node: Any, variables: int, where: str) -> None:
    stack = [node]
    while stack:
        item = stack.pop()
        if not isinstance(item, list) or not item or not isinstance(item[0], str):
            raise CertificateUnreadable(f"{where}: an expression node must be [op, args...]")
        op, args = item[0], item[1:]
        if op not in ARITY:
            raise CertificateUnreadable(f"{where}: unknown expression node {op!r}")
        if len(args) != ARITY[op]:
            raise CertificateUnreadable(f"{where}: {op!r} takes {ARITY[op]} argument(s), not {len(args)}")
        if op in ("var", "lit"):
            if type(args[0]) is not int:
                raise CertificateUnreadable(f"{where}: {op!r} takes an integer")
            if not INT64_MIN <= args[0] <= INT64_MAX:
                raise CertificateUnreadable(f"{where}: the literal {args[0]} is outside the 64-bit range")
            if op == "var" and not 0 <= args[0] < variables:
                raise CertificateUnreadable(f"{where}: variable position {args[0]} does not exist")
        else:
            stack.extend(args)


def _check_assignment(assignment: list[Any], variables: int, where: str) -> None:
    previous = -1
    for entry in assignment:
        if not isinstance(entry, list) or len(entry) != 2 or type(entry[0]) is not int:
            raise CertificateUnreadable(f"{where}: an assignment entry is [position, expression]")
        position, expression = entry
        if not 0 <= position < variables:
            raise CertificateUnreadable(
                f"{where}: assigns variable position {position}, which does not exist"
            )
        if position <= previous:
            raise CertificateUnreadable(f"{where}: assigned positions must be distinct and increasing")
        previous = position
        _check_expression(expression, variables, where)


def _check_pairs(pairs: list[list[int]], events: int, where: str) -> None:
    for pair in pairs:
        if not pair[0] < pair[1] < events:
            raise CertificateUnreadable(f"{where}: pair {pair} must be two event positions a < b")
    if [tuple(p) for p in pairs] != sorted({tuple(p) for p in pairs}):
        raise CertificateUnreadable(f"{where}: pairs must be sorted and distinct")


def validate_machine(machine: MachineRules, *, bounded: bool = True) -> None:
    """Check what the types cannot: well-formed rules, sane domains, and bounded table sizes (not
    `bounded`: the whole machine of a composed certificate, whose tables are its components')."""
    count = len(machine.variables)
    names = [v.name for v in machine.variables]
    if len(set(names)) != len(names):
        raise CertificateUnreadable("machine.variables: names must be distinct")
    for variable in machine.variables:
        if isinstance(variable, EnumVariable) and len(set(variable.labels)) != len(variable.labels):
            raise CertificateUnreadable(f"machine.variables: {variable.name}: labels must be distinct")
        if isinstance(variable, IntVariable) and variable.min > variable.max:
            raise CertificateUnreadable(f"machine.variables: {variable.name}: min is above max")
        if isinstance(variable, IntVariable) and not INT64_MIN <= variable.min <= variable.max <= INT64_MAX:
            raise CertificateUnreadable(f"machine.variables: {variable.name}: outside the 64-bit range")
    states = 1
    for _, size in domain_sizes(machine):
        states *= size
        if bounded and states > MAX_STATES:
            raise CertificateUnreadable(
                f"the machine has more than {MAX_STATES} states; this checker refuses tables that large"
            )
    if bounded and states * len(machine.events) > MAX_TABLE_ENTRIES:
        raise CertificateUnreadable(
            f"the apply table would have {states * len(machine.events)} entries, over {MAX_TABLE_ENTRIES}"
        )
    if len(machine.initial) != count:
        raise CertificateUnreadable(f"machine.initial: needs one value per variable ({count})")
    for value, (low, size), name in zip(machine.initial, domain_sizes(machine), names, strict=True):
        if not low <= value < low + size:
            raise CertificateUnreadable(f"machine.initial: {name} = {value} is outside its domain")
    for kind, rules in (("invariants", machine.invariants), ("events", machine.events)):
        seen = [rule.name for rule in rules]
        if len(set(seen)) != len(seen):
            raise CertificateUnreadable(f"machine.{kind}: names must be distinct")
    for invariant in machine.invariants:
        where = f"machine.invariants.{invariant.name}"
        if invariant.holds is not None:
            _check_expression(invariant.holds, count, where)
        if invariant.repair is not None:
            _check_assignment(invariant.repair, count, where)
    for event in machine.events:
        where = f"machine.events.{event.name}"
        if event.guard is not None:
            _check_expression(event.guard, count, where)
        if event.effect is not None:
            _check_assignment(event.effect, count, where)
    if machine.independent is not None:
        _check_pairs(machine.independent, len(machine.events), "machine.independent")


def has_rules(machine: MachineRules) -> bool:
    """True when every rule is an AST, so the rules themselves can be re-checked offline."""
    return all(i.holds is not None and i.repair is not None for i in machine.invariants) and all(
        e.guard is not None and e.effect is not None for e in machine.events
    )
