"""Ctrl-C late in `bide-audit export`: whatever the interrupt lands in, the command exits 130 (or, once its
outcome is being printed, prints it whole) and says whether the output was written; never an internal error
or a traceback. The SIGINT is sent by the child process itself at the moment under test (a patched function),
so that it lands there on every run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bide

from .conftest import write_run

pytestmark = pytest.mark.slow

# Runs `bide-audit export` (as the console script does: argv from the command line) after `PATCH`, which
# sets up where the interrupt lands. `interrupt()` is what a Ctrl-C does: a SIGINT to the process, or (mode
# "raise") a KeyboardInterrupt raised right there, as a signal handler of Python's raises it.
_CHILD = """
import os, signal, sys
MODE = sys.argv.pop(1)

def interrupt():
    if MODE == "raise":
        raise KeyboardInterrupt
    os.kill(os.getpid(), signal.SIGINT)

{patch}

from bide.audit._cli import main
main()
"""

# Interrupt inside pydantic's serializer of the artifact: in the 50th base64 encoding of a record's bytes.
_IN_THE_SERIALIZER = """
import base64
encode = base64.b64encode
calls = []

def b64encode(data, *args):
    if sys._getframe(1).f_code.co_name == "b64":  # bide.audit._strict.b64, which pydantic calls
        calls.append(1)
        if len(calls) == 50:
            interrupt()
    return encode(data, *args)

base64.b64encode = b64encode
"""

# Interrupt once the output was renamed into place (while its directory is synced).
_AFTER_THE_RENAME = """
import bide._files as files
sync = files.sync_directory

def sync_directory(path):
    sync(path)
    interrupt()

files.sync_directory = sync_directory
"""

# Interrupt while the outcome ("Wrote ...") is being printed.
_WHILE_PRINTING = """
import bide.audit._cli as cli
printable = cli.printable

def printing(text):
    if text.startswith("Wrote "):
        interrupt()
    return printable(text)

cli.printable = printing
"""


def _export(tmp_path: Path, patch: str, mode: str, *more: str) -> subprocess.CompletedProcess[str]:
    """`bide-audit export` of run "r" to out.json (which holds b"PREVIOUS" before), interrupted by `patch`."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    if not (tmp_path / "runs.db").exists():
        store = bide.open_store(url)
        try:
            write_run(store, "r", 120)
        finally:
            store.close()
        keygen = [sys.executable, "-m", "bide.audit._cli", "keygen", "log.key"]
        assert subprocess.run(keygen, cwd=tmp_path, capture_output=True).returncode == 0
    (tmp_path / "out.json").write_bytes(b"PREVIOUS")
    code = _CHILD.format(patch=textwrap.dedent(patch))
    args = ["export", "--store", url, "--run", "r", "--key", "log.key", "-o", "out.json", *more]
    return subprocess.run(
        [sys.executable, "-c", code, mode, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("mode", ["signal", "raise"])
def test_an_interrupt_while_the_artifact_is_serialized_is_exit_130_not_an_internal_error(
    tmp_path: Path, mode: str
) -> None:
    done = _export(tmp_path, _IN_THE_SERIALIZER, mode)
    assert done.returncode == 130, done.stderr
    assert done.stderr.startswith("INTERRUPTED: ") and "Traceback" not in done.stderr, done.stderr
    assert "out.json was not written" in done.stderr, done.stderr
    assert (tmp_path / "out.json").read_bytes() == b"PREVIOUS"
    as_json = _export(tmp_path, _IN_THE_SERIALIZER, mode, "--json")
    doc = json.loads(as_json.stdout)
    assert (as_json.returncode, doc["exit_code"], doc["reason"]) == (130, 130, "interrupted"), doc


def test_an_interrupt_once_the_output_was_renamed_says_it_was_written_whole(tmp_path: Path) -> None:
    done = _export(tmp_path, _AFTER_THE_RENAME, "signal")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "out.json was written: it holds the export, whole" in done.stderr, done.stderr
    assert "half-written" not in done.stderr, done.stderr
    assert json.loads((tmp_path / "out.json").read_bytes())["records"], "the output is the whole export"


def test_an_interrupt_while_the_outcome_is_printed_leaves_it_printed_whole(tmp_path: Path) -> None:
    done = _export(tmp_path, _WHILE_PRINTING, "signal")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Wrote an evidence package") and "Nothing was verified" in done.stdout
    assert json.loads((tmp_path / "out.json").read_bytes())["records"]
