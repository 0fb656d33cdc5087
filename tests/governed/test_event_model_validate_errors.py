"""An event decoded the usual pydantic way (`model_validate`, `model_validate_json`: a transport's message)
is refused as its constructor refuses it: `govern.InvalidInput` naming the field, a `GovernError` an
`except govern.EventLogError` catches, not pydantic's own `ValidationError`."""

from __future__ import annotations

import json
from typing import Any

import pytest

import govern
from govern.runtime._eventlog import Event, InvalidInput, LoggedEvent

from .machines import order_machine

GOOD: dict[str, Any] = {"id": "e1", "record": "r1", "event": "pay", "producer": "p"}
LOGGED: dict[str, Any] = {"log": "main", "position": 0, "record_seq": 0, "producer_seq": 0}


@pytest.mark.parametrize("kind", [Event, LoggedEvent])
@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"id": ""}, "id"),
        ({"producer": 7}, "producer"),
        ({"deps": ["d", "d"]}, "deps"),
        ({"more": 1}, "more"),
    ],
)
def test_a_bad_event_decoded_by_pydantic_is_refused_naming_its_field(
    kind: type[Event], change: dict[str, Any], field: str
) -> None:
    data = {**GOOD, "machine": order_machine().digest, **(LOGGED if kind is LoggedEvent else {}), **change}
    for decode in (kind.model_validate, lambda d: kind.model_validate_json(json.dumps(d))):
        with pytest.raises(InvalidInput) as refused:
            decode(data)
        assert refused.value.field == field
        assert isinstance(refused.value, govern.EventLogError)
    with pytest.raises(InvalidInput):
        kind.model_validate_json(b"{not json")


@pytest.mark.parametrize("kind", [Event, LoggedEvent])
def test_a_good_event_decodes_to_what_its_constructor_makes(kind: type[Event]) -> None:
    data = {**GOOD, "machine": order_machine().digest, **(LOGGED if kind is LoggedEvent else {})}
    made = kind(**data)
    assert kind.model_validate(data) == made
    assert kind.model_validate_json(made.model_dump_json()) == made
