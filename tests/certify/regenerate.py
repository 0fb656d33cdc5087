"""Regenerate the committed certificates in certs/ (and list what they should be, for the staleness test).

    python3 tests/certify/regenerate.py          # rewrite every certificate in certs/
    python3 tests/certify/regenerate.py --check  # exit 1 if any is missing or stale, write nothing

Every Registry defined at the top level of a file in examples/ that converges gets a certificate:
certs/NAME.govern-cert.json when the file is NAME.py, certs/FILE-NAME.govern-cert.json otherwise;
so does every benchmark machine listed in BENCHMARKS below (certs/NAME.govern-cert.json). A machine
that does not converge (an example of a rejected machine) gets none.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CERTS = ROOT / "certs"
EXAMPLES = ROOT / "examples"
SUFFIX = ".govern-cert.json"

#: Benchmark machines small enough to commit: (file, registry attribute) pairs under the repository.
BENCHMARKS: list[tuple[str, str]] = [("benchmarks/certificate.py", "chain20")]


def expected_certificates() -> tuple[dict[str, bytes], list[str]]:
    """The certificate bytes every certified machine should have in certs/, by file name, and the
    names of example machines that do not converge (and so have no certificate)."""
    from govern._errors import NotConvergent
    from govern.certificate._make import certify
    from govern.cli._main import Target, load_targets

    targets: list[tuple[str, Target]] = []
    for source in sorted(EXAMPLES.glob("*.py")):
        try:
            found = load_targets(str(source))
        except Exception as exc:
            if "no Registry" in str(exc):
                continue  # an example of something else (for instance the bide agents)
            raise
        for target in found:
            name = target.registry.name
            targets.append((name if name == source.stem else f"{source.stem}-{name}", target))
    for relative, attribute in BENCHMARKS:
        targets.extend((t.registry.name, t) for t in load_targets(f"{ROOT / relative}:{attribute}"))
    expected: dict[str, bytes] = {}
    rejected: list[str] = []
    for stem, target in targets:
        try:
            certificate = certify(target.registry)
        except NotConvergent:
            rejected.append(stem)
            continue
        name = stem + SUFFIX
        if name in expected:
            raise SystemExit(f"two machines would both be certified as certs/{name}")
        expected[name] = certificate.to_bytes()
    return expected, rejected


def main(argv: list[str]) -> int:
    expected, rejected = expected_certificates()
    present = {p.name for p in CERTS.glob("*" + SUFFIX)}
    stale = sorted(
        n for n, data in expected.items() if not (CERTS / n).is_file() or (CERTS / n).read_bytes() != data
    )
    orphans = sorted(present - set(expected))
    if "--check" in argv:
        for name in stale:
            print(f"stale or missing: certs/{name}")
        for name in orphans:
            print(f"no machine for: certs/{name}")
        return 1 if stale or orphans else 0
    from govern.cli._main import write_atomically

    for name in stale:
        write_atomically(CERTS / name, expected[name])
        print(f"wrote certs/{name}")
    for name in orphans:
        (CERTS / name).unlink()
        print(f"removed certs/{name} (no such machine any more)")
    for name in rejected:
        print(f"no certificate for {name}: it does not converge")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
