"""A first keygen (no --force) of `bide-audit` or `govern` killed between its two files left the private key
without its .pub: a key every loader took (a lone private key has no .pub to be checked against) and a
later keygen refused as existing. The .pub is now written first: a keygen killed there leaves the .pub
alone, which nothing signs with. The process is SIGKILLed at the second exclusive link (an audit hook in a
wrapper process; nothing in bide or govern patched)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_WRAPPER = """
import os, signal, sys
links = []
def hook(event, args):
    if event == "os.link":
        links.append(args)
        if len(links) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
sys.addaudithook(hook)
{main}
"""
_MAINS = {
    "bide-audit": "from bide.audit._cli import main; sys.exit(main(['keygen', sys.argv[1]]))",
    "govern": "from govern.cli._main import main; sys.exit(main(['keygen', '-o', sys.argv[1]]))",
}
_LOADERS = {
    "bide-audit": "from bide.audit import load_signing_key; load_signing_key(sys.argv[1])",
    "govern": "from pathlib import Path; from govern.certificate._signing import load_private_key; "
    "load_private_key(Path(sys.argv[1]))",
}


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("tool", sorted(_MAINS))
def test_a_first_keygen_killed_between_its_two_files_leaves_no_private_key(tmp_path: Path, tool: str) -> None:
    key = tmp_path / "k"
    killed = _python(textwrap.dedent(_WRAPPER.format(main=_MAINS[tool])), str(key), cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not key.exists(), "a private key without its .pub was left"
    assert (tmp_path / "k.pub").exists()
    loaded = _python(f"import sys; {_LOADERS[tool]}", str(key), cwd=tmp_path)
    assert loaded.returncode != 0  # nothing signs with what is left
    # Once the lone .pub is removed, keygen writes a pair that loads.
    (tmp_path / "k.pub").unlink()
    again = _python(f"import sys; {_MAINS[tool]}", str(key), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert _python(f"import sys; {_LOADERS[tool]}", str(key), cwd=tmp_path).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["k", "k.pub"]
