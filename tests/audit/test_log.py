"""The store-backed tree: incremental, equal to the reference tree, proofs bound to signed heads."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
from pg_tables import drop_prefixed_tables

import bide
from bide.audit import (
    AnchorError,
    AuditLog,
    DirectoryPublisher,
    EvidencePackage,
    HttpPublisher,
    JournalDamaged,
    MerkleTree,
    NotVerified,
    ProofBundle,
    SignedTreeHead,
    SigningKey,
    journal_leaf,
    parse_artifact,
    verify_bundle,
    verify_consistency_proof,
    verify_evidence,
)

from .conftest import write_run


def _reference_root(store: bide.Store, run_id: str, size: int | None = None) -> bytes:
    entries = store.load(run_id)
    tree = MerkleTree(journal_leaf(e.data) for e in entries)
    return tree.root(size)


def test_tree_follows_the_journal_incrementally(store: bide.Store, log_key: SigningKey) -> None:
    log = AuditLog(store, log_key)
    write_run(store, "r1", 3)
    assert log.sync("r1") == 5
    assert log.root("r1") == _reference_root(store, "r1")
    first = log.sign_head("r1")
    for step in range(4):
        journal = bide.Journal(store, "r1").load()
        journal.write([bide.GateRecord(key=f"approval:more:{step}:{i}", data=i) for i in range(step + 1)])
        n = log.sync("r1")
        assert n == len(store.load("r1"))
        assert log.root("r1") == _reference_root(store, "r1")
        for old in range(n + 1):
            assert log.root("r1", old) == _reference_root(store, "r1", old)
    second = log.sign_head("r1")
    proof = log.consistency("r1", first.size)
    assert verify_consistency_proof(first, second, proof, log_key.public).proven
    # another AuditLog object on the same store sees the same tree
    assert AuditLog(store, log_key).root("r1") == second.root


def test_bundles_and_evidence_verify_for_every_record(store: bide.Store, log_key: SigningKey) -> None:
    write_run(store, "r2", 6)
    log = AuditLog(store, log_key)
    sth = log.sign_head("r2")
    for e in store.load("r2"):
        bundle = parse_artifact(ProofBundle, log.prove("r2", e.key, sth).to_json())
        v = verify_bundle(bundle, log_key.public)
        assert e.key in v.proven
    pkg = parse_artifact(EvidencePackage, log.evidence("r2", sth).to_json())
    v = verify_evidence(pkg, log_key.public)
    assert "all of its records" in v.proven
    part = log.evidence("r2", sth, keys=["run:start"])
    assert "1 of its 8 records" in verify_evidence(part, log_key.public).proven


def test_wrong_key_and_other_run_fail(store: bide.Store, log_key: SigningKey) -> None:
    write_run(store, "a", 2)
    write_run(store, "b", 2)
    log = AuditLog(store, log_key)
    bundle = log.prove("a", "run:start")
    with pytest.raises(NotVerified):
        verify_bundle(bundle, SigningKey.generate().public)
    head_b = log.sign_head("b")
    # a head of run b does not prove run a's record even though the runs look alike
    swapped = bundle.model_copy(update={"sth": head_b})
    with pytest.raises(NotVerified):
        verify_bundle(swapped, log_key.public)


def test_rewritten_record_in_sql_store_is_detected(tmp_path: Path, log_key: SigningKey) -> None:
    store = bide.open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        write_run(store, "r", 3)
        log = AuditLog(store, log_key)
        sth = log.sign_head("r")
        engine = store.engine  # type: ignore[attr-defined]
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE bide_records SET data = :d WHERE key = 'run:start'"),
                {"d": b'{"entry":"agent:evil","input":"go","key":"run:start","kind":"start"}'},
            )
        with pytest.raises(JournalDamaged, match="record 1 of the journal of run 'r'"):
            log.evidence("r", sth)
        edited = r"has at position 1 a record \('run:start' now\) other than the tree's"
        with pytest.raises(JournalDamaged, match=edited):
            log.check_journal("r")
    finally:
        store.close()


def test_concurrent_syncs_agree(tmp_path: Path, log_key: SigningKey) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    store = bide.open_store(url)
    try:
        write_run(store, "r", 40)
        logs = [AuditLog(bide.open_store(url)) for _ in range(4)]
        threads = [threading.Thread(target=lg.sync, args=("r",)) for lg in logs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        roots = {lg.root("r") for lg in logs}
        assert roots == {_reference_root(store, "r")}
        for lg in logs:
            lg.store.close()
    finally:
        store.close()


def test_directory_publisher_anchors_every_head(tmp_path: Path, log_key: SigningKey) -> None:
    store = bide.MemoryStore()
    (tmp_path / "anchor").mkdir()
    anchor = DirectoryPublisher(tmp_path / "anchor")
    log = AuditLog(store, log_key, anchor)
    write_run(store, "r", 1)
    h1 = log.sign_head("r")
    write_run(store, "r", 2)  # adds records with new keys only where absent
    bide.Journal(store, "r").load().write([bide.GateRecord(key="approval:late", data=None)])
    h2 = log.sign_head("r")
    files = sorted((tmp_path / "anchor").rglob("*.json"))
    assert len(files) == 2
    read = [parse_artifact(SignedTreeHead, f.read_bytes()) for f in files]
    assert read == [h1, h2]
    # an anchored file is never overwritten with other contents
    forged = h2.model_copy(update={"root": bytes(32)})
    with pytest.raises(AnchorError):
        anchor.publish(forged)


def test_directory_publisher_never_creates_its_directory(tmp_path: Path, log_key: SigningKey) -> None:
    """A mistyped anchor path is refused, not created: a head published there would sit where nobody looks."""
    store = bide.MemoryStore()
    write_run(store, "r", 1)
    missing = tmp_path / "no-such-mount" / "anchor"
    log = AuditLog(store, log_key, DirectoryPublisher(missing))
    with pytest.raises(AnchorError, match="does not exist"):
        log.sign_head("r")
    assert not (tmp_path / "no-such-mount").exists()
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(AnchorError, match="is not a directory"):
        AuditLog(store, log_key, DirectoryPublisher(tmp_path / "a-file")).sign_head("r")


def test_http_publisher_posts_heads_and_reports_refusals(log_key: SigningKey) -> None:
    received: list[bytes] = []
    status = [200]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(body)
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/heads"
        store = bide.MemoryStore()
        write_run(store, "r", 1)
        log = AuditLog(store, log_key, HttpPublisher(url))
        sth = log.sign_head("r")
        assert parse_artifact(SignedTreeHead, received[0]) == sth
        assert json.loads(received[0])["log_id"] == "r"
        status[0] = 503
        with pytest.raises(AnchorError, match="503"):
            log.sign_head("r")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(AnchorError):
        HttpPublisher(url, timeout=0.5).publish(sth)


def test_audited_store_anchors_every_growth_of_an_agent_run(tmp_path: Path, log_key: SigningKey) -> None:
    from bide.audit import AuditedStore
    from bide.testing import ScriptedModel, call, reply

    @bide.tool(safety=bide.ReadOnly)
    def look(q: str) -> str:
        """Look something up."""
        return q.upper()

    inner = bide.open_store(f"sqlite:///{tmp_path / 'a.db'}")
    (tmp_path / "anchor").mkdir()
    anchor = DirectoryPublisher(tmp_path / "anchor")
    store = AuditedStore(inner, AuditLog(inner, log_key, anchor))
    try:
        agent = bide.Agent(ScriptedModel([call("look", q="x"), reply("ok")]), store=store, tools=[look])
        assert agent.run_sync("r", "go").answer == "ok"
        assert store.errors == []
        heads = [
            parse_artifact(SignedTreeHead, f.read_bytes())
            for f in sorted((tmp_path / "anchor").rglob("*.json"))
        ]
        sizes = [h.size for h in heads]
        assert sizes == sorted(sizes) and sizes[-1] == len(inner.load("r")) and len(heads) >= 3
        log = AuditLog(store, log_key)
        # every anchored head is a prefix of the final journal
        for h in heads[:-1]:
            assert verify_consistency_proof(
                h, heads[-1], log.consistency("r", h.size, heads[-1].size), log_key.public
            )
    finally:
        store.close()


def test_sql_tree_matches_reference_across_many_small_and_large_appends(tmp_path: Path) -> None:
    # exercises level-0 tile boundaries (128 hashes per tile) and the recomputed levels 1..6 and 7..13,
    # with the per-object cache and with a second object that must read the edge from the tables
    store = bide.open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        write_run(store, "r", 0)
        a, b = AuditLog(store), AuditLog(bide.open_store(f"sqlite:///{tmp_path / 's.db'}"))
        sizes = [1, 1, 2, 61, 1, 64, 130, 3, 200, 1, 1, 700]
        written = 0
        for step, k in enumerate(sizes):
            bide.Journal(store, "r").load().write(
                [bide.GateRecord(key=f"approval:{step}:{i}", data=i) for i in range(k)]
            )
            written += k
            lg = a if step % 3 else b
            n = lg.sync("r")
            assert n == written + 2
            ref = MerkleTree(journal_leaf(e.data) for e in store.load("r"))
            for other in (a, b):
                assert other.root("r") == ref.root()
            for i in (0, n // 3, n - 1):
                assert a.inclusion("r", i, n) == ref.inclusion_proof(i, n)
        b.store.close()
    finally:
        store.close()


def _raw(i: int) -> tuple[str, bytes]:
    return f"k{i}", b'{"key":"k%d","kind":"gate","salt":"%s"}' % (i, b"A" * 43 + b"=")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sql_tree_across_upper_tile_boundaries(tmp_path: Path, backend: str) -> None:
    # 128 * 128 leaves fill the first tile of level 7 and start level 14: cross that point in small steps,
    # each absorbed by a fresh object (edge and partial tiles read back from the tables) or the cached one
    import uuid

    from .conftest import POSTGRES_URL

    if backend == "sqlite":
        url, prefix = f"sqlite:///{tmp_path / 't.db'}", "bide_"
    else:
        url, prefix = POSTGRES_URL, f"t{uuid.uuid4().hex[:10]}_"
    store = bide.open_store(url, table_prefix=prefix)
    try:
        edge = 128 * 128
        store.insert_many("r", [_raw(i) for i in range(edge - 3)])
        warm = AuditLog(store)
        assert warm.sync("r") == edge - 3
        written = edge - 3
        for step, k in enumerate([1, 1, 1, 1, 2, 130, 1]):
            store.insert_many("r", [_raw(i) for i in range(written, written + k)])
            written += k
            lg = warm if step % 2 else AuditLog(bide.open_store(url, table_prefix=prefix))
            assert lg.sync("r") == written
            ref = MerkleTree(journal_leaf(e.data) for e in store.load("r"))
            assert lg.root("r") == ref.root() and warm.root("r") == ref.root()
            for i in [i for i in (0, edge - 1, edge, written // 2, written - 1) if i < written]:
                assert lg.inclusion("r", i, written) == ref.inclusion_proof(i, written)
            for m in [m for m in (1, edge - 1, edge, written - 1) if m <= written]:
                assert lg.consistency("r", m).path == ref.consistency_proof(m, written)
            if lg is not warm:
                lg.store.close()
    finally:
        if backend == "postgres":
            drop_prefixed_tables(store.engine, prefix)  # type: ignore[attr-defined]
        store.close()


def test_tables_of_the_earlier_layout_are_not_read(tmp_path: Path) -> None:
    # Databases written before the tiled layout hold bide_audit_strips / bide_audit_trees: they are
    # ignored, and the tree is rebuilt from the journal.
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = bide.open_store(url)
    try:
        store.insert_many("r", [_raw(i) for i in range(300)])
        with store.engine.begin() as conn:  # type: ignore[attr-defined]
            conn.exec_driver_sql(
                "CREATE TABLE bide_audit_strips (run_id TEXT, level INTEGER, strip INTEGER, hashes BLOB)"
            )
            conn.exec_driver_sql("CREATE TABLE bide_audit_trees (run_id TEXT, size INT, last_seq INT)")
            conn.exec_driver_sql("INSERT INTO bide_audit_trees VALUES ('r', 999, 999)")
            conn.exec_driver_sql("INSERT INTO bide_audit_strips VALUES ('r', 0, 0, x'00')")
        log = AuditLog(store)
        assert log.sync("r") == 300
        assert log.root("r") == _reference_root(store, "r")
    finally:
        store.close()


def test_a_record_altered_in_the_store_after_it_was_hashed_is_not_proven(
    tmp_path: Path, log_key: SigningKey
) -> None:
    """`prove` checks the one record it proves against its leaf hash (not every record of the run): an
    altered record is refused, the others are still proven, and `evidence` refuses the whole run."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = bide.open_store(url)
    try:
        write_run(store, "r", 3)
        log = AuditLog(store, log_key)
        head = log.sign_head("r")
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE bide_records SET data = :d WHERE run_id = 'r' AND key = 'approval:note:1'"),
                {"d": b'{"altered": true}'},
            )
        engine.dispose()
        with pytest.raises(JournalDamaged, match="does not hash to leaf"):
            log.prove("r", "approval:note:1", head)
        bundle = log.prove("r", "approval:note:2", head)
        assert verify_bundle(bundle, log_key.public).proven
        with pytest.raises(JournalDamaged, match="does not hash to leaf"):
            log.evidence("r", head)
    finally:
        store.close()


