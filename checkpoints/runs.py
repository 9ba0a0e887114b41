"""The run row: create with its hold, load, claim (epoch + 1), every fenced write, and every state change.

Every write after a claim is `UPDATE ... WHERE run_id = ? AND epoch = ?`; 0 rows raises FencedOut.
Writes set absolute values (never `x = x + 1`), so a transaction retried after a lost commit reply is
harmless. A run's state changes only here, through `change_state_txn` and the table TRANSITIONS.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from checkpoints import billing, codec, history, ledger
from checkpoints.db import db_retry, in_raw_txn, in_txn, one_trip, raw_txn, results, transaction
from checkpoints.schema import LIVE_STATES, dead_letters, run_attempts, run_checkpoints, run_ledger, run_steps
from fenced_core.errors import FencedOut, InsufficientCredits, InvalidRequest

# Every run-row state change there is (DESIGN "States"), each named by the operation that makes it. A
# change not listed here is refused by change_state_txn before any SQL runs.
TRANSITIONS: dict[tuple[str, str], str] = {
    ("queued", "running"): "claim",
    ("running", "running"): "claim",  # the next step's delivery, or a takeover of a holder that went quiet
    ("running", "waiting"): "park",  # ask_user or a fixable error: parked on a person
    ("running", "done"): "finish",
    ("running", "failed"): "finish",
    ("running", "dead"): "dead_letter",
    ("waiting", "queued"): "reply",  # also the sweeper's requeue of a wait whose questions are all answered
    ("queued", "cancelled"): "cancel",
    ("running", "cancelled"): "cancel",
    ("waiting", "cancelled"): "cancel",
    ("queued", "failed"): "expire",  # the hold expired before any worker claimed the run
    ("dead", "queued"): "replay",
}


class IllegalTransition(ValueError):
    """A state change TRANSITIONS does not list: a bug in the caller, refused before anything is written."""


# Hot-path statements are built once with bind parameters: constructing a SQLAlchemy statement costs
# about 0.1 ms of CPU each time, and a step runs about ten of them (see docs/benchmarks.md).
_rc = run_checkpoints.c
_GET_RUN = sa.select(run_checkpoints).where(_rc.run_id == sa.bindparam("w_run_id"))
_GET_RUN_LOCKED = _GET_RUN.with_for_update()
# Everything but the checkpoint blob: what a delivery needs to decide whether to take the lease at all.
_PEEK_RUN = sa.select(*[c for c in run_checkpoints.c if c.name != "checkpoint"]).where(
    _rc.run_id == sa.bindparam("w_run_id"))
_CLAIM = run_checkpoints.update().where(
    _rc.run_id == sa.bindparam("w_run_id"), _rc.epoch == sa.bindparam("w_epoch"), _rc.state.in_(LIVE_STATES),
).values(epoch=sa.bindparam("v_epoch"), owner=sa.bindparam("v_owner"), state="running",
         deliveries=sa.bindparam("v_deliveries"), total_deliveries=sa.bindparam("v_total_deliveries"),
         updated_at_ms=sa.bindparam("v_updated_at_ms"))
_OWN_ATTEMPT = sa.select(run_attempts.c.id).where(
    run_attempts.c.run_id == sa.bindparam("w_run_id"), run_attempts.c.epoch == sa.bindparam("w_epoch"),
    run_attempts.c.worker == sa.bindparam("w_worker"))
_INSERT_ATTEMPT = run_attempts.insert()
_INSERT_STEP = run_steps.insert()
_END_ATTEMPT = run_attempts.update().where(run_attempts.c.id == sa.bindparam("w_id")).values(
    ended_at_ms=sa.bindparam("v_ended_at_ms"), outcome=sa.bindparam("v_outcome"), error=sa.bindparam("v_error"))


@functools.cache
def _fenced_update(columns: tuple[str, ...]) -> sa.Update:
    """`UPDATE run_checkpoints SET <columns> WHERE run_id = ? AND epoch = ? AND state = 'running'`, built
    once per column set. Every holder write expects the state its claim set: a write retried after
    its first commit landed (and a person already moved the run on) must not undo that move."""
    return run_checkpoints.update().where(
        _rc.run_id == sa.bindparam("w_run_id"), _rc.epoch == sa.bindparam("w_epoch"), _rc.state == "running",
    ).values({c: sa.bindparam(f"v_{c}") for c in columns})


# -- the hot path: one round trip per transaction on MySQL/MariaDB (checkpoints.db.raw_txn) ------------
# Each transaction below is ONE multi-statement query that ends in its own COMMIT; the server runs it
# to the end whatever the first statement matched, so every statement after the fenced UPDATE is
# conditional on it (`@fenced`: the rows that UPDATE matched, FOUND_ROWS). A holder fenced out writes
# nothing and commits an empty transaction, and the caller raises FencedOut from the UPDATE's rowcount.
# SQLite runs the same queries statement by statement (checkpoints.sqlite_multi). The SQLAlchemy Core
# version of each (the `_txn` functions beside them) is what these queries are tested against
# (tests/test_terminal_one_trip.py, tests/test_step_done_claim.py), and what a store without raw_txn
# would run; every store the settings accept runs the queries.
_COLUMNS = [c.name for c in run_checkpoints.c]
_PEEK_COLUMNS = [c for c in _COLUMNS if c != "checkpoint"]
_RAW_PEEK = f"SELECT {', '.join(_PEEK_COLUMNS)} FROM run_checkpoints WHERE run_id = %s; COMMIT"
_RAW_GET_LOCKED = f"SELECT {', '.join(_COLUMNS)} FROM run_checkpoints WHERE run_id = %s FOR UPDATE"
_RAW_FENCE = "run_id = %s AND epoch = %s AND state = 'running'"
_RAW_STEP_ROW = ("INSERT INTO run_steps (run_id, step, epoch, phase, owner, prompt_tokens, completion_tokens, "
                 "checkpoint, at_ms) SELECT run_id, %s, %s, %s, %s, %s, %s, checkpoint, %s FROM run_checkpoints "
                 "WHERE run_id = %s AND @fenced = 1")  # the blob just written, read back (not sent twice)
_RAW_CHECKPOINT_A = (
    "UPDATE run_checkpoints SET phase = 'decided', checkpoint = %s, prompt_tokens = %s, completion_tokens = %s, "
    f"model_calls = %s, last_event_id = %s, updated_at_ms = %s WHERE {_RAW_FENCE}; "
    f"SET @fenced = ROW_COUNT(); {_RAW_STEP_ROW}; COMMIT")
_RAW_CHECKPOINT_B = (
    "UPDATE run_checkpoints SET step = %s, phase = 'done', checkpoint = %s, owner = NULL, deliveries = 0, "
    f"last_event_id = %s, updated_at_ms = %s WHERE {_RAW_FENCE}; "
    f"SET @fenced = ROW_COUNT(); {_RAW_STEP_ROW}; "
    "UPDATE run_attempts SET ended_at_ms = %s, outcome = 'step_done', error = NULL WHERE id = %s AND @fenced = 1; "
    "COMMIT")
# Checkpoint B and the inline claim of the next step in one transaction (write_step_done_and_claim): the
# row goes to step + 1 owned by the same delivery at epoch + 1; the step row, the attempt closed, the next
# attempt and the claim's ledger entry each conditional on the fenced UPDATE.
_RAW_CHECKPOINT_B_CLAIM = (
    "UPDATE run_checkpoints SET step = %s, phase = 'done', checkpoint = %s, epoch = %s, owner = %s, deliveries = %s, "
    f"total_deliveries = %s, last_event_id = %s, updated_at_ms = %s WHERE {_RAW_FENCE}; "
    f"SET @fenced = ROW_COUNT(); {_RAW_STEP_ROW}; "
    "UPDATE run_attempts SET ended_at_ms = %s, outcome = 'step_done', error = NULL WHERE id = %s AND @fenced = 1; "
    "INSERT INTO run_attempts (run_id, step, epoch, worker, started_at_ms) "
    "SELECT %s, %s, %s, %s, %s FROM DUAL WHERE @fenced = 1; "
    f"{ledger.RAW_INSERT_IF % '@fenced = 1'}; "
    "COMMIT")
_RAW_CLAIM = (
    "UPDATE run_checkpoints SET epoch = %s, owner = %s, state = 'running', deliveries = %s, total_deliveries = %s, "
    "updated_at_ms = %s WHERE run_id = %s AND epoch = %s AND state IN ('queued', 'running'); "
    "SET @fenced = ROW_COUNT(); "
    "INSERT INTO run_attempts (run_id, step, epoch, worker, started_at_ms) "
    "SELECT %s, %s, %s, %s, %s FROM DUAL WHERE @fenced = 1; "
    f"{ledger.RAW_INSERT_IF % '@fenced = 1'}; "
    "COMMIT")
# A wake-up's claim in ONE query, for a row as the wake-up expects it (claim_or_row): the locked read, then
# the compare-and-set guarded by every column the claim's plan reads (state, step, phase, owner, deliveries)
# with the counters raised by the database on the locked row, the attempt row and the ledger entry taking
# the epoch it wrote, each conditional on the update, and the COMMIT.
_RAW_CLAIM_AS_EXPECTED = (
    f"{_RAW_GET_LOCKED}; "
    "UPDATE run_checkpoints SET epoch = epoch + 1, owner = %s, state = 'running', deliveries = 1, "
    "total_deliveries = total_deliveries + 1, updated_at_ms = %s WHERE run_id = %s AND state IN ('queued', 'running') "
    "AND step = %s AND phase = %s AND owner IS NULL AND deliveries = 0; "
    "SET @fenced = ROW_COUNT(); "
    "INSERT INTO run_attempts (run_id, step, epoch, worker, started_at_ms) "
    "SELECT run_id, step, epoch, %s, %s FROM run_checkpoints WHERE run_id = %s AND @fenced = 1; "
    "INSERT INTO run_ledger (run_id, at_ms, epoch, actor, kind, reason, detail) "
    "SELECT run_id, %s, epoch, %s, %s, %s, %s FROM run_checkpoints WHERE run_id = %s AND @fenced = 1; "
    "COMMIT")
_RAW_TERMINAL = (
    "UPDATE run_checkpoints SET state = %s, phase = 'done', checkpoint = %s, owner = NULL, answer = %s, "
    "error_class = %s, error = %s, last_event_id = %s, finished_at_ms = %s, updated_at_ms = %s "
    f"WHERE {_RAW_FENCE}; {billing.RAW_HOLD_LOCKED}")
_RAW_END_ATTEMPT = "UPDATE run_attempts SET ended_at_ms = %s, outcome = %s, error = %s WHERE id = %s"
_RAW_OWN_ATTEMPT = "SELECT id FROM run_attempts WHERE run_id = %s AND epoch = %s AND worker = %s"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Run:
    """A snapshot of one run row; `checkpoint` is decoded."""

    run_id: str
    user_id: str
    kind: str
    query: str
    agent: str  # the program that runs it (an agent or a FencedTask), by name
    agent_version: str  # its tool set's or steps' version at submit ("" = not checked)
    state: str
    epoch: int
    owner: str | None
    step: int
    phase: str
    checkpoint: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    model_calls: int
    last_event_id: str
    deliveries: int
    total_deliveries: int
    answer: str | None
    error_class: str | None
    error: str | None
    created_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None

    @classmethod
    def from_row(cls, row: Any) -> Run:
        data = dict(row)
        data["checkpoint"] = codec.decode(data["checkpoint"]) if "checkpoint" in data else {}
        return cls(**data)

    @property
    def terminal(self) -> bool:
        return self.state not in ("queued", "running", "waiting")


@dataclass
class Claim:
    """This delivery's ownership: `epoch` is its fencing token for every later write."""

    run: Run
    epoch: int
    token: str
    attempt_id: int
    takeover: bool
    previous_owner: str | None
    deliveries: int
    total_deliveries: int  # the row's total_deliveries once claimed (what an inline claim counts on from)
    notes: dict[str, Any] = field(default_factory=dict)
    # The history entries this delivery's writes encoded, reused by its later writes (checkpoints.history).
    entry_bytes: history.EntryBytes = field(default_factory=history.EntryBytes, repr=False, compare=False)


