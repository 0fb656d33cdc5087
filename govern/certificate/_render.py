"""Reading a certificate's machine as a person would: rules rendered in Python-like syntax with names
and enum labels, states as `name=value` lists.

Works on the certificate's data only (the machine JSON), never on engine objects, so `govern show`
renders exactly what a certificate says.
"""

from __future__ import annotations

from typing import Any

from ._model import BoolVariable, EnumVariable, MachineRules, domain_sizes

__all__ = ["render_assignment", "render_expression", "render_state", "render_value", "state_values"]

_INFIX = {"add": "+", "sub": "-", "eq": "==", "lt": "<", "le": "<=", "and": "and", "or": "or"}
# Python's binding strength, weakest first: a child binding more weakly than its context gets parentheses.
_PRECEDENCE = {"ite": 0, "or": 1, "and": 2, "not": 3, "eq": 4, "lt": 4, "le": 4, "add": 5, "sub": 5}
_ATOM = 9


def render_value(machine: MachineRules, position: int, value: int) -> str:
    """Variable `position`'s value as a person writes it: True/False, 'label', or the integer."""
    variable = machine.variables[position]
    if isinstance(variable, BoolVariable) and value in (0, 1):
        return "True" if value else "False"
    if isinstance(variable, EnumVariable) and 0 <= value < len(variable.labels):
        return repr(variable.labels[value])
    return str(value)


def _as_var(node: Any) -> int | None:
    return node[1] if isinstance(node, list) and node and node[0] == "var" else None


def _render(machine: MachineRules, node: Any) -> tuple[str, int]:
    op, args = node[0], node[1:]
    names = [v.name for v in machine.variables]

    def sub(child: Any, need: int) -> str:
        text, strength = _render(machine, child)
        return text if strength >= need else f"({text})"

    if op == "var":
        return str(names[args[0]]), _ATOM
    if op == "lit":
        return str(args[0]), _ATOM
    if op in ("eq", "lt", "le"):
        left, right = args
        # Enum labels and booleans where a variable is compared with a literal.
        if _as_var(left) is not None and isinstance(right, list) and right[0] == "lit":
            return f"{names[left[1]]} {_INFIX[op]} {render_value(machine, left[1], right[1])}", 4
        if _as_var(right) is not None and isinstance(left, list) and left[0] == "lit":
            return f"{render_value(machine, right[1], left[1])} {_INFIX[op]} {names[right[1]]}", 4
        return f"{sub(left, 5)} {_INFIX[op]} {sub(right, 5)}", 4
    if op == "not":
        inner = args[0]
        if isinstance(inner, list) and inner[0] == "eq":
            return _render(machine, inner)[0].replace(" == ", " != ", 1), 4
        return f"not {sub(inner, 3)}", 3
    if op in ("and", "or"):
        level = _PRECEDENCE[op]
        return f"{sub(args[0], level)} {op} {sub(args[1], level + 1)}", level
    if op in ("add", "sub"):
        return f"{sub(args[0], 5)} {_INFIX[op]} {sub(args[1], 6)}", 5
    if op == "ite":
        return f"{sub(args[1], 1)} if {sub(args[0], 1)} else {sub(args[2], 0)}", 0
    return f"{op}({', '.join(_render(machine, a)[0] for a in args)})", _ATOM


def render_expression(machine: MachineRules, node: Any) -> str:
    """A JSON expression as readable Python-like text: `status != 'shipped' or paid`."""
    if node is None:
        return "(Python callable: not inspectable)"
    return _render(machine, node)[0]


def render_assignment(machine: MachineRules, assignment: Any) -> str:
    """An assignment as `status = 'paid', paid = True` (simultaneous)."""
    if assignment is None:
        return "(Python callable: not inspectable)"
    if not assignment:
        return "(no change)"
    parts = []
    for position, expression in assignment:
        name = machine.variables[position].name
        if isinstance(expression, list) and expression[0] == "lit":
            parts.append(f"{name} = {render_value(machine, position, expression[1])}")
        else:
            parts.append(f"{name} = {render_expression(machine, expression)}")
    return ", ".join(parts)


def state_values(machine: MachineRules, state: int) -> list[int]:
    """The integer value of every variable in the state with dense id `state`."""
    values = []
    for low, size in domain_sizes(machine):
        values.append(low + state % size)
        state //= size
    return values


def render_state(machine: MachineRules, values: list[int], *, separator: str = ", ") -> str:
    """A state as `status='paid', paid=True, stock=3`."""
    return separator.join(
        f"{v.name}={render_value(machine, i, value)}" for i, (v, value) in enumerate(
            zip(machine.variables, values, strict=True))
    )
