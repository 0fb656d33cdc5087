"""A driver that stops inside its event append: the event is written, not committed, and the log's lock
is held until the file `<dir>/go` appears (the test stops this process with SIGSTOP meanwhile).

    python _paused_append_worker.py STORE_URL LOG_URL LOG_NAME RUN_ID DIR
"""

from __future__ import annotations

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
        (where / "in-append").touch()  # the test stops this process now
        while not (where / "go").exists():
            time.sleep(0.01)

    eventlog._SqlTx.write = held_write  # type: ignore[method-assign]
    log = eventlog.EventLog(log_url, name=log_name, timeout=2.0)
    try:
        restocking_agent(store_url, log).run_sync(run_id, "restock o1")
    except Exception as exc:  # the test reads what happened from the journal and the log
        print(f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
