"""The command lines start without the libraries they do not need: `--help` and a usage error (exit 2) of
`govern`, `bide` and `bide-audit` import no store driver, key library or array library, each command
importing what it uses when it runs. Checked in a fresh interpreter, where nothing is imported yet."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The console scripts' entry modules (pyproject.toml [project.scripts]).
ENTRY = {"govern": "govern.cli", "bide": "bide._cli", "bide-audit": "bide.audit._cli"}
# What no --help needs: SQLAlchemy, cryptography, numpy, pydantic, and the modules of bide that load them.
HEAVY = ("sqlalchemy", "cryptography", "numpy", "pydantic")
BIDE_HEAVY = ("bide._open", "bide._sql", "bide._agent", "bide._worker", "bide._cancel")


def loaded_by(prog: str, *argv: str) -> tuple[int, set[str]]:
    """The exit code of `prog argv` run through its entry point's `main`, and the modules it imported."""
    code = (
        "import contextlib, io, json, sys\n"
        f"from {ENTRY[prog]} import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        f"        status = main({list(argv)!r})\n"
        "    except SystemExit as exc:\n"
        "        status = exc.code\n"
        "print(json.dumps([status, sorted(sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, modules = json.loads(done.stdout)
    return status, set(modules)


@pytest.mark.parametrize("argv", [("--help",), ("check", "--help"), ("certfy", "x.py"), ("check",)])
def test_govern_help_and_usage_errors_import_no_certificate_library(argv: tuple[str, ...]) -> None:
    status, modules = loaded_by("govern", *argv)
    assert status == (0 if "--help" in argv else 2)
    assert modules.isdisjoint((*HEAVY, "rich", "govern.machine", "govern.certificate._certificate"))


@pytest.mark.parametrize("argv", [("--help",), ("resolve", "--help"), ("runs", "--status", "nosuch")])
def test_bide_help_and_usage_errors_import_no_store_or_agent(argv: tuple[str, ...]) -> None:
    status, modules = loaded_by("bide", *argv)
    assert status == (0 if "--help" in argv else 2)
    assert modules.isdisjoint(BIDE_HEAVY)


@pytest.mark.parametrize("prog", ["bide", "bide-audit"])
def test_bide_help_imports_no_heavy_library(prog: str) -> None:
    status, modules = loaded_by(prog, "--help")
    assert status == 0
    assert modules.isdisjoint(HEAVY)


def test_the_defaults_help_shows_are_the_libraries_own() -> None:
    """The CLIs write these defaults out rather than import them for --help; they must be the same."""
    from bide.audit import _cli as audit_cli
    from bide.audit._strict import MAX_INPUT_BYTES
    from govern.certificate._checked import MAX_CLOCK_SKEW
    from govern.certificate._encoding import DEFAULT_MAX_BYTES
    from govern.cli import _main as govern_cli

    assert govern_cli.MAX_CLOCK_SKEW == MAX_CLOCK_SKEW
    assert govern_cli.DEFAULT_MAX_BYTES == DEFAULT_MAX_BYTES
    assert audit_cli.MAX_INPUT_BYTES == MAX_INPUT_BYTES
