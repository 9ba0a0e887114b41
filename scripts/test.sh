#!/usr/bin/env bash
# The test suite: install, start Redis and MariaDB if needed, run every test against them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
# The browser test runs, never skips: services.sh installed Chromium.
export FENCED_REQUIRE_BROWSER=1
export FENCED_REQUIRE_EXTRAS=1  # the pydantic-ai and OpenAI Agents SDK tests fail, not skip, without their extras
exec .venv/bin/python -m pytest -q "$@"