def new_run_id() -> str:
    return str(uuid.uuid4())


def validate_request(user_id: str, kind: str, query: str) -> None:
    """A submit's input, checked before anything is written; InvalidRequest names the field."""
    from fenced_core.settings import get_settings

    if kind not in ("normal", "large"):
        raise InvalidRequest(f"kind must be 'normal' or 'large', not {kind!r}")
    if not user_id or len(user_id) > 128:
        raise InvalidRequest("user_id must be 1 to 128 characters")
    if not query.strip():
        raise InvalidRequest("query must not be empty")
    limit = get_settings().max_query_chars
    if len(query) > limit:
        raise InvalidRequest(f"query is {len(query)} characters; the limit is {limit} (FENCED_MAX_QUERY_CHARS)")


def submitted_entry(kind: str, agent: str, agent_version: str, credits: int) -> tuple[str, dict[str, Any]]:
    """The `submitted` ledger entry of a new run: its reason and detail (every way a run is created)."""
    return (f"{kind} run of {agent} submitted, {credits} credits held",
            {"agent": agent, "agent_version": agent_version})


def create_run_txn(conn: Connection, run_id: str, user_id: str, kind: str, query: str, actor: str,
                   agent: str = "shopping", agent_version: str = "") -> int:
    """Insert the run row, its billing hold and a ledger entry; returns the credits held."""
    validate_request(user_id, kind, query)
    now = now_ms()
    conn.execute(run_checkpoints.insert().values(
        run_id=run_id, user_id=user_id, kind=kind, query=query, agent=agent, agent_version=agent_version,
        state="queued", epoch=0, owner=None,
        step=0, phase="none", checkpoint=None, prompt_tokens=0, completion_tokens=0, model_calls=0,
        last_event_id="", deliveries=0, total_deliveries=0, created_at_ms=now, updated_at_ms=now,
    ))
    credits = billing.create_hold_txn(conn, run_id, user_id, kind, now)
    ledger.record_txn(conn, run_id, 0, actor, "submitted", *submitted_entry(kind, agent, agent_version, credits))
    return credits



