#!/usr/bin/env bash
# The Rocq development is compiled and re-extracted by `make test`; Coq comes from Debian.
set -euo pipefail
if command -v coqc >/dev/null 2>&1; then exit 0; fi
echo "coqc not found; installing Debian's coq package" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq coq >/dev/null
