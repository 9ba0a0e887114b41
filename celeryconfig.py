"""Celery transport settings: late acks, JSON only, prefetch 1, continuation queue consumed first."""

from __future__ import annotations

import sys

from fenced_core.pools import default_concurrency, imported_while_green_patching, split_pool

if imported_while_green_patching():
    # `celery worker --pool gevent|eventlet`: the patching's lock scan reaches Celery's default app,
    # which imports this module half-way through the patching. Refuse (Celery's default app then goes
    # unconfigured, as it would without this file) so nothing below binds the unpatched socket and select;
    # the worker's own app imports this module again once the patching is done.
    raise ImportError("celeryconfig is imported after gevent/eventlet monkey patching, not during it")

from kombu import Queue

from fenced_core.errors import ConfigError
from fenced_core.settings import INLINE_WINDOW_S, get_settings, warn_unknown_names
from tasks import queues
from tasks.kombu_client_cache import install as _reuse_publish_clients
from tasks.kombu_close_fix import install as _keep_workers_through_broker_failover
from tasks.kombu_slot_wakeup import install as _wake_green_consumers_on_a_free_slot
from tasks.redis_green_poll import install as _poll_pooled_redis_connections_in_the_kernel

_keep_workers_through_broker_failover()  # kombu 5.7's close path would end the worker (tasks/kombu_close_fix.py)
_reuse_publish_clients()  # kombu 5.7 builds a redis-py client per publish (tasks/kombu_client_cache.py)
_wake_green_consumers_on_a_free_slot()  # a full gevent worker looked again only every 2 s (tasks/kombu_slot_wakeup.py)
_poll_pooled_redis_connections_in_the_kernel()  # gevent's poll cost 25 us a Redis checkout (tasks/redis_green_poll.py)

try:
    _settings = get_settings()
except ConfigError as _exc:  # `celery -A tasks worker` with a bad FENCED_* variable: one line, exit 2
    print(f"error: {_exc}", file=sys.stderr)
    raise SystemExit(2) from None
warn_unknown_names()  # a misspelt FENCED_* variable would otherwise be ignored silently

broker_url = _settings.effective_broker_url
broker_connection_retry_on_startup = True
# Consume queues in the listed order (BRPOP key order), not round robin: continuations come first.
# kombu's Redis channel caps its connection pool at 10 and redis-py fails a command past the cap; a
# worker running hundreds of deliveries acks through one channel, and that failure reads as a lost
# broker: the consumer reconnects and puts every unacked message back on the queue (a duplicate of each
# wake-up still running). So the broker gets the limit fenced's own Redis has (FENCED_REDIS_MAX_CONNECTIONS).
broker_transport_options = {"queue_order_strategy": "priority", "visibility_timeout": 3600,
                            "max_connections": _settings.redis_max_connections}
if broker_url.startswith("sentinel://"):
    # kombu's Sentinel transport: the master its sentinels monitor (settings refuse a sentinel:// broker
    # without one). Asking a sentinel that is down must not hold up finding the master (docs/redis-sentinel.md).
    broker_transport_options["master_name"] = _settings.broker_master_name
    broker_transport_options["sentinel_kwargs"] = {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
task_ignore_result = True
result_backend = None
# Celery builds its (disabled) backend per thread unless told it is thread-safe: in a gevent worker
# that is per delivery, and building one scans the packages' entry points (~240 us a continuation sent).
result_backend_thread_safe = True

# A message is a wake-up call; the run row decides. Ack late so a message is not lost before the
# claim, and ack (not requeue) when a worker dies: our reaper rescues, Celery must not re-run poison.
task_acks_late = True
task_reject_on_worker_lost = False
worker_prefetch_multiplier = 1
# FENCED_CONCURRENCY, else 64 threads (a step mostly waits on its model) or Celery's default for prefork.
worker_concurrency = default_concurrency(split_pool(sys.argv[1:])[0], _settings.concurrency)
# The threads pool is the default (steps wait on model and tool I/O). Celery cannot tell an explicit
# `--pool prefork` from its own default and would replace it with this setting, so the setting is only
# made when the command line names no pool: `celery -A tasks worker` runs threads, `--pool prefork` prefork.
worker_pool = None if split_pool(sys.argv[1:])[0] else "threads"
# A delivery may run further steps inline (FENCED_INLINE_STEPS), starting them within INLINE_WINDOW_S.
task_time_limit = _settings.step_timeout_s + INLINE_WINDOW_S + 30
worker_hijack_root_logger = False

# The modules that define the agents and FencedTasks this worker runs: importing one registers them.
imports = tuple(m.strip() for m in _settings.imports.split(",") if m.strip())

task_queues = [Queue(name, routing_key=name) for name in queues.ALL]
task_default_queue = queues.NORMAL
task_create_missing_queues = False
# Task events feed Flower's live task view: three publishes per delivery from the worker and one per send.
# FENCED_TASK_EVENTS=0 turns them off (a high-concurrency worker spends them on every step; see README).
worker_send_task_events = _settings.task_events
task_send_sent_event = _settings.task_events
