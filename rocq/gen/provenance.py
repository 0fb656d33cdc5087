#!/usr/bin/env python3
"""Write govern/oracle/PROVENANCE: the Coq version and SHA-256 of every file a verdict trusts: the
proof sources, the JSON extraction, the generated module, the generator, the numpy primitives, the
front end and the axiom gate.  Deterministic (sorted, no timestamps).

Usage: provenance.py OUTPUT COQ_VERSION THEOREMS JSON GENERATED GENERATOR PRIMS FRONTEND GATE SOURCE...
"""

from __future__ import annotations

import hashlib
import os
import sys


def sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def main(argv: list[str]) -> int:
    out, coq, theorems, js, gen, generator, prims, frontend, gate, *sources = argv
    proof = hashlib.sha256()
    for src in sorted(sources):
        proof.update(os.path.basename(src).encode() + b"\0" + sha(src).encode() + b"\n")
    lines = [
        "# Written by rocq/gen/provenance.py during `make -C rocq check`; never edit by hand.",
        f"coq_version={coq}",
        f"theorems={theorems}",
        f"proof_sha256={proof.hexdigest()}",
        *[f"source.{os.path.basename(s)}={sha(s)}" for s in sorted(sources)],
        f"json_sha256={sha(js)}",
        f"generated_sha256={sha(gen)}",
        f"generator_sha256={sha(generator)}",
        f"prims_sha256={sha(prims)}",
        f"frontend_sha256={sha(frontend)}",
        f"axiom_gate_sha256={sha(gate)}",
    ]
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
