"""tasks/kombu_client_cache.py: a channel's publishes share one redis-py client, rebuilt with its pool.

Real Redis, the real Celery app and its producer pool (the path every wake-up takes)."""

from __future__ import annotations

import redis

from tasks import queues
from tasks.celery_app import RUN_TASK, app
from tasks.kombu_client_cache import _PATCHED


def _publish(run_id: str) -> None:
    app.send_task(RUN_TASK, args=(run_id, 1), task_id=f"cache-{run_id}", queue=queues.CONTINUE,
                  routing_key=queues.CONTINUE)


def _channel():  # the producer pool's channel the sends above went through
    with app.producer_or_acquire() as producer:
        return producer.channel


def test_publishes_reuse_one_client_per_channel_and_every_message_lands(redis_client):
    _publish("a")
    channel = _channel()
    first = channel.__dict__.get(_PATCHED)
    assert isinstance(first, redis.Redis), "the publish went through the cached client"
    for name in ("b", "c", "d"):
        _publish(name)
    assert _channel() is channel
    assert channel.__dict__[_PATCHED] is first, "later publishes reuse the channel's client"
    assert redis_client.llen(queues.CONTINUE) == 4, "every publish reached the broker"


def test_a_new_pool_gets_a_new_client_and_publishing_goes_on(redis_client):
    _publish("before")
    channel = _channel()
    old = channel.__dict__[_PATCHED]
    channel._disconnect_pools()  # what kombu does when the connection drops (and Sentinel on a new master)
    _publish("after")
    new = channel.__dict__[_PATCHED]
    assert new is not old and new.connection_pool is channel.pool, "the client follows the channel's pool"
    assert redis_client.llen(queues.CONTINUE) == 2
