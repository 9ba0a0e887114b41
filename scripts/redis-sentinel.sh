#!/usr/bin/env bash
# A local Redis Sentinel deployment for tests and `fenced chaos --sentinel`: a primary, one replica and
# three sentinels on local ports, with short failure detection so a failover takes seconds.
#
#   scripts/redis-sentinel.sh start    start what is not running; wait until every sentinel names the
#                                      same master, sees the other two and a linked replica
#   scripts/redis-sentinel.sh stop     shut down the five processes (by port, nothing else)
#   scripts/redis-sentinel.sh status   each server's role and each sentinel's master
#   scripts/redis-sentinel.sh urls     the FENCED_* lines that point fenced at it
#
# Safe to run again. After a failover `start` brings a dead server back as a replica of the current
# master (never as a second, empty master). Persistence is off: Redis holds only what fenced may lose
# (leases, epoch mirrors, events, the queue); the run rows in the database decide. The trade-off of
# no persistence under Sentinel (a primary restarted empty faster than down-after-milliseconds is
# synced from by its replica) is in docs/redis-sentinel.md.
#
# Ports and names (environment): FENCED_SENTINEL_PRIMARY_PORT (6411), FENCED_SENTINEL_REPLICA_PORT
# (6412), FENCED_SENTINEL_PORTS ("26411 26412 26413"), FENCED_SENTINEL_MASTER (fenced),
# FENCED_SENTINEL_DOWN_AFTER_MS (1000), FENCED_SENTINEL_FAILOVER_TIMEOUT_MS (3000),
# FENCED_SENTINEL_DIR (.fenced/sentinel under the repository: configs, logs, pid files).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PRIMARY_PORT="${FENCED_SENTINEL_PRIMARY_PORT:-6411}"
REPLICA_PORT="${FENCED_SENTINEL_REPLICA_PORT:-6412}"
read -r -a SENTINEL_PORTS <<< "${FENCED_SENTINEL_PORTS:-26411 26412 26413}"
MASTER="${FENCED_SENTINEL_MASTER:-fenced}"
DOWN_AFTER_MS="${FENCED_SENTINEL_DOWN_AFTER_MS:-1000}"
FAILOVER_TIMEOUT_MS="${FENCED_SENTINEL_FAILOVER_TIMEOUT_MS:-3000}"
DIR="${FENCED_SENTINEL_DIR:-$ROOT/.fenced/sentinel}"
QUORUM=2
HOST=127.0.0.1

cli() { redis-cli -h "$HOST" -p "$1" "${@:2}" 2>/dev/null; }
up() { [ "$(cli "$1" ping)" = "PONG" ]; }
role() { cli "$1" info replication | tr -d '\r' | sed -n 's/^role://p'; }

run_sentinel() {  # config file
  # Debian's redis-sentinel package (scripts/services.sh installs it); `redis-server <config> --sentinel`
  # is the same binary in sentinel mode, for a machine without the package (the config file must come
  # first: after --sentinel it would be read as a "sentinel <path>" directive).
  if command -v redis-sentinel >/dev/null; then redis-sentinel "$1"; else redis-server "$1" --sentinel; fi
}

current_master_port() {
  # The master the running sentinels agree on, else the running server that says it is a master.
  local port addr
  for port in "${SENTINEL_PORTS[@]}"; do
    addr="$(cli "$port" sentinel get-master-addr-by-name "$MASTER" | tail -1)"
    if [ -n "$addr" ] && up "$addr"; then echo "$addr"; return; fi
  done
  for port in "$PRIMARY_PORT" "$REPLICA_PORT"; do
    if up "$port" && [ "$(role "$port")" = "master" ]; then echo "$port"; return; fi
  done
}

start_redis() {  # port [master port]
  local port="$1" master="${2:-}"
  local args=(--port "$port" --bind "$HOST" --daemonize yes --save "" --appendonly no
              --dir "$DIR" --dbfilename "dump-$port.rdb" --logfile "$DIR/redis-$port.log"
              --pidfile "$DIR/redis-$port.pid" --repl-diskless-sync yes --repl-diskless-sync-delay 0)
  [ -n "$master" ] && args+=(--replicaof "$HOST" "$master")
  echo "starting redis-server :$port${master:+ (replica of :$master)}"
  redis-server "${args[@]}"
  for _ in $(seq 1 50); do up "$port" && return; sleep 0.1; done
  echo "redis-server :$port did not start; see $DIR/redis-$port.log" >&2
  exit 1
}

