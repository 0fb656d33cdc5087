"""Child for the resolve interrupt tests: `bide resolve` that pauses once it holds the run's lease.

    python resolve_child.py DIR ARGUMENTS...

runs `bide ARGUMENTS`; once the resolver holds the run's lease and has read the run under it (just before
it decides and writes), it creates DIR/leased and waits until DIR/go exists (on its event loop: no thread
sleeps in a system call the test could take for a wait on the database lock).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import bide._resolve
from bide._cli import main


def pause_once_leased(where: Path) -> None:
    resolve_in = bide._resolve.resolve_in

    async def paused(*args: Any, **kwargs: Any) -> Any:
        (where / "leased").touch()
        while not (where / "go").exists():
            await asyncio.sleep(0.01)
        return await resolve_in(*args, **kwargs)

    bide._resolve.resolve_in = paused  # type: ignore[assignment]


if __name__ == "__main__":
    pause_once_leased(Path(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