@dataclass(frozen=True)
class NewRun:
    """One run of a batch submit, its id chosen before the transaction (so a retry finds it)."""

    run_id: str
    user_id: str
    kind: str
    query: str
    agent: str
    agent_version: str = ""


_PEEK_RUNS = sa.select(*_PEEK_RUN.selected_columns).where(_rc.run_id.in_(sa.bindparam("w_run_ids", expanding=True)))
_INSERT_RUN = run_checkpoints.insert()
_INSERT_LEDGER = run_ledger.insert()


def peek_runs_txn(conn: Connection, run_ids: list[str]) -> dict[str, Run]:
    """peek_run_txn for many run ids in one statement: the ones that exist, by id."""
    if not run_ids:
        return {}
    return {r["run_id"]: Run.from_row(r) for r in conn.execute(_PEEK_RUNS, {"w_run_ids": run_ids}).mappings().all()}


def create_runs_txn(conn: Connection, new: list[NewRun], actor: str, *, peek: bool = True
                    ) -> list[int | InsufficientCredits | Run]:
    """create_run_txn for a batch, in a fixed handful of statements: per run, the credits held (row,
    hold and ledger entry inserted), the InsufficientCredits refusal (nothing written for it), or the
    Run already stored under its id (nothing written for it: a retried transaction whose first commit
    landed, or a concurrent submit of the same idempotency key; the caller compares the request).

    `peek=False` skips the look for stored ids (one round trip): only for a first attempt whose ids
    cannot exist yet (fresh, or looked up just before); a stored one then fails the insert with an
    IntegrityError (all rolled back), and the caller's next attempt must peek."""
    for n in new:
        validate_request(n.user_id, n.kind, n.query)
    existing = peek_runs_txn(conn, [n.run_id for n in new]) if peek else {}
    fresh = [n for n in new if n.run_id not in existing]
    now = now_ms()
    held = dict(zip([n.run_id for n in fresh], billing.create_holds_txn(
        conn, [(n.run_id, n.user_id, n.kind) for n in fresh], now) if fresh else [], strict=True))
    granted = {run_id: c for run_id, c in held.items() if isinstance(c, int)}
    created = [n for n in fresh if n.run_id in granted]
    if created:
        conn.execute(_INSERT_RUN, [{
            "run_id": n.run_id, "user_id": n.user_id, "kind": n.kind, "query": n.query, "agent": n.agent,
            "agent_version": n.agent_version, "state": "queued", "epoch": 0, "owner": None, "step": 0,
            "phase": "none", "checkpoint": None, "prompt_tokens": 0, "completion_tokens": 0, "model_calls": 0,
            "last_event_id": "", "deliveries": 0, "total_deliveries": 0, "created_at_ms": now, "updated_at_ms": now,
        } for n in created])
        entries = [(n.run_id, *submitted_entry(n.kind, n.agent, n.agent_version, granted[n.run_id])) for n in created]
        conn.execute(_INSERT_LEDGER, [{
            "run_id": run_id, "at_ms": now, "epoch": 0, "actor": actor, "kind": "submitted", "reason": reason,
            "detail": ledger.encode_detail(detail),
        } for run_id, reason, detail in entries])
    return [existing[n.run_id] if n.run_id in existing else held[n.run_id] for n in new]

@db_retry
def get_run(run_id: str) -> Run | None:
    """The run row, retried through a database restart (a delivery must not lose its wake-up to one)."""
    with transaction(readonly=True) as conn:
        row = conn.execute(_GET_RUN, {"w_run_id": run_id}).mappings().first()
        run = Run.from_row(row) if row else None
        if run is not None:
            run.checkpoint = history.load_txn(conn, run_id, run.checkpoint)
    return run


def list_runs(limit: int = 50, state: str | None = None, user_id: str | None = None,
              before: tuple[int, str] | None = None) -> list[Run]:
    """Runs newest first (by creation, then id), of one user and in one state if given; `before`
    continues after the (created_at_ms, run_id) of a page's last run (keyset paging: stable while runs
    are added)."""
    q = sa.select(run_checkpoints).order_by(_rc.created_at_ms.desc(), _rc.run_id.desc()).limit(limit)
    if state:
        q = q.where(_rc.state == state)
    if user_id is not None:
        q = q.where(_rc.user_id == user_id)
    if before is not None:
        q = q.where(sa.tuple_(_rc.created_at_ms, _rc.run_id) < sa.tuple_(sa.literal(before[0]), sa.literal(before[1])))
    with transaction(readonly=True) as conn:
        return [Run.from_row(r) for r in conn.execute(q).mappings().all()]


@db_retry
def peek_run(run_id: str) -> Run | None:
    """The run row without its checkpoint (`checkpoint` is {}): enough to skip, drop or claim."""
    if one_trip():
        with raw_txn(readonly=True) as cur:
            cur.execute(_RAW_PEEK, (run_id,))
            rows = results(cur)[0][2]
        return Run.from_row(dict(zip(_PEEK_COLUMNS, rows[0], strict=True))) if rows else None
    with transaction(readonly=True) as conn:
        row = conn.execute(_PEEK_RUN, {"w_run_id": run_id}).mappings().first()
    return Run.from_row(row) if row else None


