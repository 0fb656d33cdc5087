"""The built machine: `Registry` (declare, then `build()`), the build pipeline and `Machine` itself.

Layer 3: `build()` runs verification and the oracle gate and returns a `Machine` whose every
transition is one table lookup; nothing here is specific to certificates or to running replicas.
May import: govern._errors, govern.model, govern.verify, govern.oracle.
"""
