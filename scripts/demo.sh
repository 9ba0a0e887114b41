#!/usr/bin/env bash
# The main job: install, then `fenced demo` (embedded redis-server + SQLite unless FENCED_* say otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/fenced demo "$@"