start_sentinel() {  # port master-port
  local port="$1" master="$2" conf="$DIR/sentinel-$port.conf"
  # A sentinel rewrites its config file (known replicas, other sentinels, epochs): a fresh file for a
  # sentinel that is not running, so it never starts from a stale view of the topology.
  cat > "$conf" <<EOF
port $port
bind $HOST
daemonize yes
pidfile $DIR/sentinel-$port.pid
logfile $DIR/sentinel-$port.log
dir $DIR
sentinel monitor $MASTER $HOST $master $QUORUM
sentinel down-after-milliseconds $MASTER $DOWN_AFTER_MS
sentinel failover-timeout $MASTER $FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $MASTER 1
EOF
  echo "starting sentinel :$port (monitoring $MASTER at :$master)"
  # shellcheck disable=SC2046
  run_sentinel "$conf"
  for _ in $(seq 1 50); do up "$port" && return; sleep 0.1; done
  echo "sentinel :$port did not start; see $DIR/sentinel-$port.log" >&2
  exit 1
}

settled() {  # every sentinel names the same live master, sees the other sentinels and a linked replica
  local master="" port addr info
  for port in "${SENTINEL_PORTS[@]}"; do
    addr="$(cli "$port" sentinel get-master-addr-by-name "$MASTER" | tail -1)"
    [ -n "$addr" ] || return 1
    [ -z "$master" ] || [ "$master" = "$addr" ] || return 1
    master="$addr"
    info="$(cli "$port" sentinel master "$MASTER" | tr -d '\r' | paste - - | tr '\t' '=')"
    grep -qx "num-other-sentinels=$(( ${#SENTINEL_PORTS[@]} - 1 ))" <<< "$info" || return 1
    grep -qx "flags=master" <<< "$info" || return 1
    [ "$(cli "$port" sentinel replicas "$MASTER" | grep -c '^flags$')" -ge 1 ] || return 1
  done
  up "$master" && [ "$(role "$master")" = "master" ] || return 1
  for port in "$PRIMARY_PORT" "$REPLICA_PORT"; do
    [ "$port" = "$master" ] && continue
    cli "$port" info replication | tr -d '\r' | grep -qx "master_link_status:up" || return 1
  done
}

cmd_start() {
  command -v redis-server >/dev/null || { echo "redis-server is not installed (scripts/services.sh)" >&2; exit 1; }
  mkdir -p "$DIR"
  local master
  master="$(current_master_port)"
  if [ -z "$master" ]; then
    master="$PRIMARY_PORT"
    up "$master" || start_redis "$master"
  fi
  for port in "$PRIMARY_PORT" "$REPLICA_PORT"; do
    [ "$port" = "$master" ] || up "$port" || start_redis "$port" "$master"
  done
  for port in "${SENTINEL_PORTS[@]}"; do
    up "$port" || start_sentinel "$port" "$master"
  done
  for _ in $(seq 1 150); do
    if settled; then
      echo "sentinel ready: master $MASTER at $HOST:$(current_master_port), sentinels ${SENTINEL_PORTS[*]}"
      return
    fi
    sleep 0.2
  done
  echo "the sentinels did not agree on a master with a linked replica within 30 s" >&2
  cmd_status >&2
  exit 1
}

cmd_stop() {
  local port
  for port in "${SENTINEL_PORTS[@]}" "$PRIMARY_PORT" "$REPLICA_PORT"; do
    if up "$port"; then
      echo "stopping :$port"
      cli "$port" shutdown nosave >/dev/null || true
    fi
  done
}

cmd_status() {
  local port
  for port in "$PRIMARY_PORT" "$REPLICA_PORT"; do
    if up "$port"; then echo "redis :$port $(role "$port")"; else echo "redis :$port down"; fi
  done
  for port in "${SENTINEL_PORTS[@]}"; do
    if up "$port"; then
      echo "sentinel :$port master $MASTER at $(cli "$port" sentinel get-master-addr-by-name "$MASTER" | paste -sd:)"
    else
      echo "sentinel :$port down"
    fi
  done
}

cmd_urls() {
  local sentinels="" brokers="" port
  for port in "${SENTINEL_PORTS[@]}"; do
    sentinels+="${sentinels:+,}$HOST:$port"
    brokers+="${brokers:+;}sentinel://$HOST:$port"
  done
  echo "FENCED_REDIS_URL=redis+sentinel://$sentinels/$MASTER/0"
  echo "FENCED_BROKER_URL='$brokers'"
  echo "FENCED_BROKER_MASTER_NAME=$MASTER"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  urls) cmd_urls ;;
  *) echo "usage: $0 start|stop|status|urls" >&2; exit 2 ;;
esac
