"""Lazy re-exports for a package's `__init__` (PEP 562): bide, bide.audit, bide.approvals and govern use it.

A package lists where each public name is defined (submodule -> names). Importing the package loads none
of those submodules; the first use of a name imports the one that defines it and binds all of its public
names in the package, so later uses are plain lookups. Classes and functions defined in a private module
under the package report the package as their module (bide.Agent, not bide._agent.Agent), in reprs and
tracebacks, from the moment they are published.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LazyExports"]


class LazyExports:
    """The lazy public names `public` of package `package`, bound into its namespace `namespace` as they load.

    `table` maps each submodule (relative, e.g. "_agent" or "machine._registry") to the public names it
    defines; `renamed` maps a public name to its name in the submodule where they differ; `import_first`
    maps a submodule to one that must be imported before it (an import-order constraint of its own)."""

    def __init__(
        self,
        package: str,
        namespace: dict[str, Any],
        public: Iterable[str],
        table: Mapping[str, tuple[str, ...]],
        *,
        renamed: Mapping[str, str] | None = None,
        import_first: Mapping[str, str] | None = None,
    ) -> None:
        self.package = package
        self.namespace = namespace
        self.public = tuple(public)
        self.table = table
        self.module_of = {name: module for module, names in table.items() for name in names}
        self.renamed = dict(renamed or {})
        self.import_first = dict(import_first or {})

    def publish(self, submodule: str) -> None:
        """Import `submodule` and bind every public name it defines in the package."""
        first = self.import_first.get(submodule)
        if first is not None:
            importlib.import_module(f"{self.package}.{first}")
        module = importlib.import_module(f"{self.package}.{submodule}")
        for name in self.table[submodule]:
            obj = getattr(module, self.renamed.get(name, name))
            if isinstance(obj, (type, types.FunctionType)):
                self._rename(obj)
            self.namespace[name] = obj

    def _rename(self, obj: Any) -> None:
        """Make `obj` report the package as its module when it is defined in a private module below it."""
        module = getattr(obj, "__module__", None)
        prefix = f"{self.package}."
        if not isinstance(module, str) or not module.startswith(prefix):
            return
        if any(part.startswith("_") for part in module[len(prefix) :].split(".")):
            obj.__module__ = self.package

    def load(self, name: str) -> object:
        """The package's `__getattr__`: a public name not loaded yet, loaded now."""
        submodule = self.module_of.get(name)
        if submodule is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        self.publish(submodule)
        return self.namespace[name]

    def names(self) -> list[str]:
        """The package's `__dir__`: the names loaded so far and every public one."""
        return sorted({*self.namespace, *self.public})
