#!/usr/bin/env python3
"""Axiom gate: `Print Assumptions` on every headline theorem must print "Closed under the global context".

Usage: gate.py COQC BUILD_DIR THEOREM...
(run from rocq/; theorems fully qualified, e.g. Govern.TableCheck.check_tables_sound)
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    coqc, build, *theorems = argv
    modules = sorted({t.rsplit(".", 1)[0] for t in theorems})
    lines = [f"Require {m}." for m in modules]
    for t in theorems:
        lines.append(f'Redirect "{build}/gate_{t}" Print Assumptions {t}.')
    src = os.path.join(build, "Gate.v")
    with open(src, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    res = subprocess.run([coqc, "-Q", "theories", "Govern", src], capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout + res.stderr, file=sys.stderr)
        print("axiom gate: Gate.v failed to compile", file=sys.stderr)
        return 1
    bad = []
    for t in theorems:
        with open(os.path.join(build, f"gate_{t}.out"), encoding="utf-8") as fh:
            text = fh.read()
        if text.strip() != "Closed under the global context" or "Axiom" in text or "admit" in text:
            bad.append((t, text.strip()))
    for t, text in bad:
        print(f"axiom gate: {t} is NOT closed:\n{text}", file=sys.stderr)
    if bad:
        return 1
    print(f"axiom gate: all {len(theorems)} headline theorems are Closed under the global context")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
