#!/usr/bin/env bash
# Create .venv and install fenced (with its test, benchmark, gevent, pydantic-ai and openai-agents extras) into it. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The runtime dependencies at the versions docker/requirements.txt pins (docker/lock.py): the tests run on
# what the image installs.
.venv/bin/python -m pip install -q -c docker/requirements.txt -e ".[test,bench,gevent,pydantic-ai,openai-agents]"
# Optional C speedups (the `fast` extra: mysqlclient for FENCED_DB_URL=mysql+mysqldb://..., hiredis): mysqlclient
# builds against Debian's default-libmysqlclient-dev with pkg-config, installed here when this runs as root
# with apt; without them only hiredis is installed and mysql+pymysql:// (the default) is what works.
if ! pkg-config --exists mysqlclient 2>/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q default-libmysqlclient-dev pkg-config >/dev/null 2>&1 || true
fi
if ! .venv/bin/python -m pip install -q -c docker/requirements.txt -e ".[fast]" 2>/dev/null; then
  echo "setup: mysqlclient could not be built (no default-libmysqlclient-dev?); PyMySQL (mysql+pymysql://) stays the driver" >&2
  .venv/bin/python -m pip install -q -c docker/requirements.txt "hiredis>=3"
fi
