"""`install(app)`: put fenced into a Celery app of your own (the documented equivalent of `-A tasks`)."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.defaults import DEFAULTS

from fenced_core.errors import ConfigError


def install(app: Celery) -> Celery:
    """Give `app` what `celery -A tasks worker` has: the run task (`fenced.run_agent`), fenced's queues and
    transport defaults (late acks, prefetch 1, the continuation queue consumed first, the threads pool),
    the liveness bootstep (reaper, sweeper, liveness checks) and the worker signals (schema migration,
    drain bound). Your own settings win over fenced's defaults, except the broker: wake-ups are sent
    on FENCED_BROKER_URL, so an app configured for another broker is refused (ConfigError) rather than
    left waiting for messages that never come. Returns `app`; calling it twice changes nothing.

    What it installs is what keeps runs through crashes and takeovers on your app's workers: late acks
    (a message lives until its delivery ended), the reaper and fast takeover (a dead holder's run is
    taken over within seconds), the sweeper (a run whose wake-up was lost is woken again)."""
    import celeryconfig
    from fenced_core.settings import get_settings
    from tasks.app import RunEnded, RunRequest, run_agent
    from tasks.bootsteps import LivenessStep, SlotsStep
    from tasks.metrics import MetricsStep
    from tasks.routing_worker import RoutingStep

    if app.main == "fenced" and "fenced.run_agent" in app.tasks:
        return app  # fenced's own app
    broker = get_settings().effective_broker_url
    theirs = app.conf.get("broker_url") if "broker_url" in app.conf.changes else None
    if theirs and theirs != broker:
        raise ConfigError(f"this Celery app's broker_url is not fenced's broker ({theirs!r}); set FENCED_BROKER_URL "
                          "to it, so wake-ups reach this app's workers")
    defaults: dict[str, Any] = {name: getattr(celeryconfig, name) for name in dir(celeryconfig)
                                if name in DEFAULTS}
    app.add_defaults(defaults)
    if "fenced.run_agent" not in app.tasks:
        app.task(name="fenced.run_agent", bind=True, acks_late=True, ignore_result=True, Request=RunRequest,
                 throws=(RunEnded,))(run_agent.run.__func__)
    if LivenessStep not in app.steps["worker"]:
        app.steps["worker"].add(LivenessStep)
    if SlotsStep not in app.steps["worker"]:
        app.steps["worker"].add(SlotsStep)
    if MetricsStep not in app.steps["worker"]:
        app.steps["worker"].add(MetricsStep)
    if RoutingStep not in app.steps["worker"]:
        app.steps["worker"].add(RoutingStep)
    return app
