"""Store conformance for leases, fencing and the end seal (S8-S10 of bide._store), on memory, SQLite and
PostgreSQL, including across processes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bide
from bide._store import Lease, decide_lease

T0 = 1_800_000_000_000  # a fake clock, in Unix ms


def test_grant_renew_refuse_and_take_over(store: bide.Store) -> None:
    a = store.lease("r", "A", now_ms=T0, ttl_ms=1000)
    assert a.held and a.holder == "A" and a.token >= 1 and a.expires_ms == T0 + 1000
    b = store.lease("r", "B", now_ms=T0 + 500, ttl_ms=1000)
    assert not b.held and b.holder == "A" and b.token == a.token and b.expires_ms == T0 + 1000
    renewed = store.lease("r", "A", now_ms=T0 + 900, ttl_ms=1000, token=a.token)
    assert renewed.held and renewed.token == a.token and renewed.expires_ms == T0 + 1900
    # Still live at T0 + 1500 after the renewal; expired at T0 + 1900.
    assert not store.lease("r", "B", now_ms=T0 + 1500, ttl_ms=1000).held
    b = store.lease("r", "B", now_ms=T0 + 1900, ttl_ms=1000)
    assert b.held and b.holder == "B" and b.token > a.token
    # A's renewal with its stale token does not get it back, even though A asks for it by name.
    stale = store.lease("r", "A", now_ms=T0 + 2000, ttl_ms=1000, token=a.token)
    assert not stale.held and stale.holder == "B"
    # A holder asking without its token is a new grant only when the lease is free.
    assert not store.lease("r", "B", now_ms=T0 + 2000, ttl_ms=1000).held
    # Nor once B freed it or let it expire: a renewal never takes a lease again (A's drive lost it, and a
    # fresh grant to A would only keep every other driver out for a ttl).
    assert store.release("r", "B", b.token)
    again = store.lease("r", "A", now_ms=T0 + 2100, ttl_ms=1000, token=a.token)
    assert not again.held and again.holder == "B" and again.token == b.token
    c = store.lease("r", "C", now_ms=T0 + 2100, ttl_ms=1000)
    assert c.held and c.token == b.token + 1
    expired = store.lease("r", "C", now_ms=T0 + 5000, ttl_ms=1000, token=c.token - 1)
    assert not expired.held and expired.holder == "C"


def test_release_frees_and_tokens_keep_growing(store: bide.Store) -> None:
    a = store.lease("r", "A", now_ms=T0, ttl_ms=60_000)
    assert store.release("r", "B", a.token) is False
    assert store.release("r", "A", a.token + 1) is False
    assert store.release("r", "A", a.token) is True
    b = store.lease("r", "B", now_ms=T0 + 1, ttl_ms=60_000)
    assert b.held and b.token > a.token
    assert store.lease("other", "A", now_ms=T0, ttl_ms=10).token >= 1  # per run


def test_fenced_writes(store: bide.Store) -> None:
    a = store.lease("r", "A", now_ms=T0, ttl_ms=1000)
    assert store.insert_many("r", [("k1", b"1")], fence=("A", a.token))[0].inserted
    with pytest.raises(bide.LeaseLost):
        store.insert_many("r", [("k2", b"2")], fence=("A", a.token + 1))
    with pytest.raises(bide.LeaseLost):
        store.insert_many("r", [("k2", b"2")], fence=("B", a.token))
    # An expired lease nobody took over still fences in its holder.
    assert store.insert_many("r", [("k2", b"2")], fence=("A", a.token))[0].inserted
    b = store.lease("r", "B", now_ms=T0 + 5000, ttl_ms=1000)
    with pytest.raises(bide.LeaseLost):
        store.insert_many("r", [("k3", b"3")], fence=("A", a.token))
    with pytest.raises(bide.LeaseLost):
        store.insert_many("r", [("k3", b"3"), ("k4", b"4")], exclusive=True, fence=("A", a.token))
    assert [e.key for e in store.load("r")] == ["k1", "k2"]
    assert store.insert_many("r", [("k3", b"3")], fence=("B", b.token))[0].inserted
    # No lease at all: a fenced write is refused, an unfenced one goes through.
    with pytest.raises(bide.LeaseLost):
        store.insert_many("fresh", [("k", b"x")], fence=("A", 1))
    assert store.insert_many("fresh", [("k", b"x")])[0].inserted


def test_async_fenced_writes_in_one_batch(store: bide.Store) -> None:
    a = store.lease("r1", "A", now_ms=T0, ttl_ms=1000)
    b = store.lease("r2", "B", now_ms=T0, ttl_ms=1000)

    async def both() -> list[object]:
        return await asyncio.gather(
            store.ainsert_many("r1", [("k", b"1")], fence=("A", a.token)),
            store.ainsert_many("r2", [("k", b"2")], fence=("B", b.token + 7)),
            store.ainsert_many("r2", [("j", b"3")], fence=("B", b.token)),
            return_exceptions=True,
        )

    ok, lost, fine = asyncio.run(both())
    assert isinstance(ok, list) and ok[0].inserted
    assert isinstance(lost, bide.LeaseLost)
    assert isinstance(fine, list) and fine[0].inserted
    assert [e.key for e in store.load("r2")] == ["j"]


def test_run_end_is_the_last_record_of_an_insert(store: bide.Store) -> None:
    """S8 within one call: a call that puts a record after `run:end` is refused and stores nothing."""
    with pytest.raises(bide.ConfigError, match="last record"):
        store.insert_many("r", [("run:end", b"end"), ("b", b"after")])
    with pytest.raises(bide.ConfigError, match="last record"):
        asyncio.run(_ainsert(store, "r", [("a", b"1"), ("run:end", b"end"), ("b", b"after")]))
    assert store.load("r") == []
    store.insert_many("r", [("a", b"1"), ("run:end", b"end")])
    assert [e.key for e in store.load("r")] == ["a", "run:end"]


def test_concurrent_inserts_add_nothing_after_an_end(store: bide.Store) -> None:
    """S8 across calls: an end and an insert sent together (on SQLite: one batch) answer as if one ran
    first; here the end is sent first, so the insert is refused."""

    async def both() -> list[object]:
        return await asyncio.gather(
            asyncio.ensure_future(store.ainsert_many("r", [("a", b"1"), ("run:end", b"end")])),
            asyncio.ensure_future(store.ainsert_many("r", [("b", b"2")])),
            return_exceptions=True,
        )

    ended, late = asyncio.run(both())
    keys = [e.key for e in store.load("r")]
    assert keys[-1] == "run:end"
    if isinstance(late, bide.RunEnded):
        assert keys == ["a", "run:end"]
    else:  # a store that ran the second insert first (a thread pool may): it came before the end
        assert isinstance(late, list) and keys == ["b", "a", "run:end"]
    assert isinstance(ended, list) and ended[-1].inserted


def test_nothing_is_appended_after_run_end(store: bide.Store) -> None:
    store.insert_many("r", [("a", b"1"), ("run:end", b"end")])
    with pytest.raises(bide.RunEnded):
        store.insert_many("r", [("b", b"2")])
    with pytest.raises(bide.RunEnded):
        asyncio.run(_ainsert(store, "r", [("b", b"2")]))
    with pytest.raises(bide.RunEnded):
        store.insert_many("r", [("a", b"1"), ("b", b"2")])
    # What exists is answered as usual (nothing is added).
    again = store.insert_many("r", [("a", b"other"), ("run:end", b"other")])
    assert [(e.data, e.inserted) for e in again] == [(b"1", False), (b"end", False)]
    clash = store.insert_many("r", [("a", b"x"), ("c", b"y")], exclusive=True)
    assert [(e.key, e.inserted) for e in clash] == [("a", False)]
    assert [e.key for e in store.load("r")] == ["a", "run:end"]
    # An ended run is not listed as needing recovery, whatever its lease.
    lease = store.lease("r", "A", now_ms=T0, ttl_ms=10)
    assert lease.held
    assert [x.run_id for x in store.expired_leases(now_ms=T0 + 100)] == []


async def _ainsert(store: bide.Store, run_id: str, items: list[tuple[str, bytes]]) -> object:
    return await store.ainsert_many(run_id, items)


def test_expired_leases_lists_runs_to_recover(store: bide.Store) -> None:
    for i, ttl in enumerate([100, 5_000, 100, 100]):
        store.lease(f"run-{i}", f"H{i}", now_ms=T0, ttl_ms=ttl)
        store.insert_many(f"run-{i}", [("a", b"1")])
    store.insert_many("run-4", [("a", b"1")])
    store.lease("no-records", "H", now_ms=T0, ttl_ms=1)  # a drive that never wrote: not a run
    store.insert_many("run-3", [("run:end", b"end")])
    released = store.lease("run-4", "H4", now_ms=T0, ttl_ms=60_000)
    store.release("run-4", "H4", released.token)
    got = store.expired_leases(now_ms=T0 + 1000)
    assert [x.run_id for x in got] == ["run-0", "run-2", "run-4"]
    assert all(not x.held for x in got) and got[0].holder == "H0"
    assert [x.run_id for x in store.expired_leases(now_ms=T0 + 1000, after="run-0", limit=1)] == ["run-2"]
    assert "no-records" not in store.runs()


def test_async_lease_then_load_sees_the_journal_as_of_the_grant(store: bide.Store) -> None:
    store.insert_many("r", [("a", b"1")])

    async def go() -> tuple[bide.Lease, list[bide.Entry]]:
        lease = store.alease("r", "A", now_ms=T0, ttl_ms=1000)
        load = store.aload("r")
        return await lease, await load

    lease, entries = asyncio.run(go())
    assert lease.held and [e.key for e in entries] == ["a"]
    assert asyncio.run(_arelease(store, "r", "A", lease.token)) is True


async def _arelease(store: bide.Store, run_id: str, holder: str, token: int) -> bool:
    return await store.arelease(run_id, holder, token)


_CHILD = """
import json, sys, time
import bide
url, prefix, who, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = bide.open_store(url, table_prefix=prefix)
got = []
for i in range(n):
    now = int(time.time() * 1000)
    lease = store.lease("contended", who, now_ms=now, ttl_ms=1)
    if lease.held:
        try:
            store.insert_many("contended", [(f"{who}-{i}-{lease.token}", b"x")], fence=(who, lease.token))
            got.append(lease.token)
        except bide.LeaseLost:
            pass
