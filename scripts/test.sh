#!/usr/bin/env bash
# The test suite: install, start Redis and MariaDB if needed, run every test against them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
exec .venv/bin/python -m pytest -q "$@"
