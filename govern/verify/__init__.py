"""Verification: the tables over every state, WFC, CC1, CC2, obligations, reports and counterexamples.

Layer 2: the engine's own reading of a declared machine; the oracle re-checks what it concludes.
May import: govern._errors, govern.model.
"""
