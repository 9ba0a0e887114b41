"""submit_run and submit_many: admission, then run rows and billing holds in one transaction, then first wake-ups."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Connection

from checkpoints import billing, create_one_trip, runs
from checkpoints.db import db_retry, in_txn, is_missing_schema, one_trip, transaction
from fenced_core.errors import (
    AdmissionRefused,
    FencedOut,
    IdempotencyConflict,
    InsufficientCredits,
    InvalidRequest,
    StoreUnavailable,
)
from fenced_core.settings import get_settings
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
    then nothing was written. If the process crashes between the commit and the send, the sweeper sends
    the wake-up. Once submitted, the run survives worker crashes and takeovers on its own: extra
    wake-ups are harmless (the row decides), and its hold is settled once whoever finishes it."""
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
        attempts = [0]

        @db_retry
        def create() -> int:
            attempts[0] += 1
            if attempts[0] == 1 and one_trip():
                # One round trip (checkpoints.create_one_trip); its id is fresh or was looked up above.
                return create_one_trip.create_run(runs.NewRun(run_id, user_id, kind, query, agent, agent_version),
                                                  "api")
            # A retry's first commit may have landed (its reply lost): it looks for the run first.
            with transaction() as conn:
                return _create_once_txn(conn, run_id, user_id, kind, query, agent, agent_version,
                                        peek=attempts[0] > 1)

        credits = create()
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
        wakeup.send(run_id, 0, "submit", kind=kind)  # step 0: no row read before its claim
    except Exception as exc:  # any broker error: committed is committed, the sweeper sends the wake-up
        log.error("wakeup_send_failed", run_id=run_id, epoch=0, error=repr(exc))
    else:
        log.info("submitted", run_id=run_id, epoch=0, kind=kind, credits_held=credits)
    finally:
        # The message now counts in the queue's list (or the sweeper owns the send): not unsent any more.
        admission.mark_sent(run_id)
    return run_id


def _create_once_txn(conn: Connection, run_id: str, user_id: str, kind: str, query: str, agent: str,
                     agent_version: str, *, peek: bool = True) -> int:
    """create_run_txn, unless this run id exists already: a retry of a transaction whose commit landed
    (its reply lost). Returns the credits held."""
    # The batch form's prebuilt statements: the same rows as create_run_txn, less SQL built per call.
    result = runs.create_runs_txn(conn, [runs.NewRun(run_id, user_id, kind, query, agent, agent_version)], "api",
                                  peek=peek)[0]
    if isinstance(result, runs.Run):
        _same_request(result, user_id, query, kind, agent)
        return billing.hold_credits(result.kind)
    if isinstance(result, InsufficientCredits):
        raise result
    return result


def _same_request(run: runs.Run, user_id: str, query: str, kind: str, agent: str) -> None:
    if (run.user_id, run.query, run.kind, run.agent) != (user_id, query, kind, agent):
        raise IdempotencyConflict(f"idempotency key already used for run {run.run_id} with a different query, kind "
                                  "or agent; use a new key for a new request")


def _may_exist(run_id: str) -> bool:
    """Whether the run may exist after a failed create: one read, no retries (the store may be down).
    When it cannot be told, the slot is kept; the sweeper frees slots of runs that never got a row."""
    try:
        with transaction(readonly=True) as conn:
            return runs.peek_run_txn(conn, run_id) is not None
    except Exception as exc:
        return not is_missing_schema(exc)  # no tables: no run


@dataclass(frozen=True)
class SubmitRequest:
    """One run for submit_many: what submit_run takes (`input` is its query), as a value.

    With an `idempotency_key`, submitting it again after a crash of the submitter (the reply lost) returns
    the run the first submit created; nothing is run twice. A takeover of the run does not concern it."""

    user_id: str
    input: str
    kind: str = "normal"
    idempotency_key: str | None = None
    agent: str | None = None  # None: FENCED_DEFAULT_AGENT
    agent_version: str = ""


