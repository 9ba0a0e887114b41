"""A worker's registry heartbeat: its own daemon thread, so a long step (or a busy pool) never delays it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

from fenced_core.settings import get_settings
from fencing import registry

log = structlog.get_logger("routing.heartbeat")


def beat_once(name: str, info: dict[str, Any], running: int | None) -> None:
    """Write one heartbeat for `name`: `info` (host, pid, queues, ...), the true running count (None:
    leave the live count as it is) and the step stats of its last `routing_window` steps."""
    s = get_settings()
    avg, rate, count = registry.step_stats(name, s.routing_window)
    fields: dict[str, Any] = {**info, "steps": count, "avg_step_ms": "" if avg is None else f"{avg:.1f}",
                              "success_rate": "" if rate is None else f"{rate:.4f}"}
    if running is not None:
        fields["running"] = running
    registry.beat(name, fields)
    if info.get("queue"):
        registry.prune_pending(name, str(info["queue"]), registry.now_ms() - s.routing_heartbeat_ms)


class Heartbeat:
    """Beats every `routing_heartbeat_ms` until `stop()`. A failed beat is logged and the next one tried;
    a frozen or killed process stops beating, which is the signal (the scan marks it offline)."""

    def __init__(self, name: str, info: Callable[[], dict[str, Any]], running: Callable[[], int | None]) -> None:
        self.name = name
        self.info = info
        self.running = running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"fenced-heartbeat-{name}", daemon=True)
        self.beats = 0

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def beat(self) -> None:
        beat_once(self.name, self.info(), self.running())
        self.beats += 1

    def _loop(self) -> None:
        period = get_settings().routing_heartbeat_ms / 1000
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # Redis away: the next beat tries again; staying silent marks us offline
                log.warning("registry_beat_failed", worker=self.name, error=repr(exc))
            self._stop.wait(period)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