def peek_run_txn(conn: Connection, run_id: str) -> Run | None:
    """peek_run inside the caller's transaction."""
    row = conn.execute(_PEEK_RUN, {"w_run_id": run_id}).mappings().first()
    return Run.from_row(row) if row else None


def claim(run: Run | str, token: str, step: int | None = None) -> Claim | None:
    """Claim the run as it is now (epoch + 1, owner = `token`); None if it is not live any more, or (with
    `step`) if it is no longer at `step` (a stale wake-up: nothing written).

    The row is read inside the claim's transaction, locked: a snapshot read before the lease was taken
    may be stale (the previous holder, slow but alive, can have written checkpoint A, a card or a park
    since), and resuming from it would pay the model twice. The claim runs from what the row says."""
    found = claim_or_row(run, token, step)
    return found if isinstance(found, Claim) else None


def claim_or_row(run: Run | str, token: str, step: int | None = None) -> Claim | Run | None:
    """claim, saying why not: the Claim; else the row as the claim read it (locked, checkpoint
    included), which was not live or not at `step`; None when there is no such run. A delivery judges
    a wake-up from that row instead of reading the row once more before claiming (tasks.delivery)."""
    run_id = run if isinstance(run, str) else run.run_id
    c: Claim | Run | None
    if not one_trip():
        c = in_txn(_claim_txn, run_id, token, step)
    else:
        # A wake-up for a step expects its row as the step's start leaves it (no owner, no delivery yet):
        # one query claims it. Any other row (a takeover, a retry of ours, a redelivery) costs the two-query
        # claim after it. A rescue (no step) expects nothing.
        first = _NOT_AS_EXPECTED if step is None else in_raw_txn(_claim_as_expected, run_id, token, step)
        c = in_raw_txn(_claim_raw, run_id, token, step) if isinstance(first, _NotAsExpected) else first
    if isinstance(c, Claim) and history.sealed_of(c.run.checkpoint):
        # A run longer than one history segment: its sealed segments, read after the claim (they never
        # change once written, and those the row names were committed with it or before), or kept from
        # this process's last read of them.
        c.run.checkpoint = history.load(run_id, c.run.checkpoint)
    return c


@dataclass(frozen=True)
class _ClaimPlan:
    """What a claim of `run` writes: the row's new counters, its attempt row and its ledger entry."""

    epoch: int
    deliveries: int
    total_deliveries: int
    now: int
    takeover: bool
    kind: str
    reason: str
    detail: dict[str, Any]


def _plan_claim(run: Run, inline: bool = False) -> _ClaimPlan:
    """`inline`: the claim comes from the delivery that ran the step before, still holding the lease
    (write_step_done_and_claim)."""
    takeover, kind, reason, detail = _claim_words(run.owner, run.epoch, run.step, run.phase, run.deliveries, inline)
    return _ClaimPlan(run.epoch + 1, run.deliveries + 1, run.total_deliveries + 1, now_ms(), takeover, kind, reason,
                      detail)


def _claim_words(owner: str | None, epoch: int, step: int, phase: str, deliveries: int, inline: bool = False
                 ) -> tuple[bool, str, str, dict[str, Any]]:
    """What a claim of a row with these columns says in the ledger: (takeover, kind, reason, detail)."""
    takeover = owner is not None
    who: dict[str, Any] = {"node": os.environ.get("FENCED_NODE_NAME"), "pid": os.getpid(), "delivery": deliveries + 1}
    if takeover:
        kind = "takeover"
        reason = (f"previous holder {owner} (epoch {epoch}) never handed step {step} over; "
                  f"resuming {resume_point(phase, step)}")
        detail = {"previous_owner": owner, "previous_epoch": epoch, "phase": phase, **who}
    else:
        kind, reason, detail = "claimed", f"step {step} claimed, {resume_point(phase, step)}", who
        if inline:
            reason += f" (inline: the delivery that ran step {step - 1} went on)"
            detail = {**who, "inline": True}
    return takeover, kind, reason, detail


def _claimable(run: Run, step: int | None) -> bool:
    return run.state in LIVE_STATES and (step is None or run.step == step)


def _claim_of(run: Run, plan: _ClaimPlan, token: str, attempt_id: int) -> Claim:
    return Claim(run=run, epoch=plan.epoch, token=token, attempt_id=attempt_id, takeover=plan.takeover,
                 previous_owner=run.owner, deliveries=plan.deliveries, total_deliveries=plan.total_deliveries)


def _claim_txn(conn: Connection, run_id: str, token: str, step: int | None = None) -> Claim | Run | None:
    row = conn.execute(_GET_RUN_LOCKED, {"w_run_id": run_id}).mappings().first()
    if row is None:
        return None
    run = Run.from_row(row)
    if run.owner == token:
        # A retried transaction whose first commit landed finds its own token: the claim is ours.
        attempt = conn.execute(_OWN_ATTEMPT, {"w_run_id": run_id, "w_epoch": run.epoch, "w_worker": token}).scalar()
        if attempt is not None:
            return Claim(run=run, epoch=run.epoch, token=token, attempt_id=int(attempt), takeover=False,
                         previous_owner=None, deliveries=run.deliveries, total_deliveries=run.total_deliveries)
    if not _claimable(run, step):
        return run
    plan = _plan_claim(run)
    updated = change_state_txn(conn, run.run_id, LIVE_STATES, "running", at_epoch=run.epoch, what="claim",
                               epoch=plan.epoch, owner=token, deliveries=plan.deliveries,
                               total_deliveries=plan.total_deliveries, updated_at_ms=plan.now)
    if not updated:  # the row is locked: only a store without row locks gets here
        return run
    attempt_id = conn.execute(_INSERT_ATTEMPT, {
        "run_id": run.run_id, "step": run.step, "epoch": plan.epoch, "worker": token, "started_at_ms": plan.now,
    }).inserted_primary_key[0]  # type: ignore[index]
    ledger.record_txn(conn, run.run_id, plan.epoch, token, plan.kind, plan.reason, plan.detail)
    return _claim_of(run, plan, token, int(attempt_id))


