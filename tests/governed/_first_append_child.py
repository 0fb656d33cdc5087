"""A producer making the first append of fresh logs at given moments: argv is the log URL, the producer
number, and then name@unix-time pairs. Prints one JSON line per append: the log name and the error, if
any. (Run by test_governed_first_append_race.py.)"""

from __future__ import annotations

import json
import sys
import time

from machines import order_machine

import govern


def main() -> None:
    url, worker, slots = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    machine = order_machine()
    for slot in slots:
        name, at = slot.rsplit("@", 1)
        log = govern.EventLog(url, name=name, machine=machine)
        try:
            log.read(0, 1)  # connected before the moment
            time.sleep(max(0.0, float(at) - time.time()))
            event = govern.Event(
                id=f"e{worker}", machine=machine.digest, record="r", event="restock", producer=f"p{worker}"
            )
            try:
                log.append(event)
                error = None
            except govern.GovernError as exc:
                error = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"log": name, "error": error}), flush=True)
        finally:
            log.close()


if __name__ == "__main__":
    main()
