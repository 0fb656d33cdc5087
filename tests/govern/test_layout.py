"""govern's layering, read from the source: no import cycles, no import up a layer, small folders.

Every subpackage's docstring has a line `May import: govern.x, govern.y.`; a module may import its own
package and exactly those. Imports inside `if TYPE_CHECKING:` are annotations only and do not count;
imports inside functions do (they run).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

GOVERN = Path(__file__).resolve().parents[2] / "govern"
MAX_MODULES_PER_FOLDER = 15


def module_name(path: Path) -> str:
    parts = path.relative_to(GOVERN.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(module: str) -> bool:
    base = GOVERN.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def govern_targets(path: Path, here: str | None = None) -> set[str]:
    """The govern modules a file (the module `here`, by default its own name) imports when it runs."""
    here = here or module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    targets: set[str] = set()
    for node in runtime_imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.split(".")[0] == "govern")
            continue
        if node.level:
            base_parts = package.split(".")
            base_parts = base_parts[: len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if base.split(".")[0] != "govern":
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            targets.add(sub if exists(sub) else base)
    targets.discard(here)
    return targets


def import_graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for path in sorted(GOVERN.rglob("*.py")):
        graph.add_node(module_name(path))
        for target in govern_targets(path):
            graph.add_edge(module_name(path), target)
    return graph


PACKAGES = sorted(f"govern.{d.name}" for d in GOVERN.iterdir() if (d / "__init__.py").is_file())


def unit(module: str) -> str:
    """The layering unit a module belongs to: its subpackage, or itself for top-level modules."""
    parts = module.split(".")
    if len(parts) >= 2 and (GOVERN / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def allowed_imports(package: str) -> set[str]:
    init = GOVERN.parent / package.replace(".", "/") / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    match = re.search(r"May import:(.*?)\.\s*$", doc or "", re.S | re.M)
    assert match, f"{package}/__init__.py's docstring must say what it may import ('May import: ...')"
    return {name.strip() for name in match.group(1).replace("\n", " ").split(",") if name.strip()}


def test_no_import_cycles() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"import cycles in govern: {cycles}"


def test_every_import_goes_down_a_layer() -> None:
    graph = import_graph()
    allowed = {p: allowed_imports(p) | {p} for p in PACKAGES}
    allowed["govern._errors"] = {"govern._errors"}
    wrong = [
        f"{source} imports {target}"
        for source, target in graph.edges
        if unit(source) in allowed and unit(target) != "govern" and unit(target) not in allowed[unit(source)]
    ]
    assert wrong == []


def test_the_layers_are_the_documented_ones() -> None:
    layers = ("model", "verify", "oracle", "machine", "certificate", "runtime", "cli")
    assert [f"govern.{p}" for p in sorted(layers)] == PACKAGES


def test_may_import_lines_name_real_lower_packages() -> None:
    """The declared layers form a strict order: no package may import one that may import it."""
    declared = nx.DiGraph()
    for p in PACKAGES:
        for q in allowed_imports(p):
            assert q == "govern._errors" or q in PACKAGES, f"{p} names unknown package {q}"
            declared.add_edge(p, q)
    assert nx.is_directed_acyclic_graph(declared)


@pytest.mark.parametrize("folder", sorted({p.parent for p in GOVERN.rglob("*.py")}), ids=str)
def test_folders_stay_small(folder: Path) -> None:
    assert len(list(folder.glob("*.py"))) <= MAX_MODULES_PER_FOLDER


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The reader is not vacuous: an import inside a function is found, one under TYPE_CHECKING is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..runtime._replica import Replica\n"
        "def f():\n    from ..cli import main\n"
    )
    probe = tmp_path / "_probe.py"
    probe.write_text(source)
    assert govern_targets(probe, here="govern.model._probe") == {"govern.cli"}
