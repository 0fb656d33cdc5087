"""Audit log speed: appends with proofs maintained, proof generation and verification, in memory at 10^6
leaves and store-backed (SQLite), against a pure-Python hashing-alone baseline.

    python benchmarks/audit.py [--leaves 1000000] [--sql-leaves 100000] [--pymerkle-sizes 100000,1000000]
                               [--gates 1000,4000]

When pymerkle is importable (it is not a dependency: `pip install pymerkle==7.0.0`), a last section measures
it side by side with ours in the same run, in memory and on SQLite; otherwise it says it is not installed.
Every figure printed is measured in the run. A last section checks approvals offline: `verify_approvals` on
the evidence package of a real run whose one turn made N gated calls, each approved with a signed decision
and run (its time grows with the package: four times the gates, about four times as long).

Prints figures and ratios; asserts nothing (speed is measured here, never in tests). Short measurements
are the best of 5 runs, so other load on the machine disturbs them less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bide
from bide.audit import (
    AuditedStore,
    AuditLog,
    MerkleTree,
    journal_leaf,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from bide.audit._hashes import _leaf_hashes

sha256 = hashlib.sha256


REPEAT = 5


def timed(fn: Callable[[], object], repeat: int | None = None) -> float:
    """The best of `repeat` runs (default REPEAT): on a shared machine the minimum is the least disturbed."""
    best = float("inf")
    for _ in range(REPEAT if repeat is None else repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def line(what: str, value: str, note: str = "") -> None:
    print(f"  {what:<52} {value:>16}  {note}")


def memory(n: int, samples: int) -> None:
    print(f"\nIn-memory tree (bide.audit.MerkleTree), {n:,} leaves")
    data = [i.to_bytes(8, "big") * 8 for i in range(n)]  # 64-byte leaves
    tree = MerkleTree()
    append = tree.append
    build = timed(lambda: [append(d) for d in data], repeat=1)
    line("appends (proofs maintained)", f"{n / build:,.0f}/s", f"{build:.2f} s total")

    def hash_only() -> None:
        # the physical floor of an append: one leaf hash plus (on average) one node hash
        for d in data:
            h = sha256(b"\x00" + d).digest()
            sha256(b"\x01" + h + h).digest()

    floor = timed(hash_only, repeat=2)
    line(
        "baseline: hashing alone (leaf + 1 node per append)",
        f"{n / floor:,.0f}/s",
        f"ours = {floor / build:.2f}x of the hashing floor",
    )
    if n >= 100_000:
        build_100k = timed(lambda: MerkleTree(data[:100_000]))
        line("build 100,000 leaves", f"{build_100k:.3f} s")

    for size in sorted({min(100_000, n), n}):
        at_size(tree, size, samples)


def at_size(tree: MerkleTree, size: int, samples: int) -> None:
    idx = [random.randrange(size) for _ in range(samples)]
    root = tree.root(size)
    gen = timed(lambda: [tree.inclusion_proof(i, size) for i in idx])
    proofs = [tree.inclusion_proof(i, size) for i in idx]
    leaves = [tree.leaf(i) for i in idx]
    ok = timed(
        lambda: [verify_inclusion(i, size, lf, p, root) for i, lf, p in zip(idx, leaves, proofs, strict=True)]
    )
    assert all(verify_inclusion(i, size, lf, p, root) for i, lf, p in zip(idx, leaves, proofs, strict=True))
    depth = sum(len(p) for p in proofs) / len(proofs)
    hash_floor = timed(lambda: [sha256(b"\x01" + root + root).digest() for _ in range(int(depth * samples))])
    # The same number of hashes, over the proofs' own hashes: what verification cannot avoid, including
    # reading those hashes from memory (each is its own object, scattered over the tree's heap).
    read_floor = timed(lambda: [sha256(b"\x01" + h + root).digest() for p in proofs for h in p])
    gen_ms, ok_ms, floor_ms = gen / samples * 1e3, ok / samples * 1e3, hash_floor / samples * 1e3
    print(f"  -- at {size:,} leaves (mean path {depth:.1f} hashes)")
    line(
        "inclusion proofs",
        f"{samples / gen:,.0f}/s",
        f"{gen_ms:.4f} ms",
    )
    line(
        "inclusion verifications",
        f"{samples / ok:,.0f}/s",
        f"{ok_ms:.4f} ms",
    )
    line(
        "baseline: hashing alone (path-length hashes)",
        f"{samples / hash_floor:,.0f}/s",
        f"{floor_ms:.4f} ms; verification = {ok_ms / floor_ms:.2f}x the floor",
    )
    read_ms = read_floor / samples * 1e3
    line(
        "baseline: hashing each proof's own hashes once",
        f"{samples / read_floor:,.0f}/s",
        f"{read_ms:.4f} ms; verification = {ok_ms / read_ms:.2f}x",
    )
    olds = [random.randrange(1, size) for _ in range(samples)]
    cgen = timed(lambda: [tree.consistency_proof(m, size) for m in olds])
    cproofs = [tree.consistency_proof(m, size) for m in olds]
    oroots = [tree.root(m) for m in olds]
    cok = timed(
        lambda: [
            verify_consistency(m, size, r, root, p) for m, r, p in zip(olds, oroots, cproofs, strict=True)
        ]
    )
    cgen_ms = cgen / samples * 1e3
    line(
        "consistency proofs",
        f"{samples / cgen:,.0f}/s",
        f"{cgen_ms:.4f} ms",
    )
    line("consistency verifications", f"{samples / cok:,.0f}/s", f"{cok / samples * 1e3:.4f} ms")


def store_backed(n: int, samples: int, appends: int) -> dict[str, float]:
    """Print the store-backed figures; return the two that pymerkle's SQLite section sets beside its own."""
    print(f"\nStore-backed tree (bide.audit.AuditLog over a SQLite store), {n:,} journal records")
    with tempfile.TemporaryDirectory() as tmp:
        store = bide.open_store(f"sqlite:///{Path(tmp) / 'bench.db'}")
        try:
            salt = "A" * 43 + "="
            batch = 5000
            for start in range(0, n, batch):
                store.insert_many(
                    "run",
                    [
                        (f"k{i}", b'{"key":"k%d","kind":"gate","salt":"%s"}' % (i, salt.encode()))
                        for i in range(start, min(n, start + batch))
                    ],
                )
            log = AuditLog(store)
            read = timed(lambda: store.load("run"), repeat=3)
            load = timed(lambda: log.sync("run"), repeat=1)
            line(
                f"absorb {n:,} journal records (read + hash + store)",
                f"{load:.2f} s",
                f"{n / load:,.0f} records/s",
            )
            entries = store.load("run")
            fresh = AuditLog(store)

            copies = iter(range(1_000_000))

            def build_in_hand() -> None:
                # what pymerkle's SQLite load does: leaves in hand, hashed and stored (each time a new run)
                leaves = _leaf_hashes([e.data for e in entries])  # the leaf hashing AuditLog.sync does
                fresh._hashes.extend(f"copy{next(copies)}", 0, 0, leaves, entries[-1].seq)

            builds = sorted(timed(build_in_hand, repeat=1) for _ in range(3))
            built = builds[0]
            line(
                "  of which reading the journal",
                f"{read:.2f} s",
                "",
            )
            line(
                f"build + store the tree of {n:,} records in hand",
                f"{built:.3f} s",
                f"best of 3; median {builds[1]:.3f} s",
            )

            def hash_only() -> None:
                # the floor of a build: a leaf hash and (about) a node hash per record
                for h in [sha256(b"\x00" + journal_leaf(e.data)).digest() for e in entries]:
                    sha256(b"\x01" + h + h).digest()

            hashing = timed(hash_only, repeat=3)
            line("baseline: hashing alone (leaf + node hashes)", f"{hashing:.3f} s")
            root = log.root("run")
            idx = [random.randrange(n) for _ in range(samples)]
            gen = timed(lambda: [log.inclusion("run", i, n) for i in idx])
            proofs = [log.inclusion("run", i, n) for i in idx]
            leaves = [leaf_hash(journal_leaf(entries[i].data)) for i in idx]
            assert all(
                verify_inclusion(i, n, lf, p, root) for i, lf, p in zip(idx, leaves, proofs, strict=True)
            )
            gen_ms = gen / samples * 1e3
            line(
                "inclusion proofs from the store",
                f"{samples / gen:,.0f}/s",
                f"{gen_ms:.3f} ms",
            )
            olds = [random.randrange(1, n) for _ in range(samples)]
            cgen = timed(lambda: [log.consistency("run", m, n) for m in olds])
            line(
                "consistency proofs from the store",
                f"{samples / cgen:,.0f}/s",
                f"{cgen / samples * 1e3:.3f} ms",
            )

            def record(i: int) -> list[tuple[str, bytes]]:
                return [(f"x{i}", b'{"key":"x%d","kind":"gate","salt":"%s"}' % (i, salt.encode()))]

            def one_by_one() -> None:
                # the old way, still what a store without write hooks gets: commit, then sync (2 commits)
                for i in range(appends):
                    store.insert_many("run", record(i))
                    log.sync("run")

            separate = timed(one_by_one, repeat=1)
            audited = AuditedStore(store, log)
            assert audited.in_transaction

            def in_transaction() -> None:
                # AuditedStore over a SQL store: the tree advances in the append's own transaction
                for i in range(appends, 2 * appends):
                    audited.insert_many("run", record(i))

            both = timed(in_transaction, repeat=1)
            assert audited.errors == [] and log.sync("run") == len(store.load("run"))

            def journal_only() -> None:
                for i in range(appends):
                    store.insert_many(
                        "run2", [(f"x{i}", b'{"key":"x%d","kind":"gate","salt":"%s"}' % (i, salt.encode()))]
                    )

            alone = timed(journal_only, repeat=1)
            line(
                "durable appends, one record + tree sync each",
                f"{appends / both:,.0f}/s",
                f"{both / appends * 1e3:.2f} ms each; journal insert alone {alone / appends * 1e3:.2f} ms",
            )
            line(
                "  the same as two commits (append, then sync)",
                f"{appends / separate:,.0f}/s",
                f"{separate / appends * 1e3:.2f} ms each",
            )
            concurrent_appends(store, appends)
            return {"build_s": built, "proof_ms": gen_ms}
        finally:
            store.close()


