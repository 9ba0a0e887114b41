"""The worker side of routing: registry heartbeat and scan (a bootstep), its own queue, live load and step stats.

Hooked up by one line in tasks.app. Everything here is advice for the router: a failure is logged and
never touches a run (the wake-up is a message; the run row and the lease decide)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from celery import bootsteps, signals
from kombu import Queue

from fenced_core.pools import off_the_hub
from fenced_core.settings import get_settings
from fencing import registry
from fencing.connection import process_token
from routing import policy
from routing.heartbeat import Heartbeat
from routing.scan import scan
from tasks import hooks, queues, wakeup
from tasks.celery_app import RUN_TASK

log = structlog.get_logger("tasks.routing_worker")
_state: dict[str, Any] = {}


@signals.celeryd_after_setup.connect
def _consume_own_queue(sender: str = "", instance: Any = None, **_: Any) -> None:
    """Under `reach`, the worker consumes its own queues before every shared one: first the one for
    continuations, rescues and replies (agents.w.<node name>.continue), then first wake-ups (agents.w.<node name>)."""
    if not policy.reach() or instance is None:
        return
    own = policy.queue_of(str(sender))
    urgent = registry.urgent_queue(own)
    selected = instance.app.amqp.queues
    selected.add(Queue(urgent, routing_key=urgent))
    selected.add(Queue(own, routing_key=own))
    selected.select([urgent, own, *[name for name in selected.consume_from if name not in (own, urgent)]])
    _state["queue"] = own
    log.info("routing_own_queue", queue=own)


class RoutingStep(bootsteps.StartStopStep):
    """The registry heartbeat (own thread) and the registry scan (worker timer, one worker per interval)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.heartbeat: Heartbeat | None = None
        self.ref: Any = None

    def start(self, worker: Any) -> None:
        name = str(worker.hostname)
        s = get_settings()
        consumed = [q for q in worker.app.amqp.queues.consume_from]
        info = {"host": socket.gethostname(), "pid": os.getpid(), "token": process_token(),
                "queue": _state.get("queue", ""), "queues": consumed,
                "labels": [x.strip() for x in s.worker_labels.split(",") if x.strip()],
                "concurrency": worker.concurrency, "pool": type(worker.pool).__module__.rsplit(".", 1)[-1],
                "policy": s.routing, "started_ms": registry.now_ms()}
        self.heartbeat = Heartbeat(name, lambda: {**info, "status": _state.get("status", "online")}, _running).start()
        self.ref = worker.timer.call_repeatedly(s.routing_scan_ms / 1000, _scan_tick)

    def stop(self, worker: Any) -> None:
        """The start of a warm shutdown (Celery stops this step before the pool drains): no more scans
        here, and what waits in our queue goes elsewhere at once (nothing more is consumed here). The
        heartbeat keeps beating `draining` with the true running count until the steps in flight end;
        `_stopped` (worker_shutdown, after the pool drained) marks the worker offline."""
        if self.ref is not None:
            self.ref.cancel()
            self.ref = None
        if self.heartbeat is not None:
            _state["heartbeat"] = self.heartbeat
            _mark_draining(self.heartbeat.name)  # said already on SIGTERM; not on every way to a stop
            _reroute(self.heartbeat.name, registry.take_pending)
            self.heartbeat = None


def _reroute(name: str, take: Callable[[str], list[str] | None]) -> None:
    try:
        for member in take(name) or []:
            run_id, _, step = member.partition("|")
            wakeup.send(run_id, int(step) if step else None, "reroute")
    except Exception as exc:  # the scan or the sweeper does it
        log.warning("registry_stop_failed", worker=name, error=repr(exc))


@signals.worker_shutdown.connect
def _stopped(**_: Any) -> None:
    """After a warm shutdown drained the pool: stop beating, mark the worker offline and reroute what a
    racing router sent it meanwhile. (A cold shutdown or a kill never gets here: the scan sees the
    process's Redis connections gone.)"""
    heartbeat: Heartbeat | None = _state.pop("heartbeat", None)
    if heartbeat is not None:
        heartbeat.stop()
        _reroute(heartbeat.name, lambda name: registry.mark_offline(name, "stopped"))


