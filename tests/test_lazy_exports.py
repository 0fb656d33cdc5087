"""The lazy re-exports of bide, bide.audit, bide.approvals and govern (one `bide._lazy.LazyExports` each):
every public name is its defining module's object under its public path, the `if TYPE_CHECKING:` imports
that type checkers read name the same modules, an unknown name is an AttributeError, and publishing the
names in the order most likely to break pydantic still leaves records and artifacts readable."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
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


def python(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (nothing imported yet)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def leaves_first(package: types.ModuleType) -> list[str]:
    """The package's submodules that define public names, each after every submodule of the package it
    imports when it is imported (read from the source: module-level `from .x import`)."""
    here = Path(package.__file__ or "").parent
    needs: dict[str, set[str]] = {}

    def closure(module: str) -> set[str]:
        if module not in needs:
            body = ast.parse((here / f"{module}.py").read_text()).body
            direct = {n.module for n in body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}
            needs[module] = set(direct)  # a cycle ends here
            for dependency in direct:
                needs[module] |= closure(dependency)
        return needs[module]

    return sorted(package._EXPORTS.table, key=lambda module: len(closure(module)))


def test_journal_records_decode_whichever_name_is_used_first() -> None:
    """A published class reports module `bide`: a pydantic schema built after that over it would resolve its
    annotations in `bide` and fail. Publishing leaves first (each class renamed before any submodule that
    imports it is loaded) must still leave journal records decodable."""
    order = leaves_first(bide)
    assert order.index("_messages") < order.index("_records")
    code = f"""
import bide
for module in {order!r}:
    getattr(bide, bide._SUBMODULE_NAMES[module][0])
call = bide.ToolCall(id="c", name="charge", arguments={{"cents": 5}})
turn = bide.ModelTurn(key="model:0", turn=0, message=bide.AssistantMessage(content="hi", tool_calls=[call]))
print(bide.decode_record("model:0", bide.encode_record(turn)) == turn)
"""
    assert python(code) == "True\n"


def test_artifacts_parse_whichever_name_is_used_first() -> None:
    """A published class reports module `bide.audit`: a pydantic schema built after that over it would
    resolve its annotations there and fail. Publishing leaves first (each class renamed before any submodule
    that imports it is loaded) must still leave the artifacts buildable and parseable."""
    order = leaves_first(bide.audit)
    assert order.index("_strict") < order.index("_formats") < order.index("_verify")
    code = f"""
import bide.audit as audit
for module in {order!r}:
    getattr(audit, audit._SUBMODULE_NAMES[module][0])
key = audit.SigningKey.generate()
record = b'{{"k":"run:start"}}'
root = audit.leaf_hash(audit.journal_leaf(record))
sth = audit.sign_head(key, "run-1", 1, root)
package = audit.EvidencePackage(sth=sth, records=[audit.EvidenceRecord(index=0, record=record, path=[])])
again = audit.parse_artifact(audit.EvidencePackage, package.to_json())
audit.check_head(again.sth, key.public)
print(again == package, type(again.sth).__module__)
"""
    assert python(code) == "True bide.audit\n"
