"""Certificates: the format, its byte-exact encodings, signing, making one from a machine, checking.

Layer 4: checking reads only a certificate's bytes (never engine objects); making one reads a `Machine`.
May import: govern._errors, govern.model, govern.verify, govern.oracle, govern.machine.
"""
