"""Child for test_pg_paused_session.py: takes run r's lease on PostgreSQL and stops inside that transaction.

    python paused_lease_child.py STORE_URL TABLE_PREFIX DIR

Once the lease statement has answered, with its transaction still open (the run's row locked), it creates
DIR/in-lease and waits until DIR/go exists (the test stops this process with SIGSTOP meanwhile). Prints
the lease it was answered, or the error, as one JSON line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import bide
from bide._sql import SQLStore


def main() -> None:
    url, prefix, directory = sys.argv[1:4]
    where = Path(directory)
    lease = SQLStore._lease

    def paused(self: SQLStore, *args: Any) -> bide.Lease:
        answer = lease(self, *args)
        (where / "in-lease").touch()  # the test stops this process now
        while not (where / "go").exists():
            time.sleep(0.01)
        return answer

    SQLStore._lease = paused  # type: ignore[method-assign]
    store = SQLStore(url, table_prefix=prefix, busy_timeout=4.0)
    try:
        got = store.lease("r", "first", now_ms=int(time.time() * 1000), ttl_ms=500)
        print(json.dumps({"held": got.held, "holder": got.holder}))
    except bide.BideError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    finally:
        store.close()


if __name__ == "__main__":
    main()
