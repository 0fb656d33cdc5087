"""A tool runs only on what the model sent: its arguments are validated strictly, as the JSON they are.

pydantic's lax mode converted them on the way in: a refund tool declared `cents: int` ran with 1 when the
model sent `true`, with 500 for `"500"`, `500.0` or `"5_00"`, and a `float` amount ran with `nan` or `inf`
for the text `"nan"` or `"inf"` (its attempt marker then recorded `null`). Each of these is now an error
result naming the field, the tool never starts, and the model can send the call again.
"""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bide
from bide._tools import ToolArgumentsInvalid
from bide.testing import ScriptedModel, call, reply

REFUSED_FOR_INT = [True, False, "500", 500.0, " 500 ", "5_00", "+500", "500.0", None, [500], {"v": 500}]
REFUSED_FOR_FLOAT = ["nan", "inf", "-inf", "Infinity", "1.5", True]


def test_a_side_effect_never_runs_on_a_converted_argument(store: bide.Store) -> None:
    refunds: list[Any] = []

    @bide.tool
    def refund(order: str, cents: int) -> str:
        """Refund part of an order."""
        refunds.append(cents)
        return f"refunded {cents}"

    script = [call("refund", order="o-1", cents=bad) for bad in REFUSED_FOR_INT]
    script += [call("refund", order="o-1", cents=500), reply("done")]
    agent = bide.Agent(ScriptedModel(script), store=store, tools=[refund], max_turns=100)
    result = agent.run_sync("r", "refund 5 dollars")
    assert result.answer == "done"
    assert refunds == [500]  # only the call that sent an integer ran
    journal = bide.Journal(store, "r").load()
    results = [r for r in journal.records() if isinstance(r, bide.ToolResult)]
    assert [r.is_error for r in results] == [True] * len(REFUSED_FOR_INT) + [False]
    for r in results[:-1]:
        assert "cents: Input should be a valid integer" in r.result
    # The one attempt marker records what the model sent, as it sent it.
    [attempt] = [r for r in journal.records() if isinstance(r, bide.Attempt)]
    assert attempt.arguments == {"order": "o-1", "cents": 500}


def test_a_float_argument_is_never_nan_or_infinite(store: bide.Store) -> None:
    paid: list[float] = []

    @bide.tool
    def pay(to: str, amount: float) -> str:
        """Pay someone."""
        paid.append(amount)
        return "paid"

    script = [call("pay", to="bob", amount=bad) for bad in REFUSED_FOR_FLOAT]
    script += [call("pay", to="bob", amount=12), reply("done")]
    agent = bide.Agent(ScriptedModel(script), store=store, tools=[pay], max_turns=100)
    assert agent.run_sync("r", "pay bob").answer == "done"
    assert paid == [12.0] and type(paid[0]) is float  # a JSON integer is a number a float field takes


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_what_json_writes_as_text_is_still_read_from_text() -> None:
    @bide.tool(safety=bide.ReadOnly)
    def book(day: datetime.date, at: datetime.datetime, color: Color, tags: set[str]) -> str:
        """Book a day."""
        return "booked"

    validated = book.validate(
        {"day": "2026-12-05", "at": "2026-12-05T10:00:00Z", "color": "red", "tags": ["a", "b"]}
    )
    assert validated.day == datetime.date(2026, 12, 5)  # type: ignore[attr-defined]
    assert validated.color is Color.RED  # type: ignore[attr-defined]
    assert validated.tags == {"a", "b"}  # type: ignore[attr-defined]


JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
)


def _type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return {int: "int", float: "float", str: "str", type(None): "none", list: "list", dict: "dict"}[
        type(value)
    ]


