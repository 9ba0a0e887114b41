"""The worker bootstep that runs the reaper (every tick), the sweeper and the large-run promoter on the timer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from celery import bootsteps

from fenced_core.settings import get_settings
from tasks import queues, wakeup

log = structlog.get_logger("tasks.bootsteps")


class LivenessStep(bootsteps.StartStopStep):
    """Reaper, sweeper and promoter in every worker's main process: nothing stays stranded or starved."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.refs: list[Any] = []

    def start(self, worker: Any) -> None:
        s = get_settings()
        ticks = [(s.reaper_tick_ms, "reaper", _reap),
                 (min(s.sweeper_interval_ms, s.sweeper_grace_ms), "sweeper", _sweep),
                 (s.large_promote_every_ms, "promoter", _promote)]
        if s.fast_takeover:
            ticks.append((s.liveness_tick_ms, "liveness", _check_connections))
        self.refs = [worker.timer.call_repeatedly(ms / 1000, _guarded(name, fn)) for ms, name, fn in ticks]

    def stop(self, worker: Any) -> None:
        for ref in self.refs:
            ref.cancel()
        self.refs = []


def _guarded(name: str, tick: Callable[[], object]) -> Callable[[], None]:
    """`tick`, logging instead of raising: a failed tick must never kill the worker's timer. The
    wake-ups a tick sends go out together when it ends (`wakeup.batch`: one broker round trip for a
    dead process's hundreds of rescues), after their watch entries and ledger entries are written."""

    def run() -> None:
        try:
            with wakeup.batch():
                tick()
        except Exception as exc:
            log.warning(f"{name}_tick_failed", error=repr(exc))

    return run


def _check_connections() -> object:
    from fencing.liveness import check_connections

    return check_connections(wakeup.rescue)


def _reap() -> object:
    from fencing.reaper import reap

    return reap(wakeup.rescue, get_settings().lease_ttl_ms)


def _sweep() -> object:
    from fencing.sweeper import sweep
    from tasks.endings import expired

    return sweep(wakeup.rescue, expired=expired)


def _promote() -> object:
    from fencing.fairness import promote_large

    # One worker per interval (a SET NX PX lock inside), so the pace does not grow with the pool.
    run_id = promote_large(queues.LARGE, queues.NORMAL, get_settings().large_promote_every_ms)
    if run_id:
        wakeup.promoted(run_id, queues.LARGE, queues.NORMAL)
    return run_id


class SlotsStep(bootsteps.StartStopStep):
    """Tells tasks.delivery how many deliveries this worker runs at once (its pool's size), so a delivery
    that could run its run's next step inline knows whether the worker has a slot free for wake-ups that
    wait (tasks.delivery._goes_on). Prefork children never run steps inline."""

    requires = {"celery.worker.components:Pool"}

    def start(self, worker: Any) -> None:
        from tasks.delivery import set_slots

        set_slots(worker.concurrency)

    def stop(self, worker: Any) -> None:
        from tasks.delivery import set_slots

        set_slots(None)


class NoMingleStep(bootsteps.Step):
    """Skips Celery's mingle at start-up, in fenced's own app only. Mingle broadcasts a hello and waits a
    full second for the other workers' revoked task ids; fenced never revokes (a cancel lives in the run
    row), and that second is takeover capacity lost whenever a supervisor restarts a dead worker
    (`celery -A tasks worker` was ready in 2.2-2.5 s with it, 1.3-1.8 s without, beside a running
    worker). An app given fenced by `tasks.install` keeps Celery's default: its own tasks may rely on
    revokes. Set in the worker's options before its consumer (the last step) is built from them."""

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        worker.options["without_mingle"] = True
        super().__init__(worker, **kwargs)
