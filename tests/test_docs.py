"""Every ```python block in docs/*.md runs, in order, one fresh namespace per file.

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


@pytest.mark.parametrize("doc", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_doc_examples_run(doc: Path, tmp_path: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{doc.stem}"}
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for index, block in enumerate(_blocks(doc)):
            code = compile(block, f"{doc.name}[block {index}]", "exec")
            exec(code, namespace)
    finally:
        os.chdir(here)
