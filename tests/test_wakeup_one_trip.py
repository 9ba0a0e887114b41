"""tasks.wakeup: one wake-up, one broker round trip. With task-sent events on (the default, for Flower) a
Celery publish is the message's LPUSH and then its event's PUBLISH; a wake-up sent alone goes as a
kombu publish batch of one, both commands in one pipeline, and a failed batch is sent again as Celery's
own publish retry would send it."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.connection as rc
import structlog
from kombu.exceptions import BatchPublishError
from kombu.transport import redis as kombu_redis

from fencing import keys
from tasks import queues, wakeup
from tasks.celery_app import app


@pytest.fixture
def conf() -> Iterator[Any]:
    """Celery's settings, put back after the test (its Settings cannot be monkeypatched: no delattr)."""
    names = ("task_send_sent_event", "task_publish_retry", "task_publish_retry_policy")
    saved = {name: app.conf[name] for name in names}
    yield app.conf
    app.conf.update(saved)


@pytest.fixture
def broker_trips(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every round trip any redis-py connection of this process sends: its commands' names, in order."""
    trips: list[list[str]] = []
    send = rc.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> Any:
        chunks = [command] if isinstance(command, (bytes, str)) else list(command)
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        names, i = [], 0
        while i < len(data):  # RESP arrays: *n, then n bulk strings; the first is the command
            j = data.index(b"\r\n", i)
            parts, i = int(data[i + 1:j]), j + 2
            for k in range(parts):
                j = data.index(b"\r\n", i)
                size = int(data[i + 1:j])
                if k == 0:
                    names.append(data[j + 2:j + 2 + size].decode().lower())
                i = j + 2 + size + 2
        trips.append(names)
        return send(self, command, check_health)

    monkeypatch.setattr(rc.AbstractConnection, "send_packed_command", counted)
    yield trips


def _body(raw: bytes | str) -> str:
    """A message's body out of kombu's envelope (base64 JSON)."""
    envelope = json.loads(raw)
    body = envelope["body"]
    return base64.b64decode(body).decode() if envelope["properties"].get("body_encoding") == "base64" else body


def _queued(redis_client: Any, queue: str) -> list[tuple[Any, ...]]:
    """The wake-ups waiting in `queue`: (run id, step) each, oldest first."""
    return [tuple(json.loads(_body(m))[0]) for m in reversed(redis_client.lrange(keys.broker_queue(queue), 0, -1))]


@pytest.mark.parametrize(("reason", "queue"), [("continuation", queues.CONTINUE), ("rescue", queues.CONTINUE),
                                               ("reply", queues.CONTINUE), ("submit", queues.NORMAL)])
def test_a_wake_up_and_its_sent_event_go_in_one_round_trip(mysql_store, redis_client, broker_trips, reason, queue):
    sub = redis_client.pubsub()
    sub.psubscribe("*celeryev*")
    sub.get_message(timeout=1)  # the subscription's own reply
    for _ in range(2):  # warm: the producer pool, the queue's declaration
        wakeup.send(f"warm-{reason}", 1, reason)  # type: ignore[arg-type]
    while sub.get_message(timeout=0.2):
        pass
    redis_client.delete(keys.broker_queue(queue))
    broker_trips.clear()

    wakeup.send("r-1", 4, reason)  # type: ignore[arg-type]

    sent = [trip for trip in broker_trips if "lpush" in trip or "rpush" in trip or "publish" in trip]
    assert len(sent) == 1, f"the message and its task-sent event in one round trip, not {broker_trips}"
    assert sorted(sent[0]) == sorted([("rpush" if reason == "rescue" else "lpush"), "publish"])
    assert len(redis_client.lrange(keys.broker_queue(queue), 0, -1)) == 1
    event = sub.get_message(timeout=2)
    assert event is not None and json.loads(_body(event["data"]))["type"] == "task-sent"
    sub.close()




def test_without_task_events_a_wake_up_is_celerys_own_publish(mysql_store, redis_client, broker_trips, conf,
                                                              monkeypatch):
    """One command to send: no batch (Celery's publish, with its own connection retry)."""
    conf.task_send_sent_event = False
    batches: list[object] = []
    made = kombu_redis.Channel.create_publish_batch
    monkeypatch.setattr(kombu_redis.Channel, "create_publish_batch",
                        lambda self, max_size: batches.append(self) or made(self, max_size))
    wakeup.send("warm", 1, "continuation")
    broker_trips.clear()
    wakeup.send("r-1", 2, "continuation")
    sent = [trip for trip in broker_trips if "lpush" in trip or "publish" in trip]
    assert sent == [["lpush"]] and batches == []


@dataclass
class Flushes:
    failing: int = 1  # how many flushes fail before they go through (-1: every one)
    made: int = 0


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch, conf: Any) -> Iterator[Flushes]:
    """Make a publish batch's flush fail as a dropped broker connection fails it: kombu's BatchPublishError,
    nothing sent. Celery's retry policy with short waits."""
    seen = Flushes()
    flush = kombu_redis.PublishBatch.flush

    def flaky(self: Any) -> None:
        seen.made += 1
        if seen.failing < 0 or seen.made <= seen.failing:
            self._buffered = 0
            self.pipeline.reset()
            self._failed = ConnectionError("the broker connection dropped")
            raise BatchPublishError("Redis publish batch failed; delivery is uncertain") from self._failed
        flush(self)

    monkeypatch.setattr(kombu_redis.PublishBatch, "flush", flaky)
    conf.task_publish_retry_policy = {"max_retries": 3, "interval_start": 0, "interval_step": 0.01,
                                      "interval_max": 0.01}
    yield seen


def test_a_failed_one_trip_send_is_sent_again(mysql_store, redis_client, flushes):
    with structlog.testing.capture_logs() as logs:
        wakeup.send("r-1", 3, "continuation")
    assert _queued(redis_client, queues.CONTINUE) == [("r-1", 3)], "sent again, once"
    assert flushes.made == 2
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["wakeup_send_retried"]


def test_a_send_that_keeps_failing_raises_after_celerys_retries(mysql_store, redis_client, flushes):
    flushes.failing = -1
    with pytest.raises(BatchPublishError):
        wakeup.send("r-1", 3, "continuation")
    assert redis_client.llen(keys.broker_queue(queues.CONTINUE)) == 0
    assert flushes.made == 1 + 3, "the send, then Celery's three retries (max_retries)"


def test_no_retry_when_celerys_publish_retry_is_off(mysql_store, redis_client, flushes, conf):
    conf.task_publish_retry = False
    with pytest.raises(BatchPublishError):
        wakeup.send("r-1", 3, "continuation")
    assert redis_client.llen(keys.broker_queue(queues.CONTINUE)) == 0


def test_inside_an_open_batch_a_wake_up_joins_it(mysql_store, redis_client, broker_trips):
    wakeup.send("warm", 1, "continuation")
    broker_trips.clear()
    with wakeup.batch():
        for i in range(3):
            wakeup.send(f"r-{i}", 1, "continuation")
        assert redis_client.llen(keys.broker_queue(queues.CONTINUE)) == 1, "only the warm-up is out yet"
    sent = [trip for trip in broker_trips if "lpush" in trip]
    assert len(sent) == 1 and sent[0].count("lpush") == 3 and sent[0].count("publish") == 3
