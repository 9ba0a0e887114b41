"""Prometheus metrics: a worker's counters and latencies (from hooks), the cluster's gauges read at scrape time.

Counters live in the process that made the commit they count (tasks.hooks: after the commit, never in a
transaction, a failure logged and ignored), so a process killed right after a commit never counts it
and a takeover counts its claim again: they are rates of what workers did, not a ledger (the ledger is
`fenced explain`). Gauges (runs by state, dead letters, queue depth, ...) are read from the stores when
scraped, cluster-wide, identical from every endpoint that serves them.

A worker serves them on FENCED_METRICS_PORT (0 = off, the default) through MetricsStep. The threads
pool is one process. With prefork the endpoint is the parent's: pool children's counters reach it only in
prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR set, to an empty directory, before the
worker starts); without it the parent serves the gauges and its own counters, and says so at start.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
import structlog
from celery import bootsteps, signals
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from checkpoints import ledger
from checkpoints.db import transaction
from checkpoints.schema import RUN_STATES, run_checkpoints
from fenced_core.settings import get_settings
from fencing import metrics as redis_metrics
from fencing import registry
from routing import queue_watch
from tasks import hooks, queues
from tasks.explain import takeover_cause

log = structlog.get_logger("tasks.metrics")

# The runtime's own metrics, on their own registry: the API serves the cluster gauges, not a worker's zeros.
RUNTIME = CollectorRegistry(auto_describe=True)
CLAIMS = Counter("fenced_claims", "Claims of a run's step by this process (takeovers included)", ["agent"],
                 registry=RUNTIME)
TAKEOVERS = Counter("fenced_takeovers", "Claims that took a run over from a holder that never handed it over, "
                    "by why the holder lost it (from the ledger's rescue and step_timeout entries)", ["cause"],
                    registry=RUNTIME)
FENCE_REJECTIONS = Counter("fenced_fence_rejections", "Writes refused because a newer epoch owned the run; the "
                           "holder stopped", ["at"], registry=RUNTIME)
DEAD_LETTERED = Counter("fenced_dead_lettered", "Runs this process dead-lettered", registry=RUNTIME)
FINISHED = Counter("fenced_runs_finished", "Runs this process ended, by final state", ["state"], registry=RUNTIME)
_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
STEP_SECONDS = Histogram("fenced_step_seconds", "From a step's claim to how its delivery ended", ["outcome"],
                         buckets=_SECONDS, registry=RUNTIME)
CHECKPOINT_SECONDS = Histogram("fenced_checkpoint_write_seconds", "One fenced checkpoint transaction (A: decision, "
                               "B: step done, terminal: final row and settlement)", ["checkpoint"],
                               buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                               registry=RUNTIME)
CAUSE_WAIT_S = 3.0  # a rescue's ledger entry is written just after its wake-up is sent: wait this long for it


@contextmanager
def checkpoint_timer(checkpoint: str) -> Iterator[None]:
    """Observe the enclosed checkpoint write in fenced_checkpoint_write_seconds (also when it raises: a
    fenced-out write took that long too). Costs a clock read and one histogram update; changes nothing
    the write does, so a crash or a takeover around it is exactly what it would be without it."""
    start = time.perf_counter()
    try:
        yield
    finally:
        CHECKPOINT_SECONDS.labels(checkpoint).observe(time.perf_counter() - start)


class ClusterCollector(Collector):
    """The gauges read at scrape time: runs by state (one GROUP BY on an indexed column), dead letters,
    queue depth per queue, admitted-unsent runs, false-positive presumed deaths, lease renew failures;
    fenced_store_up says
    which store answered. A store that is down is reported as down, never as zeros."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("fenced_store_up", "1 if the store answered this scrape", labels=["store"])
        try:
            counts = _runs_by_state()
            up.add_metric(["database"], 1)
            by_state = GaugeMetricFamily("fenced_runs", "Runs in each state now (run store)", labels=["state"])
            for state in RUN_STATES:
                by_state.add_metric([state], counts.get(state, 0))
            yield by_state
            yield GaugeMetricFamily("fenced_dead_letters", "Dead-lettered runs not replayed (state dead)",
                                    value=counts.get("dead", 0))
        except Exception as exc:
            log.warning("metrics_store_read_failed", store="database", error=repr(exc))
            up.add_metric(["database"], 0)
        try:
            g = redis_metrics.read_gauges(queues.ALL)
            up.add_metric(["redis"], 1)
            yield from _queue_metrics()
            yield GaugeMetricFamily("fenced_admitted_unsent", "Runs admitted whose first wake-up is not sent yet",
                                    value=g.admitted_unsent)
            yield GaugeMetricFamily("fenced_dead_letter_stream_entries", "Entries in the capped dead-letter stream",
                                    value=g.dead_letter_stream)
            yield CounterMetricFamily("fenced_fast_takeover_false_positives", "Holders presumed dead by fast "
                                      "takeover that were alive (cluster-wide, kept in Redis)",
                                      value=g.false_positives)
            yield CounterMetricFamily("fenced_lease_renew_failures", "Lease renewals the watchdogs missed: the "
                                      "lease was gone or Redis did not answer (cluster-wide, kept in Redis)",
                                      value=g.renew_failures)
        except Exception as exc:
            log.warning("metrics_store_read_failed", store="redis", error=repr(exc))
            up.add_metric(["redis"], 0)
        yield up


