"""The one wake-up sender: every message that wakes a run goes out through `send` (routing plugs in here).

A wake-up carries the run id and the step it wakes (None: whatever step the run is at), nothing the
run depends on; any number of copies may arrive and the run row decides what each does. Who sends:
submit (the first wake-up, for step 0, on the kind's queue, with the run id as its task id), a finished step's
continuation, a rescue (reaper, sweeper, fast takeover), a reply to a waiting run, a dead letter's
replay, a reroute (a wake-up routed to a worker that went offline); those go on the continuation queue,
consumed first. Under FENCED_ROUTING=reach (routing/, docs/routing.md) every one of them goes instead to
the queue of the worker the policy picks, or nowhere (deferred) when no worker qualifies; each choice
is recorded in the ledger ("routed") with every candidate's score."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import structlog
from celery import Celery
from kombu import Queue
from kombu.exceptions import BatchPublishError
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

from checkpoints import ledger
from checkpoints.db import in_transaction
from fencing import registry
from fencing.connection import process_token
from routing import policy
from tasks import queues
from tasks.celery_app import RUN_TASK
from tasks.celery_app import app as _default_app
from tasks.kombu_front_of_queue import HEADER as FRONT
from tasks.kombu_front_of_queue import install as _install_front_of_queue

log = structlog.get_logger("tasks.wakeup")
_install_front_of_queue()  # the header below means nothing to kombu without it

Reason = Literal["submit", "continuation", "rescue", "reply", "replay", "reroute"]
REASONS: tuple[Reason, ...] = ("submit", "continuation", "rescue", "reply", "replay", "reroute")
_app: list[Celery] = [_default_app]
_queues: dict[str, Queue] = {}
_queues_lock = threading.Lock()
_batch = threading.local()  # .producer: the producer of this thread's open batch(), if any


def use_app(app: Celery) -> None:
    """Send through `app` from now on (an installed user app with its own broker settings)."""
    _app[0] = app


def queue_for(reason: Reason, kind: str = "normal") -> str:
    """The queue a wake-up goes to: a first wake-up waits with its kind, every other one goes first."""
    return queues.for_kind(kind) if reason == "submit" else queues.CONTINUE


def send(run_id: str, step: int | None, reason: Reason, *, kind: str = "normal", prefer: str | None = None) -> None:
    """Send one wake-up for `run_id` at `step`. Raises what the broker raises (kombu's errors): the
    caller has committed what the wake-up is for, so a lost send is the sweeper's to repeat, never a
    reason to undo the commit. After a crash mid-send either the message exists or the sweeper sends it.

    Under `reach`, `prefer` (the worker that ran the previous step) keeps the run while it qualifies;
    a wake-up nobody qualifies for is deferred (no message; the registry scan routes it again, and the
    sweeper still wakes a run left without one)."""
    if reason not in REASONS:
        raise ValueError(f"unknown wake-up reason {reason!r}; known: {', '.join(REASONS)}")
    if policy.reach():
        _route(run_id, step, reason, kind, prefer)
        return
    queue = queue_for(reason, kind)
    _in_one_trip(run_id, step, reason, queue)
    log.debug("wakeup_sent", run_id=run_id, step=step, reason=reason, queue=queue)


@contextmanager
def batch() -> Iterator[None]:
    """Every wake-up this thread sends inside goes out when the block ends, all in one broker round
    trip (kombu's publish batch: one Redis pipeline of the messages' LPUSHes and their task-sent
    events). A reaper tick that rescues hundreds of runs costs one round trip instead of one each.

    What is sent inside is only buffered: raised out of the block, nothing of it is sent; a failed
    flush raises kombu's BatchPublishError (delivery uncertain). Either way the callers' rule holds: a
    wake-up is sent only for what is committed, and a lost one is repeated (the rescue's watch entry,
    the sweeper). Nested blocks join the outermost. Under `reach` it batches nothing: each routed
    wake-up's registry accounting must learn of its own failed publish."""
    if getattr(_batch, "producer", None) is not None or policy.reach():
        yield
        return
    with _app[0].producer_or_acquire() as producer, producer.batch():
        _batch.producer = producer
        try:
            yield
        finally:
            _batch.producer = None


def _in_one_trip(run_id: str, step: int | None, reason: Reason, queue: str) -> None:
    """Publish one wake-up in one broker round trip. With task-sent events on (FENCED_TASK_EVENTS: Flower's
    "sent" state) a Celery publish is two, the message's LPUSH and then its event's PUBLISH; here the
    wake-up is a publish batch of one (kombu's, as `batch`), so both go in one pipeline. Inside an open
    batch it joins that one.

    kombu sends a batch without its connection retry, so a failed one-message batch is sent again here as
    Celery's own publish would be (task_publish_retry_policy). A repeat after a lost reply may leave two
    copies: harmless, as any number of copies of a wake-up may arrive (the run row decides)."""
    conf = _app[0].conf
    if not conf.task_send_sent_event:  # one command: Celery's own publish, with its own retry
        _publish(run_id, step, reason, queue, queue)
        return
    policy = {"max_retries": 3, "interval_start": 0, "interval_step": 0.2, "interval_max": 1,
              **(conf.task_publish_retry_policy or {})}

    def retried(state: RetryCallState) -> None:
        log.warning("wakeup_send_retried", run_id=run_id, step=step, reason=reason,
                    error=repr(state.outcome.exception() if state.outcome else None))

    for attempt in Retrying(retry=retry_if_exception_type(BatchPublishError), reraise=True, before_sleep=retried,
                            stop=stop_after_attempt(1 + (int(policy["max_retries"]) if conf.task_publish_retry else 0)),
                            wait=wait_incrementing(policy["interval_start"], policy["interval_step"],
                                                   policy["interval_max"])):
        with attempt, batch():
            _publish(run_id, step, reason, queue, queue)


def _publish(run_id: str, step: int | None, reason: Reason, queue: str | Queue, name: str) -> None:
    options: dict[str, Any] = {"task_id": run_id} if reason == "submit" else {}
    headers: dict[str, Any] = {"fenced_sent_ms": registry.now_ms()}
    if reason == "rescue":  # a dead holder's run goes before what waits (tasks/kombu_front_of_queue.py)
        headers[FRONT] = True
    _app[0].send_task(RUN_TASK, args=(run_id, step), queue=queue, routing_key=name, headers=headers,
                      producer=getattr(_batch, "producer", None), **options)


def _direct(name: str) -> Queue:
    """A worker's own queue, declared on first use (its binding lives in the broker)."""
    with _queues_lock:
        q = _queues.get(name)
        if q is None:
            q = _queues[name] = Queue(name, routing_key=name)
        return q


def _route(run_id: str, step: int | None, reason: Reason, kind: str, prefer: str | None) -> None:
    decision = policy.choose(prefer)
    if decision.worker is None or decision.queue is None:
        registry.defer(run_id, {"step": step, "reason": reason, "kind": kind})
        epoch = registry.epoch_mirror(run_id)
        log.warning("wakeup_deferred", run_id=run_id, step=step, reason=reason,
                    candidates=len(decision.candidates))
    else:
        epoch = registry.routed(decision.worker, run_id, step)
        queue = decision.queue if reason == "submit" else registry.urgent_queue(decision.queue)
        try:
            _publish(run_id, step, reason, _direct(queue), queue)
        except BaseException:
            registry.consumed_nothing(decision.worker, run_id, step)
            raise
        log.info("wakeup_routed", run_id=run_id, step=step, reason=reason, worker=decision.worker,
                 kept_preferred=decision.kept_preferred)
    if in_transaction():  # its own write would wait on the caller's (SQLite: one writer): say it in the log only
        log.warning("routed_record_skipped_in_transaction", run_id=run_id, reason=reason, worker=decision.worker)
        return
    try:
        ledger.record(run_id, epoch if epoch is not None else (0 if reason == "submit" else -1), process_token(),
                      "routed", f"{reason} wake-up for step {'current' if step is None else step} "
                      f"{decision.sentence()}", {"reason": reason, "step": step, **decision.detail()})
    except Exception as exc:  # the wake-up is out (or deferred); the record is best effort
        log.warning("routed_record_failed", run_id=run_id, error=repr(exc))


def continuation(run_id: str, step: int) -> None:
    """The next step's wake-up, sent after the finished step let go of (or handed over) its lease;
    under `reach` it prefers this worker (warm caches) while it qualifies."""
    send(run_id, step, "continuation", prefer=policy.this_node() or None)


def rescue(run_id: str) -> None:
    """A rescue: wake the run at whatever step it is (reaper, sweeper, fast takeover)."""
    send(run_id, None, "rescue")


def promoted(run_id: str, from_queue: str, to_queue: str) -> None:
    """A waiting first wake-up was moved ahead (fencing.fairness, atomically in Redis; the message is
    the same, so nothing is sent again): said here so routing sees every wake-up's way to a worker."""
    log.info("wakeup_promoted", run_id=run_id, from_queue=from_queue, to_queue=to_queue)
