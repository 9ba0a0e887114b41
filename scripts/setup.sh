#!/usr/bin/env bash
# Create .venv and install fenced (with its test, benchmark and pydantic-ai extras) into it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The runtime dependencies at the versions docker/requirements.txt pins (docker/lock.py): the tests run on
# what the image installs.
.venv/bin/python -m pip install -q -c docker/requirements.txt -e ".[test,bench,pydantic-ai]"
