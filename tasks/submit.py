"""submit_run: admission, then the run row and its billing hold in one transaction, then the first wake-up."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection

from checkpoints import billing, runs
from checkpoints.db import in_txn, is_missing_schema, transaction
from fenced_core.errors import FencedOut, InvalidRequest, StoreUnavailable
from fencing import admission, events
from tasks import queues, wakeup

log = structlog.get_logger("tasks.submit")

# The queues first wake-ups wait in: what the global admission limit counts.
ADMISSION_QUEUES = (queues.NORMAL, queues.LARGE)
# Run ids made from a client's idempotency key live in their own namespace (uuid5 of user and key).
_KEYED_RUNS = uuid.UUID("6f2b1d0e-7a43-5c1e-9b7e-0d4c6a1f3e25")


def run_id_for_key(user_id: str, idempotency_key: str) -> str:
    """The run id a submit with this key gets: the same for the same user and key, byte for byte."""
    return str(uuid.uuid5(_KEYED_RUNS, f"{len(user_id)}:{user_id}:{idempotency_key}"))


def submit_run(user_id: str, query: str, kind: str = "normal", idempotency_key: str | None = None, *,
               agent: str | None = None, agent_version: str = "") -> str:
    """Create a run and wake it; returns the run id (= the Celery task id of its first message).

    `agent` names the program that runs it (an Agent or a FencedTask registered in the workers;
    FENCED_DEFAULT_AGENT when None) and `agent_version` the version of its tools or steps.

    With `idempotency_key`, a retried submit (same user, same key) returns the run the first one
    created and creates nothing; the same key with another query or kind is refused. Whenever the run
    exists, its id is returned: a worker that claims it before this call appends its first event, or
    a commit whose reply was lost, never turns into an error that would invite a second submit.

    Raises AdmissionRefused (a limit; see `retry_after_s`), InsufficientCredits or InvalidRequest, and
    then nothing was written. If the process dies between the commit and the send, the sweeper sends
    the wake-up."""
    from fenced_core.settings import get_settings

    agent = agent or get_settings().default_agent
    runs.validate_request(user_id, kind, query)
    if len(agent) > 128 or len(agent_version) > 32:
        raise InvalidRequest("agent must be at most 128 characters and agent_version at most 32")
    if idempotency_key is not None:
        if not idempotency_key or len(idempotency_key) > 200:
            raise InvalidRequest("idempotency_key must be 1 to 200 characters")
        run_id = run_id_for_key(user_id, idempotency_key)
        existing = runs.peek_run(run_id)
        if existing is not None:
            _same_request(existing, user_id, query, kind, agent)
            log.info("submit_deduplicated", run_id=run_id, epoch=existing.epoch)
            return run_id
    else:
        run_id = runs.new_run_id()
    admission.admit(run_id, user_id, ADMISSION_QUEUES)
    try:
        credits = in_txn(_create_once_txn, run_id, user_id, kind, query, agent, agent_version)
    except sa.exc.IntegrityError:
        # A concurrent submit with the same key inserted the run first: that one is the run.
        existing = runs.peek_run(run_id)
        if existing is None:
            admission.release_slot(user_id, run_id)
            raise
        _same_request(existing, user_id, query, kind, agent)
        return run_id
    except BaseException:
        if not _may_exist(run_id):
            admission.release_slot(user_id, run_id)  # no run: the slot goes back
        raise
    try:
        events.append(run_id, 0, "run:queued", "run_queued", 0, {"kind": kind, "credits_held": credits})
    except FencedOut:
        pass  # a worker claimed the run already: its stream goes on without the queued event
    except StoreUnavailable as exc:  # the stream is best effort; the row is the truth
        log.warning("queued_event_failed", run_id=run_id, epoch=0, error=repr(exc))
    try:
        wakeup.send(run_id, None, "submit", kind=kind)
    except Exception as exc:  # any broker error: committed is committed, the sweeper sends the wake-up
        log.error("wakeup_send_failed", run_id=run_id, epoch=0, error=repr(exc))
    else:
        log.info("submitted", run_id=run_id, epoch=0, kind=kind, credits_held=credits)
    finally:
        # The message now counts in the queue's list (or the sweeper owns the send): not unsent any more.
        admission.mark_sent(run_id)
    return run_id


def _create_once_txn(conn: Connection, run_id: str, user_id: str, kind: str, query: str, agent: str,
                     agent_version: str) -> int:
    """create_run_txn, unless this run id exists already: a retry of a transaction whose commit landed
    (its reply lost). Returns the credits held."""
    existing = runs.peek_run_txn(conn, run_id)
    if existing is not None:
        _same_request(existing, user_id, query, kind, agent)
        return billing.hold_credits(existing.kind)
    return runs.create_run_txn(conn, run_id, user_id, kind, query, "api", agent, agent_version)


def _same_request(run: runs.Run, user_id: str, query: str, kind: str, agent: str) -> None:
    if (run.user_id, run.query, run.kind, run.agent) != (user_id, query, kind, agent):
        raise InvalidRequest(f"idempotency key already used for run {run.run_id} with a different query, kind or "
                             "agent; "
                             "use a new key for a new request")


def _may_exist(run_id: str) -> bool:
    """Whether the run may exist after a failed create: one read, no retries (the store may be down).
    When it cannot be told, the slot is kept; the sweeper frees slots of runs that never got a row."""
    try:
        with transaction(readonly=True) as conn:
            return runs.peek_run_txn(conn, run_id) is not None
    except Exception as exc:
        return not is_missing_schema(exc)  # no tables: no run
