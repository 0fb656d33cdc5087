"""A driver that stops inside its event append: the event is written, not committed, and the log's lock
is held until the file `<dir>/go` appears (the test stops this process with SIGSTOP meanwhile). The file
`<dir>/in-append` tells the test it is there, and holds the PostgreSQL backend pid of its session (empty on
SQLite), so that the test can check the session still holds the lock.

    python _paused_append_worker.py STORE_URL LOG_URL LOG_NAME RUN_ID DIR
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE.parent))

import govern.runtime._eventlog as eventlog  # noqa: E402
from governed.test_governed_paused_driver import restocking_agent  # noqa: E402


def main() -> None:
    store_url, log_url, log_name, run_id, directory = sys.argv[1:6]
    where = Path(directory)
    write = eventlog._SqlTx.write

    def held_write(self: eventlog._SqlTx, *args: object, **kwargs: object) -> None:
        write(self, *args, **kwargs)  # type: ignore[arg-type]
        info = getattr(self.cur.connection, "info", None)  # (psycopg's; sqlite3 has none)
        (where / "in-append.tmp").write_text(str(getattr(info, "backend_pid", "")))
        os.replace(where / "in-append.tmp", where / "in-append")  # the test stops this process now
        while not (where / "go").exists():
            time.sleep(0.01)

    eventlog._SqlTx.write = held_write  # type: ignore[method-assign]
    # A longer timeout than the test's own log: the server ends a session idle in a transaction for half
    # of it (`_postgres_session`), and between the answer of the append's read and its first write the
    # session is idle in one. On a loaded machine this process (or its server process) can stall there
    # past 1 s: the server then ends the session before the writes reach it, the write phase need not see
    # it (the writes go out without waiting for an answer), and the test would pause a driver that holds
    # no lock (the other driver's append then succeeds; one event all the same).
    # Once its writes have reached the server, no timeout ends the paused session (the test checks it).
    log = eventlog.EventLog(log_url, name=log_name, timeout=10.0)
    try:
        restocking_agent(store_url, log).run_sync(run_id, "restock o1")
    except Exception as exc:  # the test reads what happened from the journal and the log
        print(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
