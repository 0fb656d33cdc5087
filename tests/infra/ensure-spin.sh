#!/usr/bin/env bash
# The protocol models in tests/protocols/ are checked by SPIN, whose verifiers are C programs: SPIN and a
# C compiler come from Debian when missing.
set -euo pipefail
if command -v spin >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1; then exit 0; fi
echo "spin or gcc not found; installing Debian's spin and gcc packages" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq spin gcc >/dev/null