def _claim_raw(cur: Any, run_id: str, token: str, step: int | None = None) -> Claim | Run | None:
    """_claim_txn in two round trips (MySQL/MariaDB; SQLite runs the same queries): the locked read, then
    the compare-and-set with its attempt row, its ledger entry and the COMMIT as one query (each insert
    conditional on the update)."""
    cur.execute(_RAW_GET_LOCKED, (run_id,))
    row = cur.fetchone()
    if row is None:
        cur.execute("COMMIT")
        return None
    run = Run.from_row(dict(zip(_COLUMNS, row, strict=True)))
    if run.owner == token:
        cur.execute(_RAW_OWN_ATTEMPT, (run_id, run.epoch, token))
        attempt = cur.fetchone()
        if attempt is not None:
            cur.execute("COMMIT")
            return Claim(run=run, epoch=run.epoch, token=token, attempt_id=int(attempt[0]), takeover=False,
                         previous_owner=None, deliveries=run.deliveries, total_deliveries=run.total_deliveries)
    if not _claimable(run, step):
        cur.execute("COMMIT")
        return run
    plan = _plan_claim(run)
    for source in LIVE_STATES:  # the state change this is (change_state_txn's check, for the raw statement)
        if (source, "running") not in TRANSITIONS:
            raise IllegalTransition(f"claim: {source} -> running is not a run state change")
    detail = json.dumps(plan.detail, sort_keys=True, default=str)
    cur.execute(_RAW_CLAIM, (plan.epoch, token, plan.deliveries, plan.total_deliveries, plan.now, run_id, run.epoch,
                             run_id, run.step, plan.epoch, token, plan.now,
                             run_id, plan.now, plan.epoch, token, plan.kind, plan.reason, detail))
    out = results(cur)
    if out[0][0] != 1:  # the row is locked: only a store without row locks gets here
        return run
    return _claim_of(run, plan, token, int(out[2][1]))


class _NotAsExpected:
    """_claim_as_expected's answer when the row is live at the step but not as expected (nothing written)."""


_NOT_AS_EXPECTED = _NotAsExpected()


def _claim_as_expected(cur: Any, run_id: str, token: str, step: int) -> Claim | Run | _NotAsExpected | None:
    """_claim_raw in ONE round trip for the row a wake-up for `step` expects: live at `step`, no owner, no
    delivery of the step yet, and the phase the step starts from (`none` at step 0, as submitted; `done`
    after, as checkpoint B of step - 1 left it). The claim's plan is made from that row before the query
    (its ledger entry's reason and detail), the database raises epoch and total_deliveries on the row it
    locked. The update matches only that row, so when it did, the plan is what the row read in the same
    query (locked until the COMMIT) plans, and the claim is returned. Otherwise nothing was written: the
    row read says why when it is not live or not at `step` (as _claim_raw returns it), and a live row at
    `step` not as expected (a takeover, a retry finding its own claim, a redelivery, a replay from
    checkpoint A) is `_NOT_AS_EXPECTED`, for _claim_raw. docs/design.md, "Round trips removed"."""
    phase = "done" if step > 0 else "none"
    now = now_ms()
    takeover, kind, reason, detail = _claim_words(None, 0, step, phase, 0)
    cur.execute(_RAW_CLAIM_AS_EXPECTED, (
        run_id, token, now, run_id, step, phase, token, now, run_id,
        now, token, kind, reason, json.dumps(detail, sort_keys=True, default=str), run_id))
    out = results(cur)
    if not out[0][2]:
        return None
    run = Run.from_row(dict(zip(_COLUMNS, out[0][2][0], strict=True)))
    if out[1][0] == 1:  # the row was the one these words were made for
        plan = _ClaimPlan(run.epoch + 1, 1, run.total_deliveries + 1, now, takeover, kind, reason, detail)
        return _claim_of(run, plan, token, int(out[3][1]))
    return _NOT_AS_EXPECTED if _claimable(run, step) else run


def resume_point(phase: str, step: int) -> str:
    """Where a claim picks the run up, in words (the phase names the last checkpoint written)."""
    if phase == "decided":
        return (f"from checkpoint A of step {step} (phase decided): the model's recorded decision is replayed, "
                "not paid again")
    if phase == "done" and step > 0:
        return f"after checkpoint B of step {step - 1} (phase done): step {step} starts with its model call"
    return f"at the start of step {step} (phase none): no checkpoint of it yet"


def fenced_update_txn(conn: Connection, run_id: str, epoch: int, what: str, **values: Any) -> None:
    """The fenced write: update the row only while `epoch` is still the run's epoch (and the run is
    `running`); FencedOut otherwise. It never changes the state: that is change_state_txn's."""
    if "state" in values:
        raise IllegalTransition(f"{what}: a state change goes through change_state_txn, not fenced_update_txn")
    values.setdefault("updated_at_ms", now_ms())
    params = {f"v_{k}": v for k, v in values.items()}
    updated = conn.execute(_fenced_update(tuple(sorted(values))), {"w_run_id": run_id, "w_epoch": epoch, **params}
                           ).rowcount
    if not updated:
        raise FencedOut(run_id, epoch, what)


_CLAIM_VALUES = frozenset({"epoch", "owner", "deliveries", "total_deliveries", "updated_at_ms"})


def change_state_txn(conn: Connection, run_id: str, expect: str | tuple[str, ...], to: str, *, at_epoch: int,
                     what: str, **values: Any) -> int:
    """The one run-row state change: `UPDATE run_checkpoints SET state = to, <values> WHERE run_id = ?
    AND epoch = at_epoch AND state IN expect`; returns the rows changed (0: the run moved on, or a newer
    epoch owns it; the caller decides what that means, nothing was written).

    Every (expected, `to`) pair must be in TRANSITIONS, else IllegalTransition before any SQL. Because
    the write is conditional on both the state and the epoch the caller read, a transaction retried
    after its first commit landed changes nothing the second time, and a holder fenced out by a claim
    or a cancel can never move the run. `values` may set a new epoch (a claim, a cancel)."""
    sources = (expect,) if isinstance(expect, str) else tuple(expect)
    illegal = [f"{s} -> {to}" for s in sources if (s, to) not in TRANSITIONS]
    if illegal or not sources:
        raise IllegalTransition(f"{what}: {', '.join(illegal) or f'nothing -> {to}'} is not a run state change "
                                "(checkpoints.runs.TRANSITIONS)")
    params = {"w_run_id": run_id, "w_epoch": at_epoch, **{f"v_{k}": v for k, v in values.items()}}
    if to == "running" and set(sources) == set(LIVE_STATES) and set(values) == _CLAIM_VALUES:
        return int(conn.execute(_CLAIM, params).rowcount)  # the hot path's prebuilt compare-and-set
    if sources == ("running",):  # a holder's write: the prebuilt fenced statement, with the state in it
        values.setdefault("updated_at_ms", now_ms())
        params.setdefault("v_updated_at_ms", values["updated_at_ms"])
        return int(conn.execute(_fenced_update(tuple(sorted({*values, "state"}))), {**params, "v_state": to}
                                ).rowcount)
    state_is = _rc.state == sources[0] if len(sources) == 1 else _rc.state.in_(sources)
    return int(conn.execute(run_checkpoints.update().where(_rc.run_id == run_id, _rc.epoch == at_epoch, state_is)
                            .values(state=to, **values)).rowcount)


