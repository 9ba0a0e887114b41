"""The baseline: the same 4-step agent as a plain self-chaining Celery task, no leases, no checkpoints.

`celery -A bench.plain_app worker` runs it with the project's celeryconfig (late acks, prefetch 1,
the same broker and queues); the run's state travels in the message, as it would without a store.
The last step records its finish time in Redis (`bench:plain:done`, run id -> ms) and pushes the run id
to `bench:plain:done:<run_id>` for a caller that waits on one run.
"""

from __future__ import annotations

import time
from typing import Any

from celery import Celery

from bench.work import agent_step
from tasks import queues

app = Celery("bench_plain")
app.config_from_object("celeryconfig")

DONE = "bench:plain:done"


def done_key(run_id: str) -> str:
    return f"{DONE}:{run_id}"


@app.task(name="bench.plain_step", bind=True, acks_late=True, ignore_result=True)
def plain_step(self: Any, run_id: str, step: int = 0, history: list[dict[str, Any]] | None = None) -> None:
    history, answer = agent_step(run_id, step, history or [])
    if answer is None:
        plain_step.apply_async(args=(run_id, step + 1, history), queue=queues.CONTINUE, routing_key=queues.CONTINUE)
        return
    from fencing.connection import get_redis

    pipe = get_redis().pipeline(transaction=False)
    pipe.hset(DONE, run_id, int(time.time() * 1000))
    pipe.rpush(done_key(run_id), "1")
    pipe.execute()


def submit(run_id: str) -> None:
    plain_step.apply_async(args=(run_id, 0, []), queue=queues.NORMAL, routing_key=queues.NORMAL)