store.close()
print(json.dumps(got))
"""


def test_tokens_grow_and_fences_hold_across_processes(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """Four processes take over one run's 1 ms lease again and again: every token is granted once, and
    every record written carries a token that held the lease when it committed."""
    url, prefix = durable_store_spec
    bide.open_store(url, table_prefix=prefix).close()
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, prefix, f"P{k}", "40"], stdout=subprocess.PIPE, text=True
        )
        for k in range(4)
    ]
    tokens: list[int] = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        tokens += json.loads(out)
    assert tokens and len(tokens) == len(set(tokens))  # no token written under by two holders
    store = bide.open_store(url, table_prefix=prefix)
    try:
        written = [int(e.key.rsplit("-", 1)[1]) for e in store.load("contended")]
        assert written == sorted(written)  # commit order is token order: nobody wrote after a takeover
    finally:
        store.close()


_ENDER = """
import asyncio, json, random, sys
import bide
url, prefix, who, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
store = bide.open_store(url, table_prefix=prefix)
rng = random.Random(who)

async def main():
    # Each round sends, in one go (one batch on SQLite), records for every run and an end for some:
    # several of them for one run, in a random order, racing the other processes doing the same.
    answers = {}
    for rnd in range(8):
        sent = []
        for r in range(runs):
            for k in range(3):
                sent.append((r, f"{who}-{rnd}-{k}"))
            if rng.random() < 0.15:
                sent.append((r, "run:end"))
        rng.shuffle(sent)
        futures = [
            asyncio.ensure_future(store.ainsert_many(f"run{r}", [(key, f"{who} {key}".encode())]))
            for r, key in sent
        ]
        for (r, key), got in zip(sent, await asyncio.gather(*futures, return_exceptions=True)):
            if isinstance(got, bide.RunEnded):
                answers[f"run{r}/{key}"] = "ended"
            elif isinstance(got, BaseException):
                raise got
            else:
                answers[f"run{r}/{key}"] = "inserted" if got[0].inserted else "existed"
    return answers

