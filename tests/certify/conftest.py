"""Shared machines and helpers for the certificate and `govern` command tests."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from govern import Registry
from govern.certificate._certificate import Certificate
from govern.certificate._make import certify

# A machine file with two registries: one with every rule an expression, one with a Python callable.
MACHINES = '''\
from govern import Registry

orders = Registry("orders")
status = orders.enum("status", ["pending", "paid", "shipped", "cancelled"])
paid = orders.bool("paid")
stock = orders.int("stock", 0, 5)
orders.invariant("no_ship_unpaid", holds=(status != "shipped") | paid, repair={status: "pending"})
orders.event("pay", guard=status == "pending", effect={status: "paid", paid: True})
orders.event("ship", guard=status == "paid", effect={status: "shipped"})
orders.event("restock", guard=stock < 5, effect={stock: stock + 1})
orders.independent("pay", "restock")
orders.independent("ship", "restock")

lamp = Registry("lamp")
on = lamp.bool("on")
level = lamp.int("level", 0, 3)
lamp.event("switch_on", guard=lambda s: True, effect=lambda s: {"on": True})
lamp.event("brighten", guard=level < 3, effect={level: level + 1})
'''

# Two events that do not commute, checked as independent: not convergent.
DIVERGENT = '''\
from govern import Registry

switch = Registry("switch")
on = switch.bool("on")
switch.event("turn_on", effect={on: True})
switch.event("turn_off", effect={on: False})
'''


def orders_registry() -> Registry:
    namespace: dict[str, object] = {}
    exec(MACHINES, namespace)
    registry = namespace["orders"]
    assert isinstance(registry, Registry)
    return registry


def lamp_registry() -> Registry:
    namespace: dict[str, object] = {}
    exec(MACHINES, namespace)
    registry = namespace["lamp"]
    assert isinstance(registry, Registry)
    return registry


@pytest.fixture(scope="session")
def orders_cert() -> Certificate:
    return certify(orders_registry())


@pytest.fixture(scope="session")
def lamp_cert() -> Certificate:
    return certify(lamp_registry())


@pytest.fixture
def machine_dir(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text(MACHINES)
    (tmp_path / "divergent.py").write_text(DIVERGENT)
    return tmp_path


def govern(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real `govern` command in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "govern", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )


#: A tmpfs allocates whole pages: a file of 1 to 4096 bytes takes one.
PAGE = 4096
SMALL_DISK_BYTES = 16 * PAGE
COMMANDS = {"govern": "govern", "bide-audit": "bide.audit._cli"}


@dataclass
class Ran:
    """What a command did: its exit code and output."""

    returncode: int
    stdout: str
    stderr: str


@dataclass
class SmallDisk:
    """A directory on a 64 KiB filesystem that `fill` fills up, for what commands do on a full disk.

    It is a tmpfs mounted for the test (the tests run as root); where mounting is not allowed, it is a plain
    directory and `run` calls the command's main() in-process with `os.fsync` failing with ENOSPC once the
    files fsynced add up to more than `fill` left room for (a full disk reported when the data is flushed,
    as ext4 and NFS do)."""

    path: Path
    mounted: bool
    room: int = SMALL_DISK_BYTES

    def fill(self, room: int) -> None:
        """Leave `room` bytes (whole pages) free for new files, beside the files already there."""
        self.room = room
        if self.mounted:
            filler = self.path / ".filler"
            filler.unlink(missing_ok=True)
            disk = os.statvfs(self.path)
            filler.write_bytes(b"\0" * (disk.f_bavail * disk.f_frsize - room))

    def run(self, prog: str, *args: str, cwd: Path) -> Ran:
        """Run `prog` (govern or bide-audit) with `args` in `cwd`."""
        if self.mounted:
            done = subprocess.run(
                [sys.executable, "-m", COMMANDS[prog], *args], cwd=cwd, capture_output=True, text=True,
                timeout=300, env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
            )
            return Ran(done.returncode, done.stdout, done.stderr)
        return self._run_in_process(prog, list(args), cwd)

    def _run_in_process(self, prog: str, args: list[str], cwd: Path) -> Ran:
        from bide.audit._cli import main as audit_main
        from govern.cli._main import main as govern_main

        room = [self.room]
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                pages = -(-info.st_size // PAGE)
                if pages * PAGE > room[0]:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                room[0] -= pages * PAGE
            real_fsync(fd)

        out, err = io.StringIO(), io.StringIO()
        with pytest.MonkeyPatch.context() as patch, contextlib.chdir(cwd), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            patch.setattr(os, "fsync", fsync)
            patch.setenv("COLUMNS", "200")
            code = (govern_main if prog == "govern" else audit_main)(args)
        return Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 64 KiB filesystem, empty (see SmallDisk); unmounted afterwards."""
    path = tmp_path / "small-disk"
    path.mkdir()
    try:
        command = ["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES}", "tmpfs", str(path)]
        mounted = subprocess.run(command, capture_output=True).returncode == 0
    except OSError:  # no mount command
        mounted = False
    try:
        yield SmallDisk(path, mounted)
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)