def test_a_record_committed_while_the_journal_is_checked_is_not_damage() -> None:
    """`check_journal` compares the journal with its tree as of its sync: a record the live run commits
    right after (before the journal is read) is the tree's next, not a record inserted behind bide."""
    store = bide.MemoryStore()
    journal = bide.Journal(store, "r").load()
    journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
    for i in range(3):
        journal.write([bide.GateRecord(key=f"approval:note:{i}", data={"i": i})])
    log = AuditLog(store)
    synced = log.sync

    def sync_then_the_run_goes_on(run_id: str) -> int:
        size = synced(run_id)
        journal.write([bide.GateRecord(key="approval:note:late", data={"i": 99})])
        return size

    log.sync = sync_then_the_run_goes_on  # type: ignore[method-assign]
    assert log.check_journal("r") == 5


def test_heads_signed_by_two_processes_in_either_order_are_consistent() -> None:
    """Two processes anchoring one run at once: one read the tree at 3 records, the other signed its head at
    5 first, then the first signed at 3. verify-consistency refused the pair ("the larger head is dated
    before the smaller one"), so two authentic heads could never be shown consistent. A head's date is its
    signer's clock: the pair verifies, and the output says the dates are the other way round."""
    from bide.audit._formats import sign_head

    store = bide.MemoryStore()
    write_run(store, "r", 3)  # header, start, 3 notes: 5 records
    key = SigningKey.generate()
    log = AuditLog(store, key)
    assert log.sync("r") == 5
    larger = sign_head(key, "r", 5, log.root("r", 5), timestamp_ns=1_800_000_000_000_000_000)
    smaller = sign_head(key, "r", 3, log.root("r", 3), timestamp_ns=1_800_000_000_250_000_000)
    proof = log.consistency("r", 3, 5)
    now = 1_800_000_001_000_000_000
    verified = verify_consistency_proof(smaller, larger, proof, key.public, now_ns=now)
    assert "extends, unchanged" in verified.proven
    assert "the larger head is dated 0.250 s before the smaller one" in verified.not_proven
    with pytest.raises(NotVerified, match="does not extend"):  # the proof still binds the roots
        forged = sign_head(key, "r", 5, bytes(32), timestamp_ns=now)
        verify_consistency_proof(smaller, forged, proof, key.public, now_ns=now)
