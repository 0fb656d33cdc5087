"""A key pair is never used mismatched, and keygen leaves a matching one. `keygen --force` writes the private
key and its `.pub` with two renames: a keygen killed between them left the new private key beside the old
`.pub`, and two at once could leave one's private key beside the other's `.pub`; the key was then loaded
and signed heads that the `.pub` verifiers pin does not verify. A private key whose `.pub` holds another key
is now refused where it is loaded (naming both key ids and the fix), and keygen writes a pair under its lock
(`.FILE.lock`, as the anchor directory's), so two at once take turns.

Keygen is stopped at a chosen step by a wrapper that watches its file operations (an audit hook that sends
the process SIGSTOP; nothing in bide is changed), then killed with SIGKILL or let go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import bide
from bide.audit import UnreadableInput, generate_key, load_public_key, load_signing_key

from .conftest import write_run

pytestmark = pytest.mark.slow  # keygen runs as processes

REPO = Path(__file__).resolve().parents[2]

# Runs `bide-audit keygen --force FILE`, stopping itself (SIGSTOP) just before its file operation number N
# in FILE's directory (`nth N`), or just before it renames a file over FILE.pub (`pub`), or never (`none`).
_KEYGEN_STOPPED = """
import os, signal, sys
directory, mode, path = sys.argv[1], sys.argv[2], sys.argv[3]
if os.environ.get("PAIR_LOCK_WAIT_S"):
    import bide._files
    bide._files.PAIR_LOCK_WAIT_S = float(os.environ["PAIR_LOCK_WAIT_S"])
seen = 0
def watch(event, args):
    global seen
    if event not in ("open", "os.rename", "os.link", "os.remove", "os.rmdir", "os.chmod"):
        return
    paths = [os.fsdecode(a) for a in args[:2] if isinstance(a, (str, bytes))]
    if not any(p.startswith(directory) for p in paths):
        return
    seen += 1
    if mode == "pub" and event == "os.rename" and paths[1].endswith(".pub"):
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode.startswith("nth ") and seen == int(mode.split()[1]):
        os.kill(os.getpid(), signal.SIGSTOP)
sys.addaudithook(watch)
from bide.audit._cli import main
sys.exit(main(["keygen", "--force", path]))
"""


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **extra}


def _keygen(key: Path, mode: str, **env: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", _KEYGEN_STOPPED, str(key.parent), mode, str(key)]
    pipe = subprocess.PIPE
    return subprocess.Popen(command, stdout=pipe, stderr=pipe, text=True, env=_env(**env))


def _stopped(proc: subprocess.Popen[str]) -> bool:
    """Wait until `proc` stops itself (True) or ends (False: then its return code is set)."""
    _, status = os.waitpid(proc.pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        return True
    proc.returncode = os.waitstatus_to_exitcode(status)
    return False


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def _pair(key: Path) -> str:
    """What loading the key finds: a matching pair, or one refused as mismatched (any other outcome fails)."""
    try:
        signing = load_signing_key(key)
    except UnreadableInput as exc:
        assert "keygen --force" in str(exc) and "not a pair" in str(exc), exc
        return "refused"
    assert load_public_key(f"{key}.pub").raw == signing.public.raw, "a mismatched pair was loaded"
    return "matching"


def _audit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bide.audit._cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=_env(), timeout=120)


def test_a_private_key_beside_another_keys_pub_is_refused_naming_both(tmp_path: Path) -> None:
    mine, other = generate_key(tmp_path / "log.key"), generate_key(tmp_path / "other.key")
    (tmp_path / "log.key.pub").write_bytes((tmp_path / "other.key.pub").read_bytes())
    with pytest.raises(UnreadableInput) as refused:
        load_signing_key(tmp_path / "log.key")
    message = str(refused.value)
    assert mine.key_id in message and other.key_id in message, message
    assert f"keygen --force {tmp_path / 'log.key'}" in message and "put back the .pub" in message


def test_a_keygen_killed_between_its_renames_leaves_a_pair_that_is_refused_until_keygen_runs_again(
    tmp_path: Path,
) -> None:
    key = tmp_path / "log.key"
    old = generate_key(key)
    killed = _keygen(key, "pub")
    assert _stopped(killed), killed.communicate()
    assert key.read_bytes() != old.pem() and load_public_key(f"{key}.pub").raw == old.public.raw
    _kill(killed)  # the new private key is in place, the old .pub beside it
    assert _pair(key) == "refused"
    store = bide.open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        write_run(store, "r1", 1)
    finally:
        store.close()
    export = _audit("export", "--store", "sqlite:///runs.db", "--run", "r1", "--key", "log.key", "--head",
                    "-o", "head.json", cwd=tmp_path)  # fmt: skip
    assert export.returncode == 4, export.stdout + export.stderr
    assert old.key_id in export.stderr and "keygen --force" in export.stderr, export.stderr
    assert not (tmp_path / "head.json").exists()
    # Run again, keygen takes over the lock file the killed one left, and leaves a matching pair.
    again = _audit("keygen", "--force", "log.key", cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _pair(key) == "matching"
    # No lock file is left, nor any temporary.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".log.key")] == []


def test_a_keygen_killed_at_any_step_leaves_nothing_used_mismatched(tmp_path: Path) -> None:
    """Killed before each of its file operations in turn, keygen --force leaves either a matching pair or one
    refused; the next keygen --force always leaves a matching pair."""
    key = tmp_path / "log.key"
    generate_key(key)
    outcomes = []
    for step in range(1, 60):
        proc = _keygen(key, f"nth {step}")
        if not _stopped(proc):  # no such step: keygen ran to its end
            assert proc.returncode == 0, proc.communicate()
            break
        _kill(proc)
        outcomes.append(_pair(key))
        generate_key(key, overwrite=True)
        assert _pair(key) == "matching"
    else:
        pytest.fail("keygen never ran to its end")
    assert "refused" in outcomes and len(outcomes) > 3, outcomes
    assert not (tmp_path / ".log.key.lock").exists()


def test_two_keygens_of_one_file_at_once_take_turns(tmp_path: Path) -> None:
    """A keygen is stopped between its two renames; another keygen of the same file meanwhile replaced both
    files, and the first then put its .pub beside the other's private key. It now waits for the first's
    lock (here 1 s, then gives up, nothing written), and the pair left is the first's, whole."""
    key = tmp_path / "log.key"
    generate_key(key)
    first = _keygen(key, "pub")
    assert _stopped(first), first.communicate()
    second = _keygen(key, "none", PAIR_LOCK_WAIT_S="1")
    out, err = second.communicate(timeout=120)
    os.kill(first.pid, signal.SIGCONT)
    first_out, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_out + first_err
    assert _pair(key) == "matching"
    assert second.returncode == 2, out + err
    assert "held its lock" in err and "the existing key files were kept" in err, err


def test_many_keygens_of_one_file_at_once_leave_one_matching_pair(tmp_path: Path) -> None:
    key = tmp_path / "log.key"
    for _ in range(2):
        procs = [_keygen(key, "none") for _ in range(4)]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, out + err
        assert _pair(key) == "matching"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["log.key", "log.key.pub"]