print(json.dumps(asyncio.run(main())))
store.close()
"""


def test_nothing_follows_an_end_when_processes_race_to_end_and_append(
    durable_store_spec: tuple[str, str], tmp_path: Path
) -> None:
    """S8 across processes and within their batches: three processes append to the same runs and end some
    of them, all at once. In every run nothing follows `run:end`, and an insert refused with `RunEnded`
    stored nothing."""
    url, prefix = durable_store_spec
    bide.open_store(url, table_prefix=prefix).close()
    script = tmp_path / "ender.py"
    script.write_text(_ENDER)
    runs = 12
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, prefix, f"P{k}", str(runs)], stdout=subprocess.PIPE, text=True
        )
        for k in range(3)
    ]
    answers: dict[str, str] = {}
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        answers.update(json.loads(out))
    store = bide.open_store(url, table_prefix=prefix)
    try:
        ended = 0
        for r in range(runs):
            keys = [e.key for e in store.load(f"run{r}")]
            if "run:end" in keys:
                ended += 1
                assert keys[-1] == "run:end", f"run{r} has records after its end: {keys}"
            stored = set(keys)
            for name, answer in answers.items():
                run, key = name.split("/", 1)
                if run == f"run{r}" and key != "run:end":
                    assert (key in stored) == (answer == "inserted"), (name, answer)
        assert ended, "no run was ended: the race was not exercised"
    finally:
        store.close()


def test_sqlite_store_made_before_leases_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE bide_records (seq INTEGER PRIMARY KEY, run_id VARCHAR NOT NULL, "
            "key VARCHAR NOT NULL, data BLOB NOT NULL, UNIQUE (run_id, key))"
        )
        conn.exec_driver_sql(
            "CREATE TABLE bide_runs (run_id VARCHAR PRIMARY KEY, next_seq BIGINT DEFAULT 0 NOT NULL)"
        )
        conn.exec_driver_sql("INSERT INTO bide_runs(run_id) VALUES ('done'), ('open')")
        conn.exec_driver_sql("INSERT INTO bide_records(run_id, key, data) VALUES ('done', 'run:end', x'00')")
        conn.exec_driver_sql("INSERT INTO bide_records(run_id, key, data) VALUES ('open', 'a', x'00')")
    engine.dispose()
    store = bide.open_store(f"sqlite:///{path}")
    try:
        with pytest.raises(bide.RunEnded):
            store.insert_many("done", [("more", b"x")])
        assert store.insert_many("open", [("b", b"x")])[0].inserted
        assert store.lease("open", "A", now_ms=T0, ttl_ms=10).token == 1
    finally:
        store.close()


def _before_leases(url: str, prefix: str) -> None:
    """Take the store's runs table back to the layout of a bide from before leases (no lease or end
    columns, no open-runs index): the store a driver of that bide left."""
    engine = sa.create_engine(url.replace("postgresql:", "postgresql+psycopg:", 1))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS {prefix}runs_open")
            for column in ("holder", "token", "expires_ms", "ended"):
                conn.exec_driver_sql(f"ALTER TABLE {prefix}runs DROP COLUMN {column}")
    finally:
        engine.dispose()


def test_a_run_a_driver_from_before_leases_left_is_resumed_by_a_worker(
    durable_store_spec: tuple[str, str]
) -> None:
    """A run whose driver, a bide from before leases, died mid-run has no lease once the store is
    upgraded: the listing took only runs holding one, so no worker ever resumed it ("nothing to
    recover"). It is listed as free, and a worker finishes it, each charge once."""
    from bide.testing import Fail, ScriptedModel, call, reply

    url, prefix = durable_store_spec
    charges: list[int] = []

    @bide.tool
    def charge(n: int) -> str:
        """Charge."""
        charges.append(n)
        return "charged"

    def agent(store: bide.Store, script: list[object]) -> bide.Agent:
        return bide.Agent(ScriptedModel(script), store=store, tools=[charge], name="pay")

    store = bide.open_store(url, table_prefix=prefix)
    with pytest.raises(bide.ModelError):
        agent(store, [call("charge", n=1), Fail(bide.ModelError("down"))]).run_sync("midrun", "pay")
    store.close()
    _before_leases(url, prefix)
    store = bide.open_store(url, table_prefix=prefix)  # upgraded: the lease columns are back, holder NULL
    try:
        listed = [lease.run_id for lease in store.expired_leases(now_ms=T0)]
        assert "midrun" in listed
        resumer = agent(store, [call("charge", n=1), call("charge", n=2), reply("done")])
        report = asyncio.run(bide.Worker(store, resumer).run_once())
        assert report.completed == 1, report
        assert bide.run_status(store, "midrun").status == "completed"
        assert charges == [1, 2]  # the journaled charge replayed, the second fired once
        assert "midrun" not in [lease.run_id for lease in store.expired_leases(now_ms=T0)]
    finally:
        store.close()


_LEASE_OPS = st.lists(
    st.tuples(
        st.sampled_from(["lease", "renew", "release"]),
        st.sampled_from(["A", "B", "C"]),
        st.integers(min_value=0, max_value=3000),  # ms past the previous step
        st.integers(min_value=1, max_value=2000),  # ttl ms
        st.integers(min_value=0, max_value=4),  # a token to present (renew/release); 0 for "none"
    ),
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_LEASE_OPS)
def test_every_store_answers_leases_by_the_rule(
    store: bide.Store, ops: list[tuple[str, str, int, int, int]]
) -> None:
    # The stores answer leases by one rule, `decide_lease` (S9); the SQL stores encode it as one upsert. Any
    # sequence of grants, renewals with right or wrong tokens, and releases gets the rule's answers.
    run_id = f"rule-{uuid.uuid4().hex}"
    current: Lease | None = None
    now = T0
    for op, holder, step, ttl, token in ops:
        now += step
        if op == "release":
            freed = store.release(run_id, holder, token)
            matches = current is not None and (current.holder, current.token) == (holder, token)
            assert freed is matches
            if matches and current is not None:
                current = Lease(run_id, holder, token, 0)
            continue
        presented = token if op == "renew" else 0
        expected = decide_lease(run_id, current, holder, now, ttl, presented)
        got = store.lease(run_id, holder, now_ms=now, ttl_ms=ttl, token=presented)
        assert tuple(got) == tuple(expected)
        if expected.held:
            current = Lease(run_id, holder, expected.token, expected.expires_ms)


def test_a_loop_keeps_no_store_alive_once_its_drives_are_done() -> None:
    """Lease renewals are grouped per (store, ttl, clock) in each event loop; a group lives only while a
    lease of it is held, so a service that opens a store per tenant does not keep them all."""
    import gc
    import weakref

    from bide.testing import ScriptedModel, call, reply

    async def charge(customer: str) -> str:
        """Charge a customer."""
        return f"charged {customer}"

    async def drive(n: int) -> list[weakref.ref[bide.MemoryStore]]:
        refs = []
        for i in range(n):
            store = bide.MemoryStore()
            model = ScriptedModel([call("charge", customer="a"), reply("done")])
            agent = bide.Agent(model, store=store, tools=[bide.Tool.from_function(charge)])
            assert (await agent.run(f"run-{i}", "go")).answer == "done"
            refs.append(weakref.ref(store))
        gc.collect()
        return refs

    async def main() -> int:
        refs = await drive(20)
        return sum(r() is not None for r in refs)  # counted while the loop still runs

    assert asyncio.run(main()) == 0
