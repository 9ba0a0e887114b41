#!/usr/bin/env bash
# A real local Redis Cluster for fenced's tests and chaos: 6 redis-server nodes with cluster mode on
# (3 masters, 3 replicas) on BASE_PORT..BASE_PORT+5, no persistence, data under /tmp.
#   scripts/redis-cluster.sh start [BASE_PORT]   # idempotent; waits until cluster_state:ok
#   scripts/redis-cluster.sh stop [BASE_PORT]    # shuts every node down, removes its data dir
#   scripts/redis-cluster.sh status [BASE_PORT]  # node roles and cluster_state; exit 1 unless ok
# cluster-node-timeout is short (FENCED_CLUSTER_NODE_TIMEOUT_MS, default 2000 ms) so a killed master's
# replica is promoted within a few seconds in tests; production clusters keep Redis's 15 s default or
# tune it against their network. Then use FENCED_REDIS_URL=redis+cluster://127.0.0.1:BASE_PORT,...
set -euo pipefail

cmd="${1:-status}"
base="${2:-7000}"
timeout_ms="${FENCED_CLUSTER_NODE_TIMEOUT_MS:-2000}"
root="/tmp/fenced-redis-cluster-${base}"
ports=()
for i in 0 1 2 3 4 5; do ports+=("$((base + i))"); done

ping() { redis-cli -h 127.0.0.1 -p "$1" ping >/dev/null 2>&1; }
state() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_state://p'; }
known() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r' | sed -n 's/^cluster_known_nodes://p'; }

start_node() {
  local port="$1" dir="${root}/${1}"
  mkdir -p "$dir"
  ping "$port" && return 0
  # A node that restarts after a kill keeps its identity in nodes.conf and rejoins as a replica.
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "$timeout_ms" \
    --save '' --appendonly no --logfile "${dir}/redis.log" --pidfile "${dir}/redis.pid"
}

# Every master has a replica whose link to it is up: otherwise killing that master loses its slots (a
# replica that is still syncing, or was cut off longer than the validity factor, will not fail over).
replicas_ready() {
  local masters linked any=""
  for p in "${ports[@]}"; do ping "$p" && { any="$p"; break; }; done
  [ -n "$any" ] || return 1
  masters=$(redis-cli -h 127.0.0.1 -p "$any" cluster nodes 2>/dev/null | awk '$3 ~ /master/ && $3 !~ /fail/ && NF > 8 {print $1}' | sort -u)
  linked=""
  for p in "${ports[@]}"; do
    local info
    info=$(redis-cli -h 127.0.0.1 -p "$p" info replication 2>/dev/null | tr -d '\r')
    if echo "$info" | grep -q '^role:slave' && echo "$info" | grep -q '^master_link_status:up'; then
      linked="${linked} $(redis-cli -h 127.0.0.1 -p "$p" cluster nodes 2>/dev/null | awk '$3 ~ /myself/ {print $4}')"
    fi
  done
  for m in $masters; do echo "$linked" | grep -q "$m" || return 1; done
  return 0
}

wait_ok() {
  for _ in $(seq 1 300); do
    local ok=1
    for p in "${ports[@]}"; do [ "$(state "$p")" = ok ] || ok=0; done
    [ "$ok" = 1 ] && replicas_ready && return 0
    sleep 0.2
  done
  echo "cluster on ${base}: not ok (state, or a master without a synced replica) after 60 s" >&2
  return 1
}

case "$cmd" in
  start)
    for p in "${ports[@]}"; do start_node "$p"; done
    for _ in $(seq 1 50); do
      up=1; for p in "${ports[@]}"; do ping "$p" || up=0; done
      [ "$up" = 1 ] && break; sleep 0.1
    done
    if [ "$(known "$base")" != 6 ]; then
      hosts=(); for p in "${ports[@]}"; do hosts+=("127.0.0.1:${p}"); done
      redis-cli --cluster create "${hosts[@]}" --cluster-replicas 1 --cluster-yes >"${root}/create.log" 2>&1 \
        || { cat "${root}/create.log" >&2; exit 1; }
    fi
    wait_ok
    echo "redis cluster ready: redis+cluster://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
    ;;
  stop)
    for p in "${ports[@]}"; do
      redis-cli -h 127.0.0.1 -p "$p" shutdown nosave >/dev/null 2>&1 || true
    done
    for p in "${ports[@]}"; do
      for _ in $(seq 1 50); do ping "$p" || break; sleep 0.1; done
    done
    rm -rf "$root"
    echo "redis cluster on ${base} stopped"
    ;;
  status)
    rc=0
    for p in "${ports[@]}"; do
      if ping "$p"; then
        role=$(redis-cli -h 127.0.0.1 -p "$p" role 2>/dev/null | head -1)
        echo "127.0.0.1:${p} ${role} cluster_state:$(state "$p")"
        [ "$(state "$p")" = ok ] || rc=1
      else
        echo "127.0.0.1:${p} down"; rc=1
      fi
    done
    exit "$rc"
    ;;
  *)
    echo "usage: $0 start|stop|status [BASE_PORT]" >&2; exit 2 ;;
esac
