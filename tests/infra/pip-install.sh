#!/usr/bin/env bash
# Install Python packages with whatever pip this machine has. Debian's system Python refuses
# plain installs (PEP 668); there we retry with --break-system-packages, as root on a CI machine.
set -euo pipefail
PY=${PYTHON:-python3}
if ! $PY -m pip --version >/dev/null 2>&1; then
  echo "pip is missing for $PY; installing it" >&2
  apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null
fi
if ! $PY -m pip install -q --disable-pip-version-check "$@" 2>/tmp/bide-pip.err; then
  if grep -q externally-managed /tmp/bide-pip.err; then
    $PY -m pip install -q --disable-pip-version-check --break-system-packages "$@"
  else
    cat /tmp/bide-pip.err >&2
    exit 1
  fi
fi
