"""Replica process for the multi-process tests: folds the log with shuffled, duplicated delivery.

Usage: _replica_worker.py LOG_URL LOG_NAME SEED EXPECTED CHECKPOINT_FILE DONE_FILE
Reads windows of the log, delivers each window in a random order with random duplicates, saves a
checkpoint after every window (atomically), and once the log holds EXPECTED events and DONE_FILE exists,
prints {"digest", "states", "position"} as JSON.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from machines import order_machine

from govern.runtime._eventlog import EventLog
from govern.runtime._replica import Checkpoint, Replica


def main() -> None:
    log_url, log_name, seed, expected, cp_file, done_file = sys.argv[1:7]
    rng = random.Random(f"{seed}-{os.getpid()}")
    machine = order_machine()
    log = EventLog(log_url, name=log_name)
    cp_path = Path(cp_file)
    checkpoint = Checkpoint.model_validate_json(cp_path.read_text()) if cp_path.exists() else None
    replica = Replica(machine, log, checkpoint=checkpoint)
    while True:
        window = log.read(replica.position, rng.randint(1, 12))
        if window:
            arrivals = window + rng.sample(window, k=rng.randint(0, len(window)))
            rng.shuffle(arrivals)
            replica.deliver(arrivals)
            assert replica.pending == 0, "a whole window was delivered, nothing may wait"
            tmp = cp_path.with_suffix(".tmp")
            tmp.write_text(replica.checkpoint().model_dump_json())
            os.replace(tmp, cp_path)
        elif replica.position >= int(expected) and Path(done_file).exists():
            break
        else:
            time.sleep(0.01)
    for key in replica.records():
        assert machine.is_valid(replica.state_id(key)), f"record {key} is not valid"
    print(json.dumps({"digest": replica.digest(), "states": replica.states(), "position": replica.position}))


if __name__ == "__main__":
    main()