def _queue_metrics() -> Iterator[Metric]:
    """Length, lag and warning state of every watched queue (the shared ones, each live worker's own),
    through routing's queue watch: a scrape that sees a queue cross the threshold raises (or clears)
    its warning on the live feed, once however many processes watch."""
    threshold = get_settings().routing_queue_warn
    states, _raised, _cleared = queue_watch.watch(queues.ALL)
    depth = GaugeMetricFamily("fenced_queue_depth", "Undelivered wake-ups per broker queue (the shared queues and "
                              "each live worker's own)", labels=["queue"])
    lag = GaugeMetricFamily("fenced_queue_lag_seconds", "How long the oldest undelivered wake-up of the queue "
                            "has waited (0 when it is empty)", labels=["queue"])
    long = GaugeMetricFamily("fenced_queue_long", f"1 while the queue is over FENCED_ROUTING_QUEUE_WARN messages "
                             f"(cleared at {queue_watch.CLEAR_RATIO:g} of it)", labels=["queue"])
    for st in states:
        depth.add_metric([st.queue], st.length)
        lag.add_metric([st.queue], (st.lag_ms or 0) / 1000)
        long.add_metric([st.queue], 1 if st.long else 0)
    yield depth
    yield lag
    yield long
    yield GaugeMetricFamily("fenced_queue_warn_threshold", "FENCED_ROUTING_QUEUE_WARN: the length a queue "
                            "warns past", value=threshold)
    warnings = CounterMetricFamily("fenced_queue_long_warnings", "Long-queue warnings raised on the live feed "
                                   "(cluster-wide, kept in Redis)", labels=["queue"])
    for name, n in sorted(registry.queue_warnings().items()):
        warnings.add_metric([name], n)
    yield warnings


def _runs_by_state() -> dict[str, int]:
    rc = run_checkpoints.c
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(rc.state, sa.func.count()).group_by(rc.state)).all()
    return {str(state): int(n) for state, n in rows}


def cluster_registry() -> CollectorRegistry:
    """A registry with the cluster gauges only: what the API serves. Holds no state, so an API replica that
    crashes or restarts serves the same numbers as before."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return registry


def worker_registry() -> CollectorRegistry:
    """What a worker serves: the cluster gauges and the runtime's counters, the latter summed over every
    process of the worker in multiprocess mode (PROMETHEUS_MULTIPROC_DIR), else this process's."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry(auto_describe=False)
        MultiProcessCollector(registry)
        registry.register(ClusterCollector())
        return registry
    registry = cluster_registry()
    registry.register(_Runtime())
    return registry


class _Runtime(Collector):
    def collect(self) -> Iterator[Metric]:
        return iter(RUNTIME.collect())


# -- counting: hooks and the end of a delivery -------------------------------------
_current = threading.local()  # (run_id, epoch, start) of the claim this delivery thread is running


def _observe(run_id: str, outcome: str) -> None:
    claim = getattr(_current, "claim", None)
    if claim is not None and claim[0] == run_id:
        _current.claim = None
        STEP_SECONDS.labels(outcome).observe(time.perf_counter() - claim[2])


