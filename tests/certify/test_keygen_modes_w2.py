"""The modes `govern keygen FILE` and `bide-audit keygen FILE` give the key files: the private key is 0600
and its public key 0644, whatever the umask (0 too), also when `--force` replaces files that were 0666, and
also where files are written without O_TMPFILE (the portable temporary file). A private key that other
users may read or write may already be someone else's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# `govern ARGV` or `bide-audit ARGV`, optionally as on a system without O_TMPFILE.
KEYGEN = """
import os, sys
if sys.argv[1] == "portable":
    del os.O_TMPFILE
if sys.argv[2] == "govern":
    from govern.cli import main
else:
    from bide.audit._cli import main
sys.exit(main(sys.argv[3:]))
"""

TOOLS = ["govern", "bide-audit"]


def keygen(tool: str, *args: str, cwd: Path, portable: bool = False) -> subprocess.CompletedProcess[str]:
    """`TOOL keygen ARGS` in a subprocess under a umask of 0."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    how = "portable" if portable else "usual"
    return subprocess.run(
        [sys.executable, "-c", KEYGEN, how, tool, "keygen", *args], capture_output=True, text=True, cwd=cwd,
        timeout=120, env={**os.environ, "PYTHONPATH": path}, preexec_fn=lambda: os.umask(0),
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def usable(key: Path) -> None:
    """The key loads where bide loads keys (which refuses one other users may read or write)."""
    from bide.audit import load_signing_key

    load_signing_key(key)


@pytest.mark.parametrize("portable", [False, True], ids=["tmpfile", "portable"])
@pytest.mark.parametrize("tool", TOOLS)
def test_a_new_key_is_0600_and_its_public_key_0644_under_a_umask_of_0(
    tmp_path: Path, tool: str, portable: bool
) -> None:
    done = keygen(tool, "k", cwd=tmp_path, portable=portable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (mode(tmp_path / "k"), mode(tmp_path / "k.pub")) == (0o600, 0o644)
    usable(tmp_path / "k")


@pytest.mark.parametrize("portable", [False, True], ids=["tmpfile", "portable"])
@pytest.mark.parametrize("tool", TOOLS)
def test_force_over_world_writable_key_files_writes_0600_and_0644(
    tmp_path: Path, tool: str, portable: bool
) -> None:
    for name in ("k", "k.pub"):
        (tmp_path / name).write_text("old\n")
        (tmp_path / name).chmod(0o666)
    done = keygen(tool, "k", "--force", cwd=tmp_path, portable=portable)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (mode(tmp_path / "k"), mode(tmp_path / "k.pub")) == (0o600, 0o644)
    assert b"PRIVATE KEY" in (tmp_path / "k").read_bytes()
    usable(tmp_path / "k")


@pytest.mark.parametrize("tool", TOOLS)
def test_force_over_a_link_to_a_world_writable_file_writes_a_0600_file_in_its_place(
    tmp_path: Path, tool: str
) -> None:
    """The link is replaced by a new 0600 file; the world-writable file it led to is not given the key."""
    (tmp_path / "elsewhere").write_text("old\n")
    (tmp_path / "elsewhere").chmod(0o666)
    (tmp_path / "k").symlink_to("elsewhere")
    done = keygen(tool, "k", "--force", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "k").is_symlink() and mode(tmp_path / "k") == 0o600
    assert (tmp_path / "elsewhere").read_text() == "old\n"
    usable(tmp_path / "k")
