"""A key pair is signed with only when it matches, and a mismatch is explained for what it is.

`keygen --force FILE` (govern, bide, bide-audit) renames the new FILE into place, then FILE.pub, under the
pair's lock (`.FILE.lock`). Between the two renames the pair on disk is mismatched. A signing command that
read it then was told "a keygen killed ... run keygen --force FILE": wrong while that keygen is alive, and
running keygen again would replace the pair it was writing. The same was said to a command that read FILE
before a keygen replaced both files and FILE.pub after. Now a mismatch seen while a keygen holds the pair's
lock, or once the private key read has been replaced, says a keygen is replacing the pair right now (try
again); one a killed keygen left still says to run keygen --force FILE, with the same exit code (2 for
govern and bide, 4 for bide-audit, which reads keys as inputs).

Processes are stopped at a chosen file operation by a wrapper's audit hook (SIGSTOP; nothing in the
packages patched), then let go on or SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

pytestmark = pytest.mark.slow  # every command runs as a process

REPO = Path(__file__).resolve().parents[1]

# Runs `python -m MODULE ARGS...`, stopping itself (SIGSTOP) once, just before the first file operation of
# the kind WHEN names on a path ending in SUFFIX: `rename` (a rename onto it) or `open`.
_STOPPING = """
import os, runpy, signal, sys
when, suffix, module, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
event_wanted, position = {"rename": ("os.rename", 1), "open": ("open", 0)}[when]
stopped = False
def hook(event, hook_args):
    global stopped
    name = hook_args[position] if event == event_wanted else None
    if stopped or not isinstance(name, (str, bytes, os.PathLike)):
        return
    if os.fsdecode(os.fspath(name)).endswith(suffix):
        stopped = True
        os.kill(os.getpid(), signal.SIGSTOP)
sys.addaudithook(hook)
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

_LAMP = """\
from govern import Registry

lamp = Registry("lamp")
level = lamp.int("level", 0, 3)
lamp.event("brighten", guard=level < 3, effect={level: level + 1})
"""


@dataclass(frozen=True)
class Tool:
    """A command that makes key pairs, and how it signs with one (`refused`: its exit code for a key it
    will not use)."""

    module: str
    sign: tuple[str, ...]
    written: str
    refused: int


TOOLS = {
    "govern": Tool(
        "govern", ("certify", "lamp.py:lamp", "-o", "lamp.cert.json", "--sign"), "lamp.cert.json", 2
    ),
    "bide": Tool("bide._cli", ("approve", "--store", "sqlite:///runs.db", "r1", "c1", "--key"), "runs.db", 2),
    "bide-audit": Tool(
        "bide.audit._cli",
        ("export", "--store", "sqlite:///runs.db", "--run", "r1", "--head", "-o", "head.json", "--key"),
        "head.json",
        4,
    ),
}


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", "NO_COLOR": "1"}


def _run(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", module, *args]
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


def _stopping(when: str, suffix: str, module: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _STOPPING, when, suffix, module, *args]
    pipe = subprocess.PIPE
    return subprocess.Popen(command, cwd=cwd, env=_env(), stdout=pipe, stderr=pipe, text=True)


def _stopped(proc: subprocess.Popen[str]) -> None:
    """Wait until `proc` stops itself; fail if it ends instead."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        pytest.fail(f"it ended ({proc.returncode}) before the step it was to stop at: {proc.communicate()}")


def _matching(key: Path) -> bool:
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    public = serialization.load_pem_public_key(Path(f"{key}.pub").read_bytes())
    assert isinstance(private, Ed25519PrivateKey) and isinstance(public, Ed25519PublicKey)
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    return private.public_key().public_bytes(*raw) == public.public_bytes(*raw)


def _said(done: subprocess.CompletedProcess[str] | tuple[int | None, str]) -> str:
    return " ".join((done.stderr if isinstance(done, subprocess.CompletedProcess) else done[1]).split())


@pytest.fixture
def place(tmp_path: Path) -> Path:
    (tmp_path / "lamp.py").write_text(_LAMP)
    return tmp_path


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_pair_read_between_a_live_keygens_renames_is_told_to_wait_and_one_a_killed_keygen_left_to_keygen(
    place: Path, name: str
) -> None:
    tool = TOOLS[name]
    assert _run(tool.module, "keygen", "k", cwd=place).returncode == 0
    writer = _stopping("rename", "k.pub", tool.module, "keygen", "--force", "k", cwd=place)
    _stopped(writer)  # the new k is in place, the old k.pub beside it, and the pair's lock held
    assert not _matching(place / "k")

    live = _run(tool.module, *tool.sign, "k", cwd=place)
    assert live.returncode == tool.refused, live.stdout + live.stderr
    said = _said(live)
    assert "keygen of k is replacing the pair right now" in said and "try again once it is done" in said, said
    assert "keygen --force" not in said, said  # which would replace the pair that keygen is writing
    assert not (place / tool.written).exists()

    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=60)
    left = _run(tool.module, *tool.sign, "k", cwd=place)
    assert left.returncode == tool.refused, left.stdout + left.stderr
    said = _said(left)
    assert "not a pair" in said and "keygen --force k" in said and "right now" not in said, said
    assert not (place / tool.written).exists()

    again = _run(tool.module, "keygen", "--force", "k", cwd=place)
    assert again.returncode == 0, again.stderr
    assert _matching(place / "k")
    assert sorted(p.name for p in place.iterdir()) == ["k", "k.pub", "lamp.py"]  # no lock file, no temporary


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_a_signer_that_read_the_key_before_a_whole_keygen_and_its_pub_after_is_told_to_try_again(
    place: Path, name: str
) -> None:
    tool = TOOLS[name]
    assert _run(tool.module, "keygen", "k", cwd=place).returncode == 0
    signer = _stopping("open", "k.pub", tool.module, *tool.sign, "k", cwd=place)
    _stopped(signer)  # it has read k, not yet k.pub
    replaced = _run(tool.module, "keygen", "--force", "k", cwd=place)
    assert replaced.returncode == 0, replaced.stderr
    assert _matching(place / "k")
    os.kill(signer.pid, signal.SIGCONT)
    out, err = signer.communicate(timeout=300)
    assert signer.returncode == tool.refused, out + err
    said = _said((signer.returncode, err))
    assert "keygen of k is replacing the pair right now" in said and "not a pair" not in said, said
    assert not (place / tool.written).exists()


def test_keygens_of_one_path_at_once_by_all_three_commands_leave_a_matching_pair(place: Path) -> None:
    modules = [tool.module for tool in TOOLS.values()]
    for _ in range(3):
        procs = [
            subprocess.Popen([sys.executable, "-m", modules[i % 3], "keygen", "--force", "k"], cwd=place,
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i in range(6)
        ]  # fmt: skip
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, out + err
        assert _matching(place / "k")
        assert sorted(p.name for p in place.iterdir()) == ["k", "k.pub", "lamp.py"]
        assert (place / "k").stat().st_mode & 0o777 == 0o600
