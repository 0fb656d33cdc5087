"""`Machine.load` imports the module of a composed or symbolic machine file's loader when it meets that
format, so loading `govern.machine` does not import them."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from govern import MachineFileError
from govern.machine import _machine
from govern.machine._machine import FILE_FORMAT, Machine, write_machine_file


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_named_module_registers_its_format() -> None:
    for fmt, module in _machine._LOADER_MODULES.items():
        importlib.import_module(module)
        assert _machine._LOADERS[fmt].__module__ == module, fmt
    assert set(_machine._LOADERS) == set(_machine._LOADER_MODULES)


def test_loading_the_machine_module_imports_no_loader() -> None:
    loaded = python(
        "import sys, govern.machine._machine; "
        "print('govern.machine._composed' in sys.modules, 'govern.machine._symbolic' in sys.modules)"
    )
    assert loaded == "False False\n"


def test_a_symbolic_machine_file_loads_in_a_fresh_interpreter(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from symbolic_corpus import limits
    finally:
        sys.path.remove(str(Path(__file__).parent))
    path = tmp_path / "limits.govern"
    limits(False).build().save(path)
    loaded = python(f"import govern; print(type(govern.Machine.load({str(path)!r})).__name__)")
    assert loaded == "SymbolicMachine\n"


def test_an_unknown_format_is_refused_naming_every_format_read(tmp_path: Path) -> None:
    path = tmp_path / "odd.npz"
    write_machine_file(path, "govern.machine.odd.v9", {"x": np.zeros(1, dtype=np.uint8)})
    with pytest.raises(MachineFileError) as caught:
        Machine.load(path)
    for fmt in (FILE_FORMAT, *_machine._LOADER_MODULES):
        assert repr(fmt) in str(caught.value)
