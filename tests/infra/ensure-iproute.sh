#!/usr/bin/env bash
# The silent-network tests (tests/test_pg_silent_network.py) cut a real network path: a network namespace
# joined by a veth pair, made with `ip` from Debian's iproute2 when missing.
set -euo pipefail
if command -v ip >/dev/null 2>&1; then exit 0; fi
echo "ip not found; installing Debian's iproute2 package" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null
