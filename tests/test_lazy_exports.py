"""The lazy re-exports of bide, bide.audit, bide.approvals and govern (one `bide._lazy.LazyExports` each):
every public name is its defining module's object under its public path, the `if TYPE_CHECKING:` imports
that type checkers read name the same modules, and an unknown name is an AttributeError."""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import bide
import bide.approvals
import bide.audit
import govern

PACKAGES = [bide, bide.audit, bide.approvals, govern]
by_package = pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)


@by_package
def test_every_public_name_is_its_defining_modules_object(package: types.ModuleType) -> None:
    exports = package._EXPORTS
    assert sorted(exports.module_of) == sorted(package.__all__)
    for name in package.__all__:
        module = importlib.import_module(f"{package.__name__}.{exports.module_of[name]}")
        obj = getattr(package, name)
        assert obj is getattr(module, exports.renamed.get(name, name)), name
        if isinstance(obj, (type, types.FunctionType)):  # its public path, never a private module's
            assert not obj.__module__.startswith(f"{package.__name__}."), (name, obj.__module__)
    assert set(package.__all__) <= set(dir(package))


@by_package
def test_type_checkers_see_the_names_the_loader_knows(package: types.ModuleType) -> None:
    """The `if TYPE_CHECKING:` imports (what mypy and IDEs read) say what the table `__getattr__` reads."""
    assert package.__file__ is not None
    tree = ast.parse(Path(package.__file__).read_text())
    block = next(
        node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    )
    imported = {
        alias.asname or alias.name: (node.module or "").lstrip(".")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == package._EXPORTS.module_of


@by_package
def test_unknown_names_still_raise_attribute_error(package: types.ModuleType) -> None:
    assert not hasattr(package, "Agnet")
    with pytest.raises(AttributeError, match="has no attribute 'Agnet'"):
        package.Agnet  # noqa: B018