class MetricsHooks(hooks.Hooks):
    """Counts claims, takeovers by cause, fence rejections, dead letters and endings; times each step
    from its claim to how it ended. A notice lost to a crash is simply not counted."""

    def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
        CLAIMS.labels(agent).inc()
        _current.claim = (run_id, epoch, time.perf_counter())

    def on_takeover(self, run_id: str, epoch: int, step: int, previous_owner: str | None, phase: str) -> None:
        _causes().put((run_id, epoch, time.monotonic() + CAUSE_WAIT_S))

    def on_step_done(self, run_id: str, epoch: int, step: int, name: str) -> None:
        _observe(run_id, "step_done")

    def on_fenced_out(self, run_id: str, epoch: int, what: str) -> None:
        FENCE_REJECTIONS.labels(re.sub(r"\d+", "N", what)[:60]).inc()
        _observe(run_id, "fenced_out")

    def on_dead_letter(self, run_id: str, epoch: int, step: int, reason: str) -> None:
        DEAD_LETTERED.inc()
        _observe(run_id, "dead")

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        FINISHED.labels(state).inc()
        _observe(run_id, state)


_cause_queues: dict[int, queue.Queue[tuple[str, int, float]]] = {}
_cause_lock = threading.Lock()


def _causes() -> queue.Queue[tuple[str, int, float]]:
    """This process's queue of takeovers to classify, with its thread (started after a fork, in the child):
    the hook returns at once, the delivery never waits on the ledger."""
    pid = os.getpid()
    with _cause_lock:
        q = _cause_queues.get(pid)
        if q is None:
            q = _cause_queues[pid] = queue.Queue()
            threading.Thread(target=_classify_loop, args=(q,), name="fenced-metrics-causes", daemon=True).start()
        return q


def _classify_loop(q: queue.Queue[tuple[str, int, float]]) -> None:
    while True:
        run_id, epoch, deadline = q.get()
        cause = None
        while cause is None:
            final = time.monotonic() >= deadline
            try:
                cause = takeover_cause(ledger.history(run_id), epoch, final=final)
            except Exception as exc:  # the store is down: counted as unknown once the wait is over
                log.warning("takeover_cause_read_failed", run_id=run_id, epoch=epoch, error=repr(exc))
                cause = "unknown" if final else None
            if cause is None:
                time.sleep(0.2)
        TAKEOVERS.labels(cause).inc()


def _delivery_ended(sender: Any = None, args: Any = None, retval: Any = None, **_: Any) -> None:
    """task_postrun: a delivery that ended without a hook that times it (parked, lease lost, store down)."""
    if args:
        _observe(str(args[0]), retval if isinstance(retval, str) else "error")


_hooks: list[MetricsHooks] = []


def install() -> MetricsHooks:
    """Count in this process from now on (hooks, delivery ends); idempotent. Called in a
    worker's main process before its pool starts, so prefork children inherit it."""
    if not _hooks:
        counting = MetricsHooks()
        hooks.add_hooks(counting)
        _hooks.append(counting)
        signals.task_postrun.connect(_delivery_ended, weak=False)
    return _hooks[0]


def serve(port: int, addr: str) -> Any:
    """Serve worker_registry() on addr:port in a daemon thread; returns the server (shutdown() stops it).
    A worker killed loses its in-memory counters (Prometheus sees a reset); the gauges live in the stores."""
    server, _thread = start_http_server(port, addr=addr, registry=worker_registry())
    return server


class MetricsStep(bootsteps.StartStopStep):
    """The worker's /metrics endpoint on FENCED_METRICS_PORT (off when 0), in its main process. It only reads
    and counts: a step's crash, freeze or takeover goes exactly as without it."""

    requires = {"celery.worker.components:Pool"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.server: Any = None
        if get_settings().metrics_port:
            install()  # before the pool forks: children inherit the hooks

    def start(self, worker: Any) -> None:
        s = get_settings()
        if not s.metrics_port:
            return
        pool = getattr(worker.pool_cls, "__module__", "")
        if "prefork" in pool and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            log.warning("metrics_prefork_parent_only", port=s.metrics_port,
                        hint="set PROMETHEUS_MULTIPROC_DIR to count pool children's work")
        self.server = serve(s.metrics_port, s.metrics_addr)
        log.info("metrics_serving", addr=s.metrics_addr, port=s.metrics_port)

    def stop(self, worker: Any) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server = None