@dataclass(frozen=True)
class SubmitOutcome:
    """One request's outcome: the run id (created now, or earlier under the same idempotency key:
    `deduplicated`), or the refusal (AdmissionRefused, InsufficientCredits or InvalidRequest, with its
    message), and then nothing was written for that request.

    `run_id` names a committed run: if the submitter crashes after the commit and before the wake-up, the
    sweeper sends it; a takeover of the run later does not change the id."""

    run_id: str | None
    refused: AdmissionRefused | InvalidRequest | None = None
    deduplicated: bool = False


def submit_many(requests: Sequence[SubmitRequest]) -> list[SubmitOutcome]:
    """Submit many runs in a few round trips; one outcome per request, in order.

    Each request is all-or-nothing on its own, exactly as submit_run: an accepted one gets its row,
    hold, ledger entry, admission slot, queued event and first wake-up; a refused one gets nothing
    (no row, no hold, no slot, no message). One pipelined admission call for the batch, one database
    transaction for every row, hold and ledger entry, one pipeline for the queued events, then the
    wake-ups. The same idempotency key twice in a batch: the second is a retry of the first (its
    outcome, `deduplicated`), or refused if its request differs.

    A crash after the admission and before the commit leaves slots the sweeper frees (no row) and
    unsent entries pruned after admission.UNSENT_TTL_MS; a crash after the commit and before the
    wake-ups leaves queued runs the sweeper wakes. A store failure raises (StoreUnavailable) after
    giving back the slots of runs that do not exist; a retry then with the same keys is safe. Runs
    submitted in a batch are independent afterwards: a takeover of one never touches another."""
    default_agent = get_settings().default_agent
    out: list[SubmitOutcome | None] = [None] * len(requests)
    pending: list[tuple[int, runs.NewRun]] = []
    first_of_key: dict[str, int] = {}
    repeats: list[tuple[int, int]] = []  # (request, earlier request with the same user and key)
    for i, r in enumerate(requests):
        agent = r.agent or default_agent
        try:
            _check(r, agent)
        except InvalidRequest as exc:
            out[i] = SubmitOutcome(None, exc)
            continue
        if r.idempotency_key is None:
            run_id = runs.new_run_id()
        else:
            run_id = run_id_for_key(r.user_id, r.idempotency_key)
            if run_id in first_of_key:
                repeats.append((i, first_of_key[run_id]))
                continue
            first_of_key[run_id] = i
        pending.append((i, runs.NewRun(run_id, r.user_id, r.kind, r.input, agent, r.agent_version)))
    if first_of_key:  # keys used before: the run they made is the answer, and nothing is admitted for it
        stored = in_txn(runs.peek_runs_txn, list(first_of_key))
        keep = []
        for i, n in pending:
            if n.run_id in stored:
                out[i] = _existing(stored[n.run_id], n)
            else:
                keep.append((i, n))
        pending = keep
    verdicts = admission.admit_many([(n.run_id, n.user_id) for _, n in pending], ADMISSION_QUEUES)
    admitted = []
    for (i, n), verdict in zip(pending, verdicts, strict=True):
        if isinstance(verdict, AdmissionRefused):
            out[i] = SubmitOutcome(None, verdict)
        else:
            admitted.append((i, n))
    woken = _create(admitted, out)
    _wake(woken)
    for i, first in repeats:
        a, b = requests[i], requests[first]
        same = (a.input, a.kind, a.agent or default_agent) == (b.input, b.kind, b.agent or default_agent)
        earlier = out[first]
        assert earlier is not None
        used = f"already used for run {earlier.run_id}" if earlier.run_id else "used twice in this batch"
        out[i] = (SubmitOutcome(earlier.run_id, earlier.refused, deduplicated=True) if same else SubmitOutcome(
            None, IdempotencyConflict(f"idempotency key {a.idempotency_key!r} {used} with a different query, kind or "
                                 "agent; use a new key for a new request")))
    return [o if o is not None else SubmitOutcome(None, InvalidRequest("not submitted")) for o in out]


def _check(r: SubmitRequest, agent: str) -> None:
    runs.validate_request(r.user_id, r.kind, r.input)
    if len(agent) > 128 or len(r.agent_version) > 32:
        raise InvalidRequest("agent must be at most 128 characters and agent_version at most 32")
    if r.idempotency_key is not None and (not r.idempotency_key or len(r.idempotency_key) > 200):
        raise InvalidRequest("idempotency_key must be 1 to 200 characters")


