"""Certificate size and offline check time for chain(n), the largest benchmark machine.

chain(n): n bool flags; invariant f_i -> f_(i+1), repaired by setting f_(i+1); events set_i; no pair
declared, so all n(n-1)/2 pairs are checked. Prints, per n: build time, certificate size on disk,
time to encode the certificate, best-of-3 time of `check_certificate` in-process (strict read,
digest, verdict recomputation, the extracted table checker and rules checker), and the wall time of
the `govern check` command on the file (process start and imports included).

Usage: python3 benchmarks/certificate.py [n ...]   (default: 12 16 20)

`chain20` at the top level is the benchmark machine committed in certs/ (tests/certify/regenerate.py).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from govern import Registry
from govern.certificate._certificate import check_certificate
from govern.certificate._make import certificate_for


def chain(n: int) -> Registry:
    """The chain(n) machine."""
    registry = Registry(f"chain{n}")
    flags = [registry.bool(f"f{i}") for i in range(n)]
    for i in range(n - 1):
        registry.invariant(f"f{i}_implies_f{i + 1}", holds=~flags[i] | flags[i + 1],
                           repair={flags[i + 1]: True})
    for i in range(n):
        registry.event(f"set{i}", effect={flags[i]: True})
    return registry


chain20 = chain(20)


def bench(n: int) -> None:
    t0 = time.perf_counter()
    machine = chain(n).build()
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    certificate = certificate_for(machine)
    data = certificate.to_bytes()
    encoded = time.perf_counter() - t0
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        result = check_certificate(data)
        best = min(best, time.perf_counter() - t0)
    assert result.rules_checked
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "cert.json"
        path.write_bytes(data)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "govern", "check", str(path)], check=True, capture_output=True)
        command = time.perf_counter() - t0
    raw = machine.n_states * (1 + 4 + 4 * len(machine.events))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"chain({n:2d}) states={machine.n_states:>9,d} events={len(machine.events):>3d} "
        f"build={built:6.2f}s encode={encoded:5.2f}s size={len(data) / 1e6:6.2f} MB "
        f"(raw tables {raw / 1e6:5.1f} MB) check={best:5.2f}s `govern check`={command:5.2f}s "
        f"peak_rss={peak:5.0f} MiB"
    )


def main(argv: list[str]) -> None:
    for n in [int(a) for a in argv] or [12, 16, 20]:
        bench(n)


if __name__ == "__main__":
    main(sys.argv[1:])
