"""Anti-starvation: now and then the oldest large run moves to the front of the normal queue."""

from __future__ import annotations

import base64
import json

import structlog

from checkpoints import ledger
from fencing import keys, scripts
from fencing.broker import get_broker_redis
from fencing.connection import get_redis, process_token
from fencing.scripts import scripts_for
from fencing.turns import take_turn

log = structlog.get_logger("fencing.fairness")


def promote_large(large_queue: str, normal_queue: str, interval_ms: int, force: bool = False) -> str | None:
    """Move the oldest large message ahead of the normal backlog if both queues wait and no worker
    promoted within `interval_ms` (or `force`). Returns the promoted run id ("" if unreadable), or None."""
    if not force and not take_turn(get_redis(), keys.PROMOTER_LOCK, process_token(), interval_ms):
        return None
    broker = get_broker_redis()
    moved = scripts_for(broker)(scripts.promote(large_queue_key=keys.broker_queue(large_queue),
                                                normal_queue_key=keys.broker_queue(normal_queue)))
    if not moved:
        return None
    run_id = run_id_of(moved)
    log.info("large_promoted", run_id=run_id, to=normal_queue)
    if run_id:
        try:
            ledger.record(run_id, -1, process_token(), "promoted",
                          f"waited in {large_queue} behind a {normal_queue} backlog; moved to its front")
        except Exception as exc:  # the move is done; the record is best effort
            log.warning("promote_record_failed", run_id=run_id, error=repr(exc))
    return run_id


def run_id_of(message: str) -> str:
    """The run a kombu message wakes: run_agent's first argument (the task id is the run id only for the
    first wake-up). "" if the envelope cannot be read."""
    try:
        envelope = json.loads(message)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return str(args[0])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        log.warning("promoted_message_unreadable", error=repr(exc))
        return ""
