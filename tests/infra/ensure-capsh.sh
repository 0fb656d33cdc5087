#!/usr/bin/env bash
# Tests that check what a user without root's reach gets (a store file or directory it may not open) run
# their command as root without the capabilities that bypass file permissions: `capsh`, from Debian's
# libcap2-bin, installed when missing.
set -euo pipefail
if command -v capsh >/dev/null 2>&1; then exit 0; fi
echo "capsh not found; installing Debian's libcap2-bin package" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libcap2-bin >/dev/null
