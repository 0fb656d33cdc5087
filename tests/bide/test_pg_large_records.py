"""PostgreSQL: records of several MB (a long message, a large tool result) are written and read back.

A batch writing that much went through psycopg's pipeline mode, which could wait forever on it (from about
6 MB: the client in Pipeline.sync, the server session 'active'): a side effect fired, then the drive hung
journaling its result, with no timeout to end it, and a kill left the call in doubt. Such a batch is now
sent without the pipeline. The child runs in a subprocess with a time limit, so a hang fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import PG_URL, drop_prefix

HERE = Path(__file__).resolve().parent
SIZE = 8_000_000  # (every try hung at this size before)
ROUNDS = 3


@pytest.mark.postgres
@pytest.mark.slow
def test_records_of_several_megabytes_are_journaled_and_read_back(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    try:
        child = subprocess.run(
            [sys.executable, str(HERE / "large_records_child.py"), PG_URL, prefix, str(ledger), str(SIZE),
             str(ROUNDS)],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        drop_prefix(PG_URL, prefix)
    assert child.returncode == 0, child.stderr[-3000:]
    rounds = [json.loads(line) for line in child.stdout.splitlines()]
    expected = {"run": "sent", "thread": "sent", "result": SIZE, "message": SIZE}
    assert rounds == [expected] * ROUNDS
    # Each side effect fired once: two per round (the run's call and the thread's).
    assert sorted(ledger.read_text().splitlines()) == sorted([f"q{i}" for i in range(ROUNDS)] * 2)