def _field(right: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value of the field's own type, or, as often, any JSON value (a near miss like `true` or `"5"`
    among them)."""
    return st.one_of(right, JSON_VALUES, st.sampled_from([True, False, "5", "true", 5.0, "nan", None]))


@settings(max_examples=400, deadline=None)
@given(
    n=_field(st.integers()),
    s=_field(st.text(max_size=5).filter(lambda s: s.isascii())),
    flag=_field(st.booleans()),
    xs=_field(st.lists(st.integers(), max_size=3)),
)
def test_validation_accepts_exactly_the_declared_json_types(n: Any, s: Any, flag: Any, xs: Any) -> None:
    """The law: arguments are accepted exactly when each value is of its field's own JSON type, and what is
    accepted is what the attempt marker records, unchanged."""

    @bide.tool
    def act(n: int, s: str, flag: bool, xs: list[int]) -> None:
        """Act."""

    arguments = {"n": n, "s": s, "flag": flag, "xs": xs}
    fits = (
        _type_of(n) == "int"
        and _type_of(s) == "str"
        and _type_of(flag) == "bool"
        and _type_of(xs) == "list"
        and all(_type_of(x) == "int" for x in xs)
    )
    try:
        validated = act.validate(arguments)
    except Exception as exc:
        assert type(exc).__name__ == "ToolArgumentsInvalid"
        assert not fits, f"refused arguments of the declared types: {exc}"
        return
    assert fits, f"accepted {arguments!r}"
    recorded = act.json_arguments(validated)
    assert recorded == arguments
    assert json.dumps(recorded, sort_keys=True) == json.dumps(arguments, sort_keys=True)


def test_a_side_effect_whose_arguments_are_named_by_aliases_runs_and_records_them_so() -> None:
    """A model naming a field `from` (a Python keyword) by an alias: every call of the side effect raised
    ConfigError ("its arguments, as recorded, are not the ones it is called with"), since its marker's
    arguments were dumped by field name, which the model does not take."""
    from pydantic import BaseModel, ConfigDict, Field

    class Transfer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        sender: str = Field(alias="from")
        cents: int

    sent: list[tuple[str, int]] = []

    def transfer(args: Transfer) -> str:
        sent.append((args.sender, args.cents))
        return "sent"

    tool = bide.Tool(name="transfer", description="Move money.", args=Transfer, fn=transfer)
    store = bide.MemoryStore()
    model = ScriptedModel([call("transfer", **{"from": "ann", "cents": 5}), reply("done")])
    assert bide.Agent(model, store=store, tools=[tool]).run_sync("r", "pay").answer == "done"
    assert sent == [("ann", 5)]
    [marker] = [json.loads(e.data) for e in store.load("r") if e.key == "attempt:c0.0:0"]
    assert marker["arguments"] == {"cents": 5, "from": "ann"}


def test_arguments_named_by_aliases_are_recorded_alike_in_every_process_whatever_the_alias_style() -> None:
    """`serialize_by_alias=True` left a set unsorted (its key was looked up by field name in a dump by
    alias), so the recorded arguments, which approvals sign, differed between processes; a validation
    alias, or an alias beside another serialization alias, still raised ConfigError on every call; and the
    field's own name sent beside its alias was dropped without a word."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import json\n"
        "import bide\n"
        "from pydantic import AliasChoices, BaseModel, ConfigDict, Field\n"
        "class ByAlias(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid', serialize_by_alias=True)\n"
        "    sender: str = Field(alias='from')\n"
        "    tags: set[str] = Field(alias='t')\n"
        "class Validation(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    sender: str = Field(validation_alias='from')\n"
        "class Choices(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    sender: str = Field(validation_alias=AliasChoices('from', 'by'))\n"
        "class Other(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
        "    sender: str = Field(alias='a', serialization_alias='b')\n"
        "out = []\n"
        "cases = [(ByAlias, {'from': 'x', 't': list('abcdefghij')}), (Validation, {'from': 'x'}),\n"
        "         (Choices, {'from': 'x'}), (Other, {'a': 'x'})]\n"
        "for model, sent in cases:\n"
        "    tool = bide.Tool(name='t', description='d', args=model, fn=lambda a: 'ok')\n"
        "    out.append(tool.json_arguments(tool.validate(sent), sent))\n"
        "print(json.dumps(out))\n"
    )
    repo = str(Path(bide.__file__).resolve().parents[1])
    seen = set()
    for seed in range(4):
        env = {"PYTHONHASHSEED": str(seed), "PYTHONPATH": repo}
        command = [sys.executable, "-c", code]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        seen.add(done.stdout)
    assert len(seen) == 1, seen
    [recorded] = [json.loads(s) for s in seen]
    assert recorded[0] == {"from": "x", "t": list("abcdefghij")}
    assert recorded[1] == {"from": "x"} and recorded[3] == {"a": "x"}

    from pydantic import BaseModel, ConfigDict, Field

    class Transfer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        sender: str = Field(alias="from")

    tool = bide.Tool(name="transfer", description="d", args=Transfer, fn=lambda a: "ok")
    with pytest.raises(ToolArgumentsInvalid, match="sender: Extra inputs are not permitted"):
        tool.validate({"from": "ann", "sender": "bob"})
