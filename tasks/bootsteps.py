"""The worker bootstep that runs the reaper (every tick), the sweeper and the large-run promoter on the timer."""

from __future__ import annotations

from typing import Any

import structlog
from celery import bootsteps

from fenced.settings import get_settings

log = structlog.get_logger("tasks.bootsteps")


class LivenessStep(bootsteps.StartStopStep):
    """Reaper, sweeper and promoter in every worker's main process: nothing stays stranded or starved."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.refs: list[Any] = []

    def start(self, worker: Any) -> None:
        s = get_settings()
        self.refs = [
            worker.timer.call_repeatedly(s.reaper_tick_ms / 1000, self.reap),
            worker.timer.call_repeatedly(min(s.sweeper_interval_ms, s.sweeper_grace_ms) / 1000, self.sweep),
            worker.timer.call_repeatedly(s.large_promote_every_ms / 1000, self.promote),
        ]
        if s.fast_takeover:
            self.refs.append(worker.timer.call_repeatedly(s.liveness_tick_ms / 1000, self.check_connections))

    def stop(self, worker: Any) -> None:
        for ref in self.refs:
            ref.cancel()
        self.refs = []

    @staticmethod
    def check_connections() -> None:
        from fencing.liveness import check_connections
        from tasks.app import send_rescue

        try:
            check_connections(send_rescue)
        except Exception as exc:
            log.warning("liveness_tick_failed", error=repr(exc))

    @staticmethod
    def reap() -> None:
        from fencing.reaper import reap
        from tasks.app import send_rescue

        try:
            reap(send_rescue, get_settings().lease_ttl_ms)
        except Exception as exc:  # a tick must never kill the timer
            log.warning("reaper_tick_failed", error=repr(exc))

    @staticmethod
    def sweep() -> None:
        from fencing.sweeper import sweep
        from tasks.app import send_rescue

        try:
            sweep(send_rescue)
        except Exception as exc:
            log.warning("sweeper_tick_failed", error=repr(exc))

    @staticmethod
    def promote() -> None:
        from fencing.fairness import promote_large
        from tasks import queues

        try:
            # One worker per interval (a SET NX PX lock inside), so the pace does not grow with the pool.
            promote_large(queues.LARGE, queues.NORMAL, get_settings().large_promote_every_ms)
        except Exception as exc:
            log.warning("promoter_tick_failed", error=repr(exc))
