"""The mode of the file `bide-audit export -o FILE` writes: a new one is 0600 (evidence holds the journal's
records), whatever the umask; a file it replaces keeps the mode its owner gave it, and its owner and group,
also when a symlink at `FILE` leads to it. It made every replaced file 0600, silently: an auditor's other
account could no longer read the evidence deployed for it (docs/audit.md, docs/cli.md). `govern certify -o`
writes 0644."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import bide

ROOT = Path(__file__).resolve().parents[2]

MACHINE = '''\
from govern import Registry

lamp = Registry("lamp")
on = lamp.bool("on")
lamp.event("switch_on", effect={on: True})
'''


def run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` under umask 022, as a shell usually has."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, "PYTHONPATH": path}, preexec_fn=lambda: os.umask(0o022),
    )  # fmt: skip


@pytest.fixture
def export(tmp_path: Path) -> list[str]:
    """The arguments of an export of run `r1` of a SQLite store, signed with `log.key` (`-o` to add)."""
    url = f"sqlite:///{tmp_path / 'bide.db'}"
    store = bide.open_store(url)
    try:
        journal = bide.Journal(store, "r1").load()
        journal.write([bide.Start(key="run:start", entry="agent:test", input="go")])
        journal.write([bide.GateRecord(key="approval:note:0", data={"i": 0})])
    finally:
        store.close()
    assert run("bide.audit._cli", "keygen", "log.key", cwd=tmp_path).returncode == 0
    return ["export", "--store", url, "--run", "r1", "--key", "log.key"]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_evidence(path: Path, cwd: Path) -> None:
    """`path` holds the exported evidence, which verifies."""
    checked = run("bide.audit._cli", "verify-evidence", str(path), "--pubkey", "log.key.pub", cwd=cwd)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_new_export_file_is_made_0600(tmp_path: Path, export: list[str]) -> None:
    done = run("bide.audit._cli", *export, "-o", "evidence.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(tmp_path / "evidence.json") == 0o600
    assert_evidence(tmp_path / "evidence.json", tmp_path)


@pytest.mark.parametrize("chosen", [0o644, 0o640, 0o600], ids=oct)
def test_a_replaced_export_file_keeps_its_mode(tmp_path: Path, export: list[str], chosen: int) -> None:
    old = tmp_path / "evidence.json"
    old.write_text("yesterday's evidence\n")
    old.chmod(chosen)
    done = run("bide.audit._cli", *export, "-o", "evidence.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(old) == chosen
    assert_evidence(old, tmp_path)


def test_an_export_through_a_link_keeps_the_mode_of_the_file_it_leads_to(
    tmp_path: Path, export: list[str]
) -> None:
    deployed = tmp_path / "shared" / "evidence.json"
    deployed.parent.mkdir()
    deployed.write_text("yesterday's evidence\n")
    deployed.chmod(0o644)
    (tmp_path / "link.json").symlink_to(deployed)
    done = run("bide.audit._cli", *export, "-o", "link.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "link.json").is_symlink() and mode(deployed) == 0o644
    assert_evidence(deployed, tmp_path)


def test_a_dangling_link_makes_a_new_file_0600(tmp_path: Path, export: list[str]) -> None:
    (tmp_path / "link.json").symlink_to("made.json")
    done = run("bide.audit._cli", *export, "-o", "link.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(tmp_path / "made.json") == 0o600


def test_a_certificate_is_written_0644(tmp_path: Path) -> None:
    """As docs/cli.md says: a certificate holds no secret, and is meant to be read by whoever checks it."""
    (tmp_path / "lamp.py").write_text(MACHINE)
    done = run("govern", "certify", "lamp.py:lamp", "-o", "lamp.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(tmp_path / "lamp.json") == 0o644


def test_a_replaced_export_file_keeps_its_owner_and_group(tmp_path: Path, export: list[str]) -> None:
    """A 0640 file of the auditors' group, replaced by an export run as root, came back root:root, so the
    group that was to read it no longer could. It keeps its owner and group (a process that is not root
    keeps the group, when it belongs to it)."""
    old = tmp_path / "evidence.json"
    old.write_text("yesterday's evidence\n")
    old.chmod(0o640)
    uid, gid = (4321, 8765) if os.geteuid() == 0 else (os.getuid(), os.getgroups()[-1])
    os.chown(old, uid, gid)
    done = run("bide.audit._cli", *export, "-o", "evidence.json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    found = old.stat()
    assert (found.st_uid, found.st_gid, mode(old)) == (uid, gid, 0o640)
    assert_evidence(old, tmp_path)
