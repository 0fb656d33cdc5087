"""The built machine: `Registry` (declare, then `build()`), the build pipeline and `Machine` itself.

Layer 3: `build()` runs verification and the oracle gate and returns a `Machine` whose every
transition is one table lookup; nothing here is specific to certificates or to running replicas.
May import: govern._errors, govern.model, govern.verify, govern.oracle.
"""

# Imported with the package, not on demand: importing them registers the loaders `Machine.load` needs for
# composed and symbolic machine files, whichever govern module is the first to load a machine.
from . import _composed, _symbolic  # noqa: F401
