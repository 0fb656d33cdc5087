"""Every ```python block in docs/*.md runs, in order, one fresh namespace per file; and every file runs
twice in a row in the same working directory, as a reader who follows a guide again would (files the
first run left behind must not break the second).

A block fenced as ```python no-run is shown to readers but not executed (for example, code that needs
a real API key). The working directory is a temporary folder, so files a guide writes do not land in
the checkout.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks(path: Path) -> list[str]:
    return [body for info, body in _BLOCK.findall(path.read_text()) if "no-run" not in info]


def _run_doc(doc: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{doc.stem}"}
    for index, block in enumerate(_blocks(doc)):
        code = compile(block, f"{doc.name}[block {index}]", "exec")
        exec(code, namespace)


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_doc_examples_run_twice(doc: Path, tmp_path: Path) -> None:
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        _run_doc(doc)
        _run_doc(doc)
    finally:
        os.chdir(here)


def test_readme_example_runs_twice(tmp_path: Path) -> None:
    readme = DOCS.parent / "README.md"
    [example] = _blocks(readme)
    assert len(example.strip().splitlines()) <= 15  # the first screen's example stays short
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        _run_doc(readme)
        _run_doc(readme)
    finally:
        os.chdir(here)