def _holder_change_txn(conn: Connection, c: Claim, to: str, what: str, **values: Any) -> None:
    """Holder `c` moves its running run to `to`; FencedOut when its epoch no longer owns the run."""
    if not change_state_txn(conn, c.run.run_id, "running", to, at_epoch=c.epoch, what=what, **values):
        raise FencedOut(c.run.run_id, c.epoch, what)


def record_fenced(c: Claim, kind: str, reason: str, detail: dict[str, Any] | None = None) -> None:
    """A ledger entry by holder `c` that commits only while its epoch still owns the run (a retry
    record, say): a fenced-out holder's notes never read as the current holder's. Raises FencedOut."""

    def txn(conn: Connection) -> None:
        fenced_update_txn(conn, c.run.run_id, c.epoch, f"ledger entry {kind}")
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, kind, reason, detail)

    in_txn(txn)


def _step_row_txn(conn: Connection, c: Claim, step: int, phase: str, blob: bytes, prompt: int, completion: int) -> None:
    conn.execute(_INSERT_STEP, {
        "run_id": c.run.run_id, "step": step, "epoch": c.epoch, "phase": phase, "owner": c.token,
        "prompt_tokens": prompt, "completion_tokens": completion, "checkpoint": blob, "at_ms": now_ms(),
    })


def _end_attempt_txn(conn: Connection, attempt_id: int, outcome: str, error: str | None = None) -> None:
    conn.execute(_END_ATTEMPT, {"w_id": attempt_id, "v_ended_at_ms": now_ms(), "v_outcome": outcome,
                                "v_error": error})


