"""An appender that stops inside its append on PostgreSQL, once it holds the log's lock and has read what
the append needs: it creates `<dir>/in-append` and waits until `<dir>/go` exists (the test stops this
process with SIGSTOP meanwhile). Prints the outcome as one JSON line.

    python _paused_read_worker.py LOG_URL LOG_NAME DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import govern.runtime._eventlog as eventlog  # noqa: E402
from governed.test_governed_eventlog import bound, ev  # noqa: E402


def main() -> None:
    log_url, log_name, directory = sys.argv[1:4]
    where = Path(directory)
    read = eventlog._SqlTx.read

    def held_read(self: eventlog._SqlTx, *args: Any, **kwargs: Any) -> Any:
        seen = read(self, *args, **kwargs)
        if not (where / "go").exists():
            (where / "in-append").touch()  # the test stops this process now
        while not (where / "go").exists():
            time.sleep(0.01)
        return seen

    log = bound(log_url, log_name, timeout=4.0)
    eventlog._SqlTx.read = held_read  # type: ignore[method-assign]
    try:
        appended = log.append(ev("paused", name="pay", producer="q"))
        print(json.dumps({"created": appended.created, "id": appended.event.id}))
    except eventlog.EventLogError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))


if __name__ == "__main__":
    main()
