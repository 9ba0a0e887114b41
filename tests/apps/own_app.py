"""A user's own Celery app with fenced installed into it (`celery -A tests.apps.own_app worker`)."""

from __future__ import annotations

from celery import Celery

import fenced
from fenced import FencedTask, step

app = fenced.install(Celery("shop-backend"))


@step
def double(n: int) -> int:
    return 2 * n


@app.task(base=FencedTask, name="own_app.twice")
def twice(n: int) -> int:
    return double(double(n))
