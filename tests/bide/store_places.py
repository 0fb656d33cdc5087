"""What the tests of stores in awkward places share: commands run as another user would run them (root
reaches every file), a small store to put there, and a disk that fills (the `small_disk` fixture is in
conftest.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import bide
from bide.testing import ScriptedModel, reply

# Root passes over file and directory modes: the commands run without the capabilities that let it.
WITHOUT_ROOTS_REACH = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c",
                       'exec "$@"', "--"]  # fmt: skip


def as_another_user() -> list[str]:
    """The command prefix that runs a command without root's reach over files (none when not root)."""
    wrap = WITHOUT_ROOTS_REACH if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    return wrap


def make_store(path: Path) -> None:
    """A SQLite store at `path` holding one completed run, "r1"."""
    store = bide.open_store(f"sqlite:///{path}")
    try:
        bide.Agent(ScriptedModel([reply("hi")]), store=store).run_sync("r1", "hi")
    finally:
        store.close()