def _existing(run: runs.Run, n: runs.NewRun) -> SubmitOutcome:
    try:
        _same_request(run, n.user_id, n.query, n.kind, n.agent)
    except InvalidRequest as exc:
        return SubmitOutcome(None, exc)
    return SubmitOutcome(run.run_id, deduplicated=True)


def _create(admitted: list[tuple[int, runs.NewRun]], out: list[SubmitOutcome | None]) -> list[runs.NewRun]:
    """The one transaction for the admitted runs; fills their outcomes, gives back the slots of runs
    refused in it, and returns the runs to wake."""
    if not admitted:
        return []
    new = [n for _, n in admitted]
    attempts = [0]

    def txn(conn: Connection) -> list[int | InsufficientCredits | runs.Run]:
        # A first attempt's ids cannot be stored yet (fresh, or keys looked up before admission); any
        # later one (a lost commit reply, a concurrent submit of the same key) looks first.
        attempts[0] += 1
        return runs.create_runs_txn(conn, new, "api", peek=attempts[0] > 1)

    for tries_left in (2, 1, 0):
        try:
            results = in_txn(txn)
            break
        except sa.exc.IntegrityError:
            # A concurrent submit inserted a keyed run first: the next try finds it (a Run result).
            if tries_left:
                continue
            _give_back(new)
            raise
        except BaseException:
            _give_back(new)
            raise
    woken, release = [], []
    for (i, n), result in zip(admitted, results, strict=True):
        if isinstance(result, InsufficientCredits):
            out[i] = SubmitOutcome(None, result)
            release.append((n.user_id, n.run_id))
        elif isinstance(result, runs.Run):
            # Ours if its commit landed and the reply was lost, else a concurrent submit's: a second
            # wake-up for it is harmless (the row decides what each copy does), a missing one is not.
            out[i] = _existing(result, n)
            if out[i].run_id is not None:  # type: ignore[union-attr]
                woken.append(n)
        else:
            out[i] = SubmitOutcome(n.run_id)
            woken.append(n)
    admission.release_slots(release)
    return woken


def _give_back(new: list[runs.NewRun]) -> None:
    """After a failed transaction: give back the slots of runs that surely do not exist. When that
    cannot be told (the store is down), the slots stay; the sweeper frees slots of runs without a row."""
    try:
        with transaction(readonly=True) as conn:
            found = runs.peek_runs_txn(conn, [n.run_id for n in new])
    except Exception as exc:
        if not is_missing_schema(exc):
            return
        found = {}
    admission.release_slots([(n.user_id, n.run_id) for n in new if n.run_id not in found])


def _wake(woken: list[runs.NewRun]) -> None:
    """The queued events (one pipeline, best effort) and the first wake-ups of committed runs; a lost
    send is the sweeper's to repeat."""
    if not woken:
        return
    credits = {n.run_id: billing.hold_credits(n.kind) for n in woken}
    queued = [(n.run_id, events.Event("run:queued", "run_queued", 0, 0,
                                      {"kind": n.kind, "credits_held": credits[n.run_id]})) for n in woken]
    try:
        events.append_first_of_many(queued)  # a None reply: a worker claimed the run first; its stream goes on
    except Exception as exc:  # the stream is best effort; the row is the truth
        log.warning("queued_events_failed", run_ids=[n.run_id for n in woken], epoch=0, error=repr(exc))
    try:
        with wakeup.batch():  # one broker round trip for the batch's wake-ups
            for n in woken:
                try:
                    wakeup.send(n.run_id, 0, "submit", kind=n.kind)
                except Exception as exc:  # committed is committed: the sweeper sends the wake-up
                    log.error("wakeup_send_failed", run_id=n.run_id, epoch=0, error=repr(exc))
    except Exception as exc:  # the batch's flush failed: delivery uncertain, the sweeper repeats what was lost
        log.error("wakeup_send_failed", run_ids=[n.run_id for n in woken], epoch=0, error=repr(exc))
    finally:
        admission.mark_sent_many([n.run_id for n in woken])
    log.info("submitted_many", run_ids=[n.run_id for n in woken], epoch=0)
