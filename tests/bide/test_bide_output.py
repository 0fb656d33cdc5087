"""Structured output: the final answer validated against `output_type`, failures shown to the model and
retried a bounded number of times, each retry journaled so a replay is identical."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import bide
from bide.testing import ScriptedModel, reply


class City(BaseModel):
    name: str
    population: int


PARIS = '{"name": "Paris", "population": 2100000}'


def test_a_valid_answer_is_the_typed_output(store: bide.Store) -> None:
    model = ScriptedModel([reply(PARIS)])
    agent = bide.Agent(model, store=store, output_type=City, system="You know cities.")
    result = agent.run_sync("r", "capital of France?")
    assert result.output == City(name="Paris", population=2100000)
    assert result.answer == PARIS
    system = model.requests[0].messages[0]
    assert system.role == "system" and system.content.startswith("You know cities.")
    assert '"population"' in system.content and "JSON schema" in system.content


def test_a_failed_validation_goes_back_to_the_model_and_is_journaled(store: bide.Store) -> None:
    fenced = f"```json\n{PARIS}\n```"
    model = ScriptedModel([reply("Paris, of course"), reply('{"name": "Paris"}'), reply(fenced)])
    agent = bide.Agent(model, store=store, output_type=City, output_retries=2)
    result = agent.run_sync("r", "capital of France?")
    assert result.output == City(name="Paris", population=2100000) and result.turns == 3
    retries = [r for r in bide.Journal(store, "r").load().records() if isinstance(r, bide.OutputRetry)]
    assert [r.turn for r in retries] == [0, 1]
    assert "Invalid JSON" in retries[0].error and "population: Field required" in retries[1].error
    # The model saw each error as a user message after its answer.
    last = model.requests[-1].messages
    assert [m.role for m in last[-4:]] == ["assistant", "user", "assistant", "user"]
    assert last[-1].content == retries[1].error
    # Replay: the same result from the journal, the model not called.
    again = agent.run_sync("r", "capital of France?")
    assert (again.output, again.turns, again.replayed) == (result.output, 3, True)
    assert len(model.requests) == 3


def test_exceeding_the_retries_ends_the_run_as_failed(store: bide.Store) -> None:
    model = ScriptedModel([reply("no"), reply("still no"), reply("never")])
    agent = bide.Agent(model, store=store, output_type=City, output_retries=1)
    with pytest.raises(bide.OutputInvalid, match=r"failed validation against output_type 2 times"):
        agent.run_sync("r", "capital?")
    assert len(model.requests) == 2
    assert bide.run_status(store, "r").status == "failed"
    with pytest.raises(bide.OutputInvalid):  # a replay says the same, without the model
        agent.run_sync("r", "capital?")
    assert len(model.requests) == 2


def test_any_type_pydantic_validates(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("[1, 2, 3]")]), store=store, output_type=list[int])
    assert agent.run_sync("r", "numbers").output == [1, 2, 3]
    with pytest.raises(bide.ConfigError, match="output_retries"):
        bide.Agent(ScriptedModel([]), store=store, output_type=int, output_retries=-1)


def test_a_plain_agents_output_is_its_answer_and_a_cancelled_runs_is_none(store: bide.Store) -> None:
    assert bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("p", "x").output == "hi"
    agent = bide.Agent(ScriptedModel([reply(PARIS)]), store=store, output_type=City)
    thread = agent.thread("t")
    assert thread.send_sync("capital?").output == City(name="Paris", population=2100000)
    bide.cancel_run(store, "t")
    ended = thread.send_sync("more?")
    assert ended.status == "cancelled" and ended.output is None


def test_each_message_of_a_thread_is_validated(store: bide.Store) -> None:
    model = ScriptedModel([reply(PARIS), reply("Lyon"), reply('{"name": "Lyon", "population": 520000}')])
    thread = bide.Agent(model, store=store, output_type=City).thread("t")
    assert thread.send_sync("capital?").output.name == "Paris"
    second = thread.send_sync("second city?")
    assert second.output == City(name="Lyon", population=520000) and second.turns == 2
    kinds = [m.role for m in asyncio.run(thread.history())]
    assert kinds == ["user", "assistant", "user", "assistant", "user", "assistant"]


@settings(max_examples=40, deadline=None)
@given(valid=st.lists(st.booleans(), min_size=1, max_size=6), retries=st.integers(0, 4))
def test_retries_law(valid: list[bool], retries: int) -> None:
    """The run completes iff a valid answer comes within the first retries + 1; one OutputRetry record per
    invalid answer before it; a replay gives the same result without the model."""
    answers = [PARIS if v else f"bad {i}" for i, v in enumerate(valid)]
    store = bide.open_store("memory://")
    model = ScriptedModel([reply(a) for a in answers] + [reply("bad tail")] * (retries + 1))
    agent = bide.Agent(model, store=store, output_type=City, output_retries=retries)
    first_valid = valid.index(True) if True in valid else len(valid) + retries + 1
    outcomes = []
    for _ in range(2):
        try:
            r = agent.run_sync("r", "q")
            outcomes.append(("ok", r.turns, r.output))
        except bide.OutputInvalid as exc:
            outcomes.append(("invalid", 0, str(exc)))
    assert outcomes[0] == outcomes[1]
    records = bide.Journal(store, "r").load().records()
    n_retries = sum(isinstance(r, bide.OutputRetry) for r in records)
    if first_valid <= retries:
        assert outcomes[0][:2] == ("ok", first_valid + 1) and n_retries == first_valid
    else:
        assert outcomes[0][0] == "invalid" and n_retries == retries
    assert len(model.requests) == min(first_valid, retries) + 1
