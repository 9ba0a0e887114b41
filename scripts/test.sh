#!/usr/bin/env bash
# The test suite: install, start Redis and MariaDB if needed, run every test against them; then, with no
# arguments, the mysqlclient lane (below).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
# The browser test runs, never skips: services.sh installed Chromium.
export FENCED_REQUIRE_BROWSER=1
export FENCED_REQUIRE_EXTRAS=1  # the pydantic-ai and OpenAI Agents SDK tests fail, not skip, without their extras
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q "$@"
fi
.venv/bin/python -m pytest -q
# The mysqlclient lane: the store's transactions (the one-trip queries, fencing, retries after a lost
# reply), money, submission, cancel, inline steps and recovery on real workers again, through the C driver
# (FENCED_DB_URL=mysql+mysqldb://...) that setup.sh builds where it can, and the benchmark's driver-level
# counters. Everything above ran on PyMySQL.
# FENCED_REQUIRE_MYSQLCLIENT=1 (CI) fails when setup.sh could not build it; otherwise the lane says it
# did not run.
if ! .venv/bin/python -c "import MySQLdb" 2>/dev/null; then
  if [ "${FENCED_REQUIRE_MYSQLCLIENT:-0}" = 1 ]; then
    echo "test.sh: mysqlclient is not installed (setup.sh could not build it) and FENCED_REQUIRE_MYSQLCLIENT=1" >&2
    exit 1
  fi
  echo "test.sh: mysqlclient is not installed: its lane did NOT run (PyMySQL only)" >&2
  exit 0
fi
FENCED_TEST_MYSQL_URL=mysql+mysqldb://root@127.0.0.1:3306/fenced_test .venv/bin/python -m pytest -q \
  tests/test_terminal_one_trip.py tests/test_step_done_claim.py tests/test_store.py \
  tests/test_delivery_roundtrips.py tests/test_history.py tests/test_money.py tests/test_accounts.py \
  tests/test_transitions.py tests/test_epoch_check.py tests/test_submit_many.py tests/test_cancel.py \
  tests/test_inline_steps.py tests/test_recovery.py tests/test_claim_one_trip.py tests/test_submit_one_trip.py \
  tests/test_bench.py::test_the_round_trip_counter_counts_what_it_says \
  tests/test_bench.py::test_the_blob_byte_counter_counts_what_the_driver_sends
