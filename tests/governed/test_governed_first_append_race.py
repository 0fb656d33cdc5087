"""A fresh log's first appends, made by several processes at one moment while another reads its length.

The log's row and its first events commit together. A reader (or an appender) that found no row and then,
in a second statement, found events called the log orphaned ("its row in govern_logs is gone ... restore
the log from a backup"): 21 trials of 40 for `length()` on SQLite and 19 on PostgreSQL, and 6 appends of
180 on PostgreSQL, where FOR UPDATE waits on no row that does not exist yet. The row is read again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import govern

HERE = Path(__file__).resolve().parent
PRODUCERS = 6
TRIALS = 8


def test_first_appends_racing_a_reader_never_call_a_new_log_orphaned(log_url: str) -> None:
    tag = uuid.uuid4().hex[:8]
    base = time.time() + 4.0  # the producers import govern and connect first
    slots = [(f"first-{tag}-{k}", base + 0.4 * k) for k in range(TRIALS)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    args = [f"{name}@{at}" for name, at in slots]
    producers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "_first_append_child.py"), log_url, str(w), *args],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for w in range(PRODUCERS)
    ]
    refused: list[str] = []
    try:
        for name, at in slots:
            reader = govern.EventLog(log_url, name=name)
            try:
                reader.read(0, 1)
                time.sleep(max(0.0, at - 0.05 - time.time()))
                while time.time() < at + 0.3:
                    try:
                        reader.length()
                    except govern.LogCorrupted as exc:
                        refused.append(str(exc))
                        break
            finally:
                reader.close()
        outputs = [p.communicate(timeout=120)[0] for p in producers]
    finally:
        for p in producers:
            p.kill()
    assert refused == []
    lines = [json.loads(line) for out in outputs for line in out.splitlines()]
    assert len(lines) == PRODUCERS * TRIALS and all(p.returncode == 0 for p in producers)
    assert [line for line in lines if line["error"]] == []
    for name, _ in slots:
        log = govern.EventLog(log_url, name=name)
        try:
            assert sorted(e.id for e in log.read()) == [f"e{w}" for w in range(PRODUCERS)]
        finally:
            log.close()
