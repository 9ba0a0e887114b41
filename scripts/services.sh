#!/usr/bin/env bash
# Start Redis, MariaDB and PostgreSQL (the benchmark's DBOS peer) if they are not running, installing
# them (and Chromium for the browser test) with apt-get where missing, and create the test database.
# Safe to run again.
set -euo pipefail

need_apt=()
command -v redis-server >/dev/null || need_apt+=(redis-server)
# Debian's Sentinel (scripts/redis-sentinel.sh starts its own on private ports for tests/test_sentinel.py).
command -v redis-sentinel >/dev/null || need_apt+=(redis-sentinel)
command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
ls /etc/postgresql/*/main >/dev/null 2>&1 || need_apt+=(postgresql)
# The dashboard's browser test drives Debian's Chromium through Selenium (browser downloads by
# Playwright's installer do not work here).
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  # Where the package's own service started (no policy-rc.d forbidding it), stop it: a sentinel on 26379
  # watching the shared 6379 is nobody's.
  if [[ " ${need_apt[*]} " == *" redis-sentinel "* ]]; then service redis-sentinel stop >/dev/null 2>&1 || true; fi
fi

# tests/test_docker.py validates docker/compose.yml with Debian's docker-compose (1.29, needs no Docker
# engine for `config`); its recommended docker.io engine is not wanted here.
if ! command -v docker-compose >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting redis-server"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi

if ! mysqladmin -uroot -h127.0.0.1 ping >/dev/null 2>&1; then
  echo "starting mariadbd"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
fi

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting postgresql"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi

for _ in $(seq 1 60); do
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && mysqladmin -uroot -h127.0.0.1 ping >/dev/null 2>&1 && break
  sleep 1
done
redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null
for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
pg_isready -h 127.0.0.1 -p 5432 -q || echo "warning: PostgreSQL is not answering; the benchmark smoke test will fail"
mysql -uroot -h127.0.0.1 -e "CREATE DATABASE IF NOT EXISTS fenced_test; CREATE DATABASE IF NOT EXISTS test"
echo "services ready: redis 127.0.0.1:6379, mariadb 127.0.0.1:3306 (database fenced_test), postgresql 127.0.0.1:5432"