@dataclass
class Usage:
    """Usage recorded so far for a run (absolute totals)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0


def _raw_fenced(cur: Any, c: Claim, what: str, sql: str, params: tuple[Any, ...]) -> None:
    """Send one of the one-round-trip fenced transactions above; FencedOut when its UPDATE matched nothing
    (then every later statement matched nothing too, and the COMMIT committed nothing)."""
    cur.execute(sql, params)
    if results(cur)[0][0] != 1:
        raise FencedOut(c.run.run_id, c.epoch, what)


def _sealing(sql: str, params: tuple[Any, ...], run_id: str, stored: history.Stored,
             condition: str = "@fenced = 1") -> tuple[str, tuple[Any, ...]]:
    """One of the one-round-trip transactions above (ending in COMMIT) with the segments `stored` seals
    written before its COMMIT, if `condition` (the fence) holds; their parameters follow all of its own."""
    if not stored.segments:
        return sql, params
    segments, extra = history.raw_segments(run_id, stored.segments, condition)
    return sql.removesuffix("COMMIT") + segments + "COMMIT", (*params, *extra)


def _store(c: Claim, checkpoint: dict[str, Any]) -> history.Stored:
    """The blob a write of `checkpoint` stores in the row (the history's open tail) and the history
    segments it seals (checkpoints.history: a write stays bounded however long the run)."""
    return history.store(checkpoint, history.sealed_of(c.run.checkpoint), c.entry_bytes)


def _sealed(c: Claim, stored: history.Stored) -> None:
    """After a committed write: the claim's view of what is sealed, for its next write, and the segments
    it sealed kept by this process (a later claim of the run here need not read them back)."""
    c.run.checkpoint[history.SEALED] = stored.sealed
    history.written(c.run.run_id, stored.segments)


def write_decided(c: Claim, step: int, checkpoint: dict[str, Any], usage: Usage, last_event_id: str) -> None:
    """Checkpoint A: the model's decision and the call's usage; a resume replays it, never re-calls."""
    stored = _store(c, checkpoint)
    blob = stored.blob
    if one_trip():
        now = now_ms()
        in_raw_txn(_raw_fenced, c, f"checkpoint A of step {step}", *_sealing(_RAW_CHECKPOINT_A, (
            blob, usage.prompt_tokens, usage.completion_tokens, usage.model_calls, last_event_id, now,
            c.run.run_id, c.epoch,
            step, c.epoch, "decided", c.token, usage.prompt_tokens, usage.completion_tokens, now, c.run.run_id),
            c.run.run_id, stored))
        _sealed(c, stored)
        return

    def txn(conn: Connection) -> None:
        fenced_update_txn(conn, c.run.run_id, c.epoch, f"checkpoint A of step {step}", phase="decided",
                          checkpoint=blob, prompt_tokens=usage.prompt_tokens,
                          completion_tokens=usage.completion_tokens, model_calls=usage.model_calls,
                          last_event_id=last_event_id)
        history.write_segments_txn(conn, c.run.run_id, stored.segments)
        _step_row_txn(conn, c, step, "decided", blob, usage.prompt_tokens, usage.completion_tokens)

    in_txn(txn)
    _sealed(c, stored)


def write_step_done(c: Claim, step: int, checkpoint: dict[str, Any], usage: Usage, last_event_id: str) -> None:
    """Checkpoint B: every tool returned; the run moves to step + 1 and the holder lets go."""
    stored = _store(c, checkpoint)
    blob = stored.blob
    if one_trip():
        now = now_ms()
        in_raw_txn(_raw_fenced, c, f"checkpoint B of step {step}", *_sealing(_RAW_CHECKPOINT_B, (
            step + 1, blob, last_event_id, now, c.run.run_id, c.epoch,
            step, c.epoch, "done", c.token, usage.prompt_tokens, usage.completion_tokens, now, c.run.run_id,
            now, c.attempt_id), c.run.run_id, stored))
        _sealed(c, stored)
        return

    def txn(conn: Connection) -> None:
        fenced_update_txn(conn, c.run.run_id, c.epoch, f"checkpoint B of step {step}", step=step + 1,
                          phase="done", checkpoint=blob, owner=None, deliveries=0,
                          last_event_id=last_event_id)
        history.write_segments_txn(conn, c.run.run_id, stored.segments)
        _step_row_txn(conn, c, step, "done", blob, usage.prompt_tokens, usage.completion_tokens)
        _end_attempt_txn(conn, c.attempt_id, "step_done")

    in_txn(txn)
    _sealed(c, stored)


def write_step_done_and_claim(c: Claim, step: int, checkpoint: dict[str, Any], usage: Usage,
                              last_event_id: str) -> Claim:
    """Checkpoint B of `step` and the inline claim of step + 1 by the same delivery (same token), in ONE
    fenced transaction: what write_step_done followed by claim(run, token, step + 1, inline=True) writes
    (the step row, the attempt closed, the row at step + 1 with epoch + 1 and this token, the next attempt,
    the claim's ledger entry), without the claim's locked read of the row in between. The claim is
    planned from what checkpoint B writes, which is what that read would return: every write to a running
    row by anyone else (a claim, a cancel, an epoch repair) raises its epoch, and this transaction is
    fenced by this claim's epoch. FencedOut when that epoch no longer owns the run (nothing written).

    A retried transaction whose first commit landed (its reply lost) finds its own next attempt and
    returns that claim: the fence makes the write apply at most once."""
    if ("running", "running") not in TRANSITIONS:
        raise IllegalTransition("inline claim: running -> running is not a run state change")
    stored = _store(c, checkpoint)
    body = {**checkpoint, "history": list(checkpoint.get("history", []))}
    if stored.sealed:  # as claim() leaves it: the whole history, and how much of it segments hold
        body.update({history.SEALED: stored.sealed, history.WHOLE: True})
    after_b = dataclasses.replace(
        c.run, step=step + 1, phase="done", checkpoint=body, owner=None, epoch=c.epoch, state="running", deliveries=0,
        total_deliveries=c.total_deliveries, prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens, model_calls=usage.model_calls, last_event_id=last_event_id)
    plan = _plan_claim(after_b, inline=True)
    after_b.updated_at_ms = plan.now
    what = f"checkpoint B of step {step} with the inline claim of step {step + 1}"
    if one_trip():
        attempt_id = in_raw_txn(_step_done_and_claim_raw, c, step, stored, usage, last_event_id, plan, what)
    else:
        attempt_id = in_txn(_step_done_and_claim_txn, c, step, stored, usage, last_event_id, plan, what)
    _sealed(c, stored)
    claimed = _claim_of(after_b, plan, c.token, attempt_id)
    claimed.entry_bytes = c.entry_bytes  # the same entries, written on by the same delivery
    return claimed


def _step_done_and_claim_raw(cur: Any, c: Claim, step: int, stored: history.Stored, usage: Usage,
                             last_event_id: str, plan: _ClaimPlan, what: str) -> int:
    """write_step_done_and_claim's transaction in one round trip (MySQL/MariaDB; SQLite runs the same
    query); the next attempt's id."""
    run_id = c.run.run_id
    cur.execute(*_sealing(_RAW_CHECKPOINT_B_CLAIM, (
        step + 1, stored.blob, plan.epoch, c.token, plan.deliveries, plan.total_deliveries, last_event_id, plan.now,
        run_id, c.epoch,
        step, c.epoch, "done", c.token, usage.prompt_tokens, usage.completion_tokens, plan.now, run_id,
        plan.now, c.attempt_id,
        run_id, step + 1, plan.epoch, c.token, plan.now,
        run_id, plan.now, plan.epoch, c.token, plan.kind, plan.reason, json.dumps(plan.detail, sort_keys=True,
                                                                                 default=str)), run_id, stored))
    out = results(cur)
    if out[0][0] == 1:
        return int(out[4][1])
    cur.execute(f"{_RAW_OWN_ATTEMPT}; COMMIT", (run_id, plan.epoch, c.token))
    mine = results(cur)[0][2]
    if mine:  # this transaction's first commit landed; the retry matched nothing because of it
        return int(mine[0][0])
    raise FencedOut(run_id, c.epoch, what)


def _step_done_and_claim_txn(conn: Connection, c: Claim, step: int, stored: history.Stored, usage: Usage,
                             last_event_id: str, plan: _ClaimPlan, what: str) -> int:
    """write_step_done_and_claim's transaction through SQLAlchemy Core: the reference the one-query
    version is tested against."""
    run_id = c.run.run_id
    values = {"step": step + 1, "phase": "done", "checkpoint": stored.blob, "epoch": plan.epoch, "owner": c.token,
              "deliveries": plan.deliveries, "total_deliveries": plan.total_deliveries,
              "last_event_id": last_event_id, "updated_at_ms": plan.now}
    if not conn.execute(_fenced_update(tuple(sorted(values))), {
            "w_run_id": run_id, "w_epoch": c.epoch, **{f"v_{k}": v for k, v in values.items()}}).rowcount:
        mine = conn.execute(_OWN_ATTEMPT, {"w_run_id": run_id, "w_epoch": plan.epoch, "w_worker": c.token}).scalar()
        if mine is None:
            raise FencedOut(run_id, c.epoch, what)
        return int(mine)  # this transaction's first commit landed; the retry matched nothing because of it
    history.write_segments_txn(conn, run_id, stored.segments)
    _step_row_txn(conn, c, step, "done", stored.blob, usage.prompt_tokens, usage.completion_tokens)
    _end_attempt_txn(conn, c.attempt_id, "step_done")
    attempt_id = conn.execute(_INSERT_ATTEMPT, {
        "run_id": run_id, "step": step + 1, "epoch": plan.epoch, "worker": c.token, "started_at_ms": plan.now,
    }).inserted_primary_key[0]  # type: ignore[index]
    ledger.record_txn(conn, run_id, plan.epoch, c.token, plan.kind, plan.reason, plan.detail)
    return int(attempt_id)


def finish(c: Claim, state: str, checkpoint: dict[str, Any], usage: Usage, last_event_id: str, *,
           answer: str | None = None, error_class: str | None = None, error: str | None = None) -> int | None:
    """The terminal transaction: final row, settlement and ledger in ONE fenced commit; returns the charge."""
    stored = _store(c, checkpoint)
    blob = stored.blob
    if one_trip():
        charge = in_raw_txn(_finish_raw, c, state, stored, usage, last_event_id, answer, error_class, error)
        _sealed(c, stored)
        return charge

    def txn(conn: Connection) -> int | None:
        now = now_ms()
        _holder_change_txn(conn, c, state, f"terminal write ({state})", phase="done", checkpoint=blob, owner=None,
                           answer=answer, error_class=error_class, error=error, last_event_id=last_event_id,
                           finished_at_ms=now, updated_at_ms=now)
        history.write_segments_txn(conn, c.run.run_id, stored.segments)
        charge = billing.settle_txn(conn, c.run.run_id, c.epoch, c.token, usage.prompt_tokens,
                                    usage.completion_tokens, now)
        reason = f"run {state}" + (f": [{error_class}] {error}" if error else "")
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, state, reason, {"charge": charge})
        _end_attempt_txn(conn, c.attempt_id, state, error)
        return charge

    charge = in_txn(txn)
    _sealed(c, stored)
    return charge