def _running() -> int | None:
    """Deliveries this worker is running now (accepted, not merely reserved)."""
    try:
        from celery.worker import state

        return len(state.active_requests)
    except Exception:
        return None


def _scan_tick() -> None:
    try:
        scan(lambda run_id, step, reason, kind: wakeup.send(run_id, step, reason, kind=kind),  # type: ignore[arg-type]
             queues.ALL)
    except Exception as exc:  # a failed scan must never kill the worker's timer
        log.warning("routing_scan_failed", error=repr(exc))


@signals.worker_shutting_down.connect
def _draining(**_: Any) -> None:
    """SIGTERM: no new wake-ups are routed here while the steps in flight drain."""
    node = policy.this_node()
    if node:
        off_the_hub(lambda: _mark_draining(node))


def _mark_draining(node: str) -> None:
    _state["status"] = "draining"  # the heartbeat keeps saying so while the steps in flight drain
    try:
        registry.set_status(node, "draining")
    except Exception as exc:
        log.warning("registry_drain_mark_failed", worker=node, error=repr(exc))


def _guard(what: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # advice only: never break a delivery
        log.warning(f"registry_{what}_failed", error=repr(exc))


# The live running count and the queued entries matter only where wake-ups are routed: under `shared`
# the heartbeat's true count is enough, and a delivery pays no registry round trip at its start.
@signals.task_prerun.connect
def _started(sender: Any = None, args: Any = None, **_: Any) -> None:
    node = policy.this_node()
    if node and getattr(sender, "name", "") == RUN_TASK and args and policy.reach():
        step = args[1] if len(args) > 1 else None
        _guard("consumed", lambda: registry.consumed(node, str(args[0]), step))


@signals.task_postrun.connect
def _ended(sender: Any = None, **_: Any) -> None:
    """The delivery's step record (kept by StepStats on this thread) and, under `reach`, one fewer
    running: one round trip at the end of a delivery, none when there is nothing to say."""
    node = policy.this_node()
    if not node or getattr(sender, "name", "") != RUN_TASK:
        return
    step = STATS.take()
    running = policy.reach()
    if step is not None or running:
        _guard("ended", lambda: registry.delivery_ended(node, step, get_settings().routing_window, running=running))


class StepStats(hooks.Hooks):
    """Each step's time (claim to checkpoint B or the end) and outcome, into the worker's last steps."""

    MAX_OPEN = 2_000

    def __init__(self) -> None:
        self._open: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._closed = threading.local()  # the step this thread's delivery closed, sent when it ends

    def take(self) -> tuple[float, bool] | None:
        """The (ms, ok) of the step this thread's delivery closed, once."""
        step: tuple[float, bool] | None = getattr(self._closed, "step", None)
        self._closed.step = None
        return step

    def on_claim(self, run_id: str, epoch: int, step: int, agent: str) -> None:
        with self._lock:
            if len(self._open) >= self.MAX_OPEN:  # deliveries that parked or lost their lease never close
                for key in list(self._open)[: self.MAX_OPEN // 2]:
                    del self._open[key]
            self._open[(run_id, epoch)] = time.monotonic()

    def _close(self, run_id: str, epoch: int, ok: bool) -> None:
        with self._lock:
            started = self._open.pop((run_id, epoch), None)
        if started is not None and policy.this_node():
            self._closed.step = ((time.monotonic() - started) * 1000, ok)

    def on_step_done(self, run_id: str, epoch: int, step: int, name: str) -> None:
        self._close(run_id, epoch, True)

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        self._close(run_id, epoch, state != "failed")

    def on_dead_letter(self, run_id: str, epoch: int, step: int, reason: str) -> None:
        self._close(run_id, epoch, False)

    def on_fenced_out(self, run_id: str, epoch: int, what: str) -> None:
        self._close(run_id, epoch, False)


STATS = StepStats()
hooks.add_hooks(STATS)
