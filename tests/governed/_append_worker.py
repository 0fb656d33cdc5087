"""Worker process for the multi-process append tests: appends its events, each twice (a retried append)."""

from __future__ import annotations

import sys

from govern.runtime._eventlog import Event, EventLog


def main() -> None:
    url, name, writer, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    log = EventLog(url, name=name)
    log.bind("a" * 64, events=["pay", "ship", "cancel"])  # the processes race to create and bind the log
    for seq in range(count):
        event = Event(
            id=f"{writer}-{seq}",
            machine="a" * 64,
            record=f"order-{seq % 3}",
            event="pay",
            producer=writer,
            producer_seq=seq,
            deps=(f"{writer}-{seq - 1}",) if seq else (),
        )
        first = log.append(event)
        again = log.append(event)
        assert again.event.position == first.event.position and not again.created
    log.close()


if __name__ == "__main__":
    main()