def _finish_raw(cur: Any, c: Claim, state: str, stored: history.Stored, usage: Usage, last_event_id: str,
                answer: str | None, error_class: str | None, error: str | None) -> int | None:
    """finish's transaction in two round trips (MySQL/MariaDB; SQLite runs the same queries): the fenced
    terminal UPDATE with the hold read locked; then the settlement (billing.settle_raw), the ledger entry,
    the attempt closed and the COMMIT as one query. Fenced out: the first query's UPDATE matched nothing,
    nothing else is sent and the transaction rolls back."""
    what = f"terminal write ({state})"
    if ("running", state) not in TRANSITIONS:
        raise IllegalTransition(f"{what}: running -> {state} is not a run state change (checkpoints.runs.TRANSITIONS)")
    now = now_ms()
    run_id = c.run.run_id
    cur.execute(_RAW_TERMINAL, (state, stored.blob, answer, error_class, error, last_event_id, now, now, run_id,
                                c.epoch, run_id))
    out = results(cur)
    if out[0][0] != 1:
        raise FencedOut(run_id, c.epoch, what)
    hold = out[1][2][0] if out[1][2] else None
    charge, statements, params = billing.settle_raw(hold, run_id, c.epoch, c.token, usage.prompt_tokens,
                                                    usage.completion_tokens, now)
    reason = f"run {state}" + (f": [{error_class}] {error}" if error else "")
    statements += [ledger.RAW_INSERT, _RAW_END_ATTEMPT, "COMMIT"]
    params += [*ledger.raw_params(run_id, c.epoch, c.token, state, reason, {"charge": charge}),
               now, state, error, c.attempt_id]
    # The fenced UPDATE above matched and holds the row: the segments need no condition of their own.
    cur.execute(*_sealing("; ".join(statements), tuple(params), run_id, stored, condition="TRUE"))
    results(cur)
    return charge


def park(c: Claim, reason: str, checkpoint: dict[str, Any], usage: Usage, last_event_id: str) -> None:
    """The run waits for a person: no lease, no worker occupied, reason recorded, checkpoint kept."""
    stored = _store(c, checkpoint)
    blob = stored.blob

    def txn(conn: Connection) -> None:
        # Waiting on a person is no failed delivery: the crash budget starts afresh (as at checkpoint B).
        _holder_change_txn(conn, c, "waiting", "park (waiting)", owner=None, checkpoint=blob, deliveries=0,
                           error_class="fixable", error=reason, prompt_tokens=usage.prompt_tokens,
                           completion_tokens=usage.completion_tokens, model_calls=usage.model_calls,
                           last_event_id=last_event_id)
        history.write_segments_txn(conn, c.run.run_id, stored.segments)
        ledger.record_txn(conn, c.run.run_id, c.epoch, c.token, "waiting", f"waiting for input: {reason}")
        _end_attempt_txn(conn, c.attempt_id, "waiting", reason)

    in_txn(txn)


def dead_letter(c: Claim, reason: str, observations: dict[str, Any]) -> list[dict[str, Any]]:
    """Send the run to `dead`: keep every attempt and the last observations; the hold stays open."""

    def txn(conn: Connection) -> list[dict[str, Any]]:
        now = now_ms()
        run = c.run
        _holder_change_txn(conn, c, "dead", "dead-letter", owner=None, error_class="dead", error=reason,
                           finished_at_ms=now, updated_at_ms=now)
        _end_attempt_txn(conn, c.attempt_id, "dead", reason)  # first, so the case file shows it ended so
        attempts = [dict(r) for r in conn.execute(
            sa.select(run_attempts).where(run_attempts.c.run_id == run.run_id).order_by(run_attempts.c.id)
        ).mappings().all()]
        conn.execute(dead_letters.delete().where(dead_letters.c.run_id == run.run_id))
        conn.execute(dead_letters.insert().values(
            run_id=run.run_id, step=run.step, reason=reason, attempts=json.dumps(attempts, default=str),
            observations=json.dumps(observations, default=str), at_ms=now,
        ))
        # The hold stays held: a replay settles it in its terminal transaction; the sweeper settles
        # what was used once a dead letter has waited hold_expiry_s without a replay.
        ledger.record_txn(conn, run.run_id, c.epoch, c.token, "dead_lettered", reason,
                          {"attempts": len(attempts),
                           "attempts_of_step": sum(a["step"] == run.step for a in attempts)})
        return attempts

    return in_txn(txn)


def end_attempt(attempt_id: int, outcome: str, error: str | None = None) -> None:
    """Close an attempt that ended without a fenced write of its own (fenced out, lease lost)."""
    in_txn(_end_attempt_txn, attempt_id, outcome, error)


def stalled(older_than_ms: int, limit: int = 500, after: tuple[int, str] | None = None
            ) -> list[tuple[str, int, str, int]]:
    """Runs the database calls live (queued/running) that made no progress since `older_than_ms`:
    (run_id, step, kind, updated_at_ms), oldest first; `after` continues from the last row of a page
    (keyset paging, so runs behind many hung ones are still reached)."""
    rc = run_checkpoints.c
    q = (sa.select(rc.run_id, rc.step, rc.kind, rc.updated_at_ms)
         .where(rc.state.in_(LIVE_STATES), rc.updated_at_ms < older_than_ms)
         .order_by(rc.updated_at_ms, rc.run_id).limit(limit))
    if after is not None:
        q = q.where(sa.tuple_(rc.updated_at_ms, rc.run_id) > sa.tuple_(sa.literal(after[0]), sa.literal(after[1])))
    with transaction(readonly=True) as conn:
        rows = conn.execute(q).all()
    return [(r.run_id, r.step, r.kind, r.updated_at_ms) for r in rows]