class _WithoutHooks:
    """The store as one without write hooks looks to AuditedStore (the tree synced after each commit)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.url, self.durable = store.url, store.durable
        self.engine, self.table_prefix = store.engine, store.table_prefix

    def __getattr__(self, name: str) -> Any:
        if name in ("add_write_hook", "remove_write_hook", "inner"):
            raise AttributeError(name)
        return getattr(self._store, name)


def concurrent_appends(store: Any, runs: int) -> None:
    """Async appends of many runs at once through AuditedStore: group-committed, with the tree advanced
    in the same transaction, against the tree synced after the commit in a thread (stores without hooks)."""
    salt = b"A" * 43 + b"="

    def record(step: int) -> list[tuple[str, bytes]]:
        return [(f"x{step}", b'{"key":"x%d","kind":"gate","salt":"%s"}' % (step, salt))]

    def measure(audited: AuditedStore, tag: str) -> float:
        async def main() -> None:
            for step in range(5):
                await asyncio.gather(*[audited.ainsert_many(f"{tag}{j}", record(step)) for j in range(runs)])

        t = time.perf_counter()
        asyncio.run(main())
        took = time.perf_counter() - t
        assert audited.errors == []
        assert all(audited.log.size(f"{tag}{j}") == 5 for j in range(0, runs, max(1, runs // 10)))
        return took / (5 * runs)

    hooked = AuditedStore(store, AuditLog(store))
    plain = AuditedStore(_WithoutHooks(store))
    assert hooked.in_transaction and not plain.in_transaction
    # alternate, best of 3 each: the machine is shared
    with_hook = min(measure(hooked, f"h{i}-") for i in range(3))
    without = min(measure(plain, f"p{i}-") for i in range(3))
    line(
        f"async appends, {runs} runs at once, tree in the same txn",
        f"{1 / with_hook:,.0f}/s",
        f"{with_hook * 1e3:.3f} ms each; synced after commit in a thread {without * 1e3:.3f} ms "
        f"({without / with_hook:.1f}x)",
    )


def pymerkle_side_by_side(
    sizes: list[int], samples: int, sql_leaves: int, ours_sql: dict[str, float]
) -> None:
    """pymerkle measured here, beside ours, when it is installed (it is not a dependency:
    `pip install pymerkle==7.0.0` in the benchmark's environment to get this section)."""
    try:
        import pymerkle  # type: ignore[import-not-found]
    except ImportError:
        print("\npymerkle is not installed (pip install pymerkle==7.0.0): no side-by-side figures")
        return
    print(f"\nSide by side here: pymerkle {pymerkle.__version__} vs bide.audit.MerkleTree, in memory")
    for n in sizes:
        _side_by_side_at(pymerkle, n, samples)
    _side_by_side_sqlite(pymerkle, sql_leaves, min(samples, 200), ours_sql)


def _side_by_side_sqlite(pymerkle: Any, n: int, samples: int, ours: dict[str, float]) -> None:
    """pymerkle's SqliteTree: load n leaves in hand (its bulk append), then inclusion proofs read from the
    file; beside the same operations of the store-backed section above (same n)."""
    data = [i.to_bytes(8, "big") * 8 for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        tree = pymerkle.SqliteTree(str(Path(tmp) / "pymerkle.db"), algorithm="sha256")
        try:
            t0 = time.perf_counter()
            tree.append_entries(data)
            load = time.perf_counter() - t0
            idx = [random.randrange(n) for _ in range(samples)]
            gen = timed(lambda: [tree.prove_inclusion(i + 1) for i in idx], repeat=2)
        finally:
            tree.close()
    gen_ms = gen / samples * 1e3
    print(f"  -- SQLite, {n:,} leaves (ours: AuditLog over a SQLite store, then pymerkle's SqliteTree)")
    line(
        "load the leaves in hand (hash + store)",
        f"{ours['build_s']:.3f} s",
        f"pymerkle {load:.3f} s: {load / ours['build_s']:.1f}x",
    )
    line(
        "inclusion proof from the file",
        f"{ours['proof_ms']:.3f} ms",
        f"pymerkle {gen_ms:.3f} ms: {gen_ms / ours['proof_ms']:.1f}x",
    )


def _side_by_side_at(pymerkle: Any, n: int, samples: int) -> None:
    data = [i.to_bytes(8, "big") * 8 for i in range(n)]
    theirs = pymerkle.InmemoryTree(algorithm="sha256")
    t0 = time.perf_counter()
    for d in data:
        theirs.append_entry(d)
    their_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = MerkleTree(data)
    our_build = time.perf_counter() - t0
    idx = [random.randrange(n) for _ in range(samples)]
    their_root, our_root = theirs.get_root(), ours.root(n)
    their_gen = timed(lambda: [theirs.prove_inclusion(i + 1) for i in idx], repeat=2)
    our_gen = timed(lambda: [ours.inclusion_proof(i, n) for i in idx], repeat=2)
    their_pairs = [(theirs.get_leaf(i + 1), theirs.prove_inclusion(i + 1)) for i in idx]
    our_cases = [(i, ours.leaf(i), ours.inclusion_proof(i, n)) for i in idx]
    their_ok = timed(lambda: [pymerkle.verify_inclusion(lf, their_root, p) for lf, p in their_pairs])
    our_ok = timed(lambda: [verify_inclusion(i, n, lf, p, our_root) for i, lf, p in our_cases])
    olds = [random.randrange(1, n) for _ in range(samples)]
    their_cons = timed(lambda: [theirs.prove_consistency(m) for m in olds], repeat=2)
    our_cons = timed(lambda: [ours.consistency_proof(m, n) for m in olds], repeat=2)
    print(f"  -- {n:,} leaves (ours, then pymerkle's, per operation)")
    for what, mine, other, per in (
        ("build", our_build, their_build, 1),
        ("inclusion proof", our_gen, their_gen, samples),
        ("inclusion verification", our_ok, their_ok, samples),
        ("consistency proof", our_cons, their_cons, samples),
    ):
        unit, scale = ("s", 1.0) if per == 1 else ("ms", 1e3 / per)
        line(what, f"{mine * scale:.4f} {unit}", f"pymerkle {other * scale:.4f} {unit}: {other / mine:.1f}x")


def approvals_offline(gates: list[int]) -> None:
    """verify_approvals on the evidence package of a run with `n` approved calls, for each n in `gates`."""
    from bide.approvals import ApprovalGate, pending_approvals, submit_decision, verify_approvals
    from bide.audit import SigningKey
    from bide.testing import ScriptedModel, Turn, call, reply

    print("\nApprovals checked offline (bide.approvals.verify_approvals)")
    approver, log_key = SigningKey.generate(), SigningKey.generate()
    gate = ApprovalGate.k_of_n(1, {"alice": approver.public})

    @bide.tool(gate=gate)
    def wire(i: int) -> str:
        """Wire money."""
        return f"sent {i}"

    for n in gates:
        store = bide.MemoryStore()
        turns = [Turn(calls=tuple(call("wire", i=i).calls[0] for i in range(n))), reply("done")]
        agent = bide.Agent(ScriptedModel(turns), store=store, tools=[wire], max_parallel=64)
        with contextlib.suppress(bide.ApprovalPending):  # every call waits for its approver
            agent.run_sync("big", "pay everyone")
        for waiting in pending_approvals(store):
            submit_decision(store, "big", waiting.call_id, approver, approve=True)
        assert agent.run_sync("big", "pay everyone").answer == "done"
        package = AuditLog(store, log_key).evidence("big")
        took = timed(lambda: verify_approvals(package, log_key.public), repeat=1)  # noqa: B023
        line(
            f"{n:,} approved calls",
            f"{took:.2f} s",
            f"({len(package.records):,} records, {len(package.to_json()) / 1e6:.1f} MB; "
            f"{took / len(package.records) * 1e6:.0f} us per record)",
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--leaves", type=int, default=1_000_000)
    ap.add_argument("--sql-leaves", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=5_000)
    ap.add_argument("--appends", type=int, default=300)
    ap.add_argument(
        "--pymerkle-sizes",
        default="100000",
        help="comma-separated tree sizes for the side-by-side pymerkle section (when pymerkle is installed)",
    )
    ap.add_argument(
        "--gates", default="1000,4000", help="comma-separated numbers of approved calls for verify_approvals"
    )
    args = ap.parse_args()
    random.seed(1)
    memory(args.leaves, args.samples)
    ours_sql = store_backed(args.sql_leaves, min(args.samples, 2000), args.appends)
    sizes = [int(x) for x in args.pymerkle_sizes.split(",") if x]
    pymerkle_side_by_side(sizes, min(args.samples, 2000), args.sql_leaves, ours_sql)
    approvals_offline([int(x) for x in args.gates.split(",") if x])


if __name__ == "__main__":
    main()
