"""`Machine.save` writes a machine file as the CLI writes its files (whole or not at all, mode 0644, a link
of one's own written through), and `Machine.load` writes nothing, so a replica may load a machine from a
directory it cannot write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from govern import Machine, Registry, max_

REPO = Path(__file__).resolve().parents[2]


def _lamp() -> Machine:
    reg = Registry("lamp")
    on = reg.bool("on")
    reg.event("switch_on", effect={on: True})
    return reg.build()


def _bookings(copies: int) -> Machine:
    """`copies` independent records: a machine built by components."""
    reg = Registry("bookings")
    for i in range(copies):
        stage = reg.int(f"stage{i}", 0, 3)
        reg.event(f"hold{i}", effect={stage: max_(stage, 1)})
    return reg.build(compose=True)


def test_save_over_a_private_file_leaves_a_file_every_replica_can_read(tmp_path: Path) -> None:
    """The file was written through mkstemp and kept its mode 0600: replicas running as another user could
    not load the machine a deploy had saved."""
    path = tmp_path / "lamp.govern"
    path.write_bytes(b"old")
    path.chmod(0o600)
    old_umask = os.umask(0o077)
    try:
        _lamp().save(path)
    finally:
        os.umask(old_umask)
    assert path.stat().st_mode & 0o777 == 0o644
    assert Machine.load(path).name == "lamp"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lamp.govern"]


def test_save_through_a_link_of_ones_own_updates_the_file_it_leads_to(tmp_path: Path) -> None:
    """A machine deployed through a link: the link was replaced by a file and the deployed one left stale."""
    (tmp_path / "releases").mkdir()
    deployed = tmp_path / "releases" / "lamp-1.govern"
    deployed.write_bytes(b"stale")
    link = tmp_path / "lamp.govern"
    link.symlink_to(deployed)
    _lamp().save(link)
    assert link.is_symlink()
    assert Machine.load(deployed).name == "lamp"


def test_a_composed_machine_loads_from_a_directory_it_cannot_write(tmp_path: Path) -> None:
    """Loading a machine built by components wrote each component to a temporary directory beside the
    file first: a replica whose machine directory is read-only to it could not load it (PermissionError).
    As root, the load runs without the capabilities that pass over file modes (capsh)."""
    machine = _bookings(3)
    assert type(machine).__name__ == "ComposedMachine"
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    machine.save(shelf / "bookings.govern")
    shelf.chmod(0o555)
    drop = ["capsh", "--drop=cap_dac_override,cap_dac_read_search,cap_fowner", "--", "-c", 'exec "$@"', "--"]
    wrap = drop if os.geteuid() == 0 else []
    assert not wrap or shutil.which("capsh"), "make test installs capsh (libcap2-bin)"
    code = (
        "import sys; from govern import Machine; "
        "m = Machine.load(sys.argv[1], digest=sys.argv[2]); print(m.replay(['hold0', 'hold2']).id)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(
            [*wrap, sys.executable, "-c", code, str(shelf / "bookings.govern"), machine.digest],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        shelf.chmod(0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(machine.replay(["hold0", "hold2"]).id)
    assert sorted(p.name for p in shelf.iterdir()) == ["bookings.govern"]
