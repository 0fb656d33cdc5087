"""Conversation threads: many user messages on one journal, each a segment driven like a run."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide.testing import Fail, ScriptedModel, Turn, call, reply


def effect_tool(fired: list[str]) -> bide.Tool:
    @bide.tool
    def note(text: str) -> str:
        """Record a note somewhere (a side effect)."""
        fired.append(text)
        return f"noted {text}"

    return note


def test_a_thread_answers_each_message_with_the_history_before_it(store: bide.Store) -> None:
    fired: list[str] = []
    model = ScriptedModel([call("note", text="a"), reply("noted a"), reply("hello again"), reply("bye")])
    agent = bide.Agent(model, store=store, tools=[effect_tool(fired)], system="Be brief.")
    thread = agent.thread("chat")

    async def converse() -> list[bide.RunResult]:
        return [await thread.send("note a"), await thread.send("hi"), await thread.send("bye?")]

    results = asyncio.run(converse())
    assert [(r.answer, r.segment, r.turns) for r in results] == [
        ("noted a", 0, 2), ("hello again", 1, 1), ("bye", 2, 1)
    ]  # fmt: skip
    assert fired == ["a"]
    # The third request holds the whole conversation, as journaled: system, message 0 and its turns, ...
    roles = [(m.role, getattr(m, "content", "")) for m in model.requests[-1].messages]
    assert roles == [
        ("system", "Be brief."),
        ("user", "note a"),
        ("assistant", ""),
        ("tool", "noted a"),
        ("assistant", "noted a"),
        ("user", "hi"),
        ("assistant", "hello again"),
        ("user", "bye?"),
    ]
    history = asyncio.run(thread.history())
    assert history == [*model.requests[-1].messages[1:], bide.AssistantMessage(content="bye")]
    st_ = bide.run_status(store, "chat")
    assert (st_.status, st_.input, st_.answer) == ("idle", "bye?", "bye")


def test_a_message_sent_again_while_unanswered_resumes_it_and_another_is_refused(store: bide.Store) -> None:
    fired: list[str] = []
    model = ScriptedModel(
        [reply("zero"), call("note", text="x"), Fail(bide.ModelError("model down")), reply("one")]
    )
    agent = bide.Agent(model, store=store, tools=[effect_tool(fired)])
    thread = agent.thread("t")
    assert thread.send_sync("first").answer == "zero"
    with pytest.raises(bide.ModelError):
        thread.send_sync("second")
    assert bide.run_status(store, "t").status == "running" and fired == ["x"]
    with pytest.raises(bide.RunMismatch, match="still answering message 1"):
        thread.send_sync("third")
    with pytest.raises(bide.RunMismatch, match="still answering"):
        thread.send_sync("second", segment=2)
    result = thread.send_sync("second")  # the same message again: its segment is resumed, not redone
    assert (result.answer, result.segment, result.replayed) == ("one", 1, False)
    assert fired == ["x"]
    # Sending with the message's index is exactly-once: an answered message returns its journaled answer.
    calls = len(model.requests)
    again = thread.send_sync("second", segment=1)
    assert (again.answer, again.segment, again.replayed) == ("one", 1, True)
    assert thread.send_sync("first", segment=0).answer == "zero"
    assert len(model.requests) == calls
    with pytest.raises(bide.RunMismatch, match="is 'first', not this one"):
        thread.send_sync("other", segment=0)
    with pytest.raises(bide.RunMismatch, match="the next is segment 2"):
        thread.send_sync("later", segment=5)


def test_resume_drives_the_unanswered_message(store: bide.Store) -> None:
    fired: list[str] = []
    script = [reply("zero"), call("note", text="b"), Fail(bide.ModelError("down")), reply("one")]
    model = ScriptedModel(script)
    agent = bide.Agent(model, store=store, tools=[effect_tool(fired)])
    thread = agent.thread("t")
    with pytest.raises(bide.RunNotFound):
        asyncio.run(thread.resume())
    thread.send_sync("a")
    with pytest.raises(bide.ModelError):
        thread.send_sync("b")
    assert asyncio.run(thread.resume()).answer == "one"
    assert fired == ["b"]
    idle = asyncio.run(thread.resume())  # an idle thread: the last answer, from the journal
    assert (idle.answer, idle.segment, idle.replayed) == ("one", 1, True)


def test_run_ids_of_threads_and_runs_are_not_mixed_up(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("a"), reply("b"), reply("c")]), store=store)
    agent.thread("t").send_sync("hello")
    with pytest.raises(bide.RunMismatch, match="is a conversation thread"):
        agent.run_sync("t", "hello")
    with pytest.raises(bide.RunMismatch, match="is a conversation thread"):
        agent.run_sync("t", "something else")
    agent.run_sync("r", "hello")
    with pytest.raises(bide.RunMismatch, match="not a conversation thread"):
        agent.thread("r").send_sync("more")
    with pytest.raises(bide.RunMismatch, match="different input"):
        agent.run_sync("r", "other input")
    other = bide.Agent(ScriptedModel([reply("x")]), store=store, name="other")
    with pytest.raises(bide.RunMismatch, match="was started by 'thread:agent'"):
        other.thread("t").send_sync("hello")


def test_a_thread_object_sees_what_others_wrote_between_its_sends(store: bide.Store) -> None:
    """A Thread keeps its journal between sends and reads only what was written since: a message another
    Thread object (another process, say) sent in between is in the next request's history, and a send
    whose drive failed starts the next from the store again."""
    model = ScriptedModel([reply("one"), reply("two"), Fail(bide.ModelError("down")), reply("three")])
    mine = bide.Agent(model, store=store).thread("t")
    other = bide.Agent(ScriptedModel([reply("never"), reply("two")]), store=store).thread("t")
    assert mine.send_sync("first").answer == "one"
    assert other.send_sync("second").answer == "two"
    with pytest.raises(bide.RunMismatch, match="is 'second', not this one"):
        mine.send_sync("my second", segment=1)
    with pytest.raises(bide.ModelError):
        mine.send_sync("third")
    result = mine.send_sync("third")
    assert (result.answer, result.segment) == ("three", 2)
    users = [m.content for m in model.requests[-1].messages if m.role == "user"]
    assert users == ["first", "second", "third"]


def test_a_cancelled_thread_takes_no_more_messages(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("a"), reply("b")]), store=store)
    thread = agent.thread("t")
    thread.send_sync("one")
    assert bide.cancel_run(store, "t", reason="done talking")
    ended = thread.send_sync("two")
    assert (ended.status, ended.answer) == ("cancelled", "Cancelled: done talking")
    assert bide.run_status(store, "t").status == "cancelled"
    with pytest.raises(bide.RunMismatch, match="has ended"):
        thread.send_sync("three")
    assert thread.send_sync("one", segment=0).answer == "a"  # what was answered stays readable


def test_a_thread_cancelled_while_answering_says_it_ended_to_a_new_message(store: bide.Store) -> None:
    """Cancelled while a live drive answered a message (its segment never ended): a new message is told the
    thread has ended, not to resume a message that can no longer be answered. The cancel is requested while
    the drive's tool call runs, which returns only once it is: no fixed wait that a loaded machine could
    overrun (the message not yet journaled, or already answered)."""
    looking, cancelled = asyncio.Event(), asyncio.Event()

    @bide.tool(safety=bide.ReadOnly)
    async def look(x: str) -> str:
        """Look something up (slowly: until the cancel request is recorded)."""
        looking.set()
        await cancelled.wait()
        return x

    model = ScriptedModel([reply("hi"), call("look", x="a"), reply("never")])
    thread = bide.Agent(model, store=store, tools=[look], cancel_check=0).thread("t")

    async def cancelled_while_answering() -> bide.RunResult[str]:
        await thread.send("hello")
        answering = asyncio.ensure_future(thread.send("look something up"))
        await looking.wait()
        await bide.acancel_run(store, "t", reason="user left")
        cancelled.set()
        return await answering

    assert asyncio.run(cancelled_while_answering()).status == "cancelled"
    assert thread.send_sync("look something up").status == "cancelled"  # that message, sent again
    with pytest.raises(bide.RunMismatch, match=r"has ended \(cancelled\): it takes no more messages"):
        thread.send_sync("a new message")


def test_the_worker_resumes_a_threads_unanswered_message_and_leaves_idle_threads(store: bide.Store) -> None:
    fired: list[str] = []
    bide.Agent(ScriptedModel([reply("hi back")]), store=store).thread("idle").send_sync("hi")
    model = ScriptedModel([call("note", text="y"), Fail(bide.ModelError("down")), reply("noted")])
    with pytest.raises(bide.ModelError):
        bide.Agent(model, store=store, tools=[effect_tool(fired)]).thread("busy").send_sync("note y")
    # A worker's agent (another process, say) of the same name picks the message up from the journal.
    again = ScriptedModel([call("note", text="y"), reply("noted")])
    worker = bide.Worker(store, bide.Agent(again, store=store, tools=[effect_tool(fired)]), backoff=0.01)
    report = asyncio.run(worker.run_once())
    assert (report.completed, report.skipped) == (1, 1)
    st_ = bide.run_status(store, "busy")
    assert (st_.status, st_.answer) == ("idle", "noted")
    assert fired == ["y"]
    assert len(again.requests) == 1  # only the missing turn was asked for
    assert asyncio.run(worker.run_once()).driven == 0


# -- the law: interrupted anywhere, resent until answered, a thread fires each call exactly once ----------

# Per message: its calls before the reply (True: the model fails once before that call).
turns = st.lists(st.booleans(), min_size=0, max_size=3)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(turns, min_size=1, max_size=4), fail_reply=st.lists(st.booleans(), min_size=4))
def test_threads_fire_each_call_once_whatever_fails(
    messages: list[list[bool]], fail_reply: list[bool]
) -> None:
    store = bide.open_store("memory://")
    fired: list[str] = []
    script: list[Turn | Fail] = []
    for m, calls in enumerate(messages):
        for c, fail in enumerate(calls):
            if fail:
                script.append(Fail(bide.ModelError("flaky")))
            script.append(call("note", text=f"{m}.{c}"))
        if fail_reply[m]:
            script.append(Fail(bide.ModelError("flaky")))
        script.append(reply(f"answer {m}"))
    agent = bide.Agent(ScriptedModel(script), store=store, tools=[effect_tool(fired)])
    thread = agent.thread("t")
    answers = []
    for m in range(len(messages)):
        while True:
            try:
                answers.append(thread.send_sync(f"message {m}").answer)
                break
            except bide.ModelError:
                continue  # the message is resent, as a user would
    assert answers == [f"answer {m}" for m in range(len(messages))]
    assert fired == [f"{m}.{c}" for m, calls in enumerate(messages) for c in range(len(calls))]
    users = [msg.content for msg in asyncio.run(thread.history()) if msg.role == "user"]
    assert users == [f"message {m}" for m in range(len(messages))]


def test_a_worker_ends_an_idle_thread_that_was_cancelled(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("hi")]), store=store)
    agent.thread("t").send_sync("hello")
    bide.cancel_run(store, "t", reason="closed by support")
    assert bide.run_status(store, "t").status == "idle"
    report = asyncio.run(bide.Worker(store, agent).run_once())
    assert (report.completed, report.cancelled) == (0, 1)
    st_ = bide.run_status(store, "t")
    assert (st_.status, st_.answer) == ("cancelled", "Cancelled: closed by support")


def test_resuming_a_cancelled_idle_thread_ends_it_and_keeps_its_last_answer(store: bide.Store) -> None:
    """The first resume after the cancel request ends the thread (so it is not a replay); it and every later
    resume return the last message's recorded answer (it was answered, not cancelled)."""
    thread = bide.Agent(ScriptedModel([reply("hi")]), store=store).thread("t")
    thread.send_sync("hello")
    bide.cancel_run(store, "t", reason="closed by support")
    for replayed in (False, True):
        result = asyncio.run(thread.resume())
        assert (result.status, result.answer, result.segment) == ("completed", "hi", 0)
        assert result.replayed is replayed
        assert bide.run_status(store, "t").status == "cancelled"
    with pytest.raises(bide.RunMismatch, match="has ended"):
        thread.send_sync("anyone there?")


def test_output_type_str_is_the_plain_answer(store: bide.Store) -> None:
    agent = bide.Agent(ScriptedModel([reply("just text")]), store=store, output_type=str)
    assert agent.run_sync("r", "x").output == "just text"


def test_a_messages_usage_is_its_own_turns_live_and_replayed() -> None:
    """`result.usage` of a thread's message sums that message's turns, the same live and when replayed."""

    class Counting:
        name = "counting"

        async def complete(self, request: bide.ModelRequest) -> bide.AssistantMessage:
            return bide.AssistantMessage(
                content=f"answer {request.turn}",
                usage=bide.Usage(input_tokens=10, output_tokens=request.turn + 1),
            )

    store = bide.MemoryStore()
    thread = bide.Agent(Counting(), store=store).thread("t")
    first = thread.send_sync("one", segment=0)
    second = thread.send_sync("two", segment=1)
    assert first.usage == bide.Usage(input_tokens=10, output_tokens=1)
    assert second.usage == bide.Usage(input_tokens=10, output_tokens=2)
    assert thread.send_sync("two", segment=1).usage == second.usage  # replayed from the journal
