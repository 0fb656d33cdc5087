#!/usr/bin/env bash
# Create the project's virtual environment ($1, default .venv) with bide installed in it (editable), so
# `make demo` never installs into the system Python. Re-installs only when pyproject.toml changed.
set -euo pipefail
VENV=${1:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  if ! $PY -m venv "$VENV" 2>/tmp/bide-venv.err; then
    # Debian ships venv without ensurepip unless python3-venv is installed.
    if grep -qi "ensurepip\|python3-venv" /tmp/bide-venv.err; then
      echo "the venv module needs python3-venv; installing it" >&2
      rm -rf "$VENV"
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      $PY -m venv "$VENV"
    else
      cat /tmp/bide-venv.err >&2
      exit 1
    fi
  fi
fi
if [ ! -f "$VENV/.bide-installed" ] || [ pyproject.toml -nt "$VENV/.bide-installed" ]; then
  echo "installing bide into $VENV (once)" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e .
  touch "$VENV/.bide-installed"
fi
