"""A submit's transaction in ONE round trip: the user's account (created with the default balance if it is
new), the credit hold, the run's row and its `submitted` ledger entry, then COMMIT, as one
multi-statement query (issue 17: `submit_run` sent ten statements for a new user, six for a known one).

It writes exactly what `checkpoints.runs.create_runs_txn` writes for a batch of one new run id (that
SQLAlchemy Core version stays the reference, compared row for row in tests/test_submit_one_trip.py):

- `INSERT IGNORE` the account, only if the default balance covers the hold (a refused first submit
  leaves no account behind, as the reference's rollback does); a concurrent first submit of the same
  user makes it a no-op instead of a duplicate-key error;
- the hold as one guarded UPDATE (`balance - held >= credits`): it matches the account or nothing, and
  `@held` keeps what it matched (MySQL's ROW_COUNT() counts matched rows: the dialect's FOUND_ROWS);
- the hold's row, the run's row and the ledger entry each `WHERE @held = 1`;
- the credits available after it, read in the same query (a refusal names them);
- COMMIT: of a refusal it commits nothing.

A run id that exists already fails the run's INSERT with an IntegrityError before the COMMIT; raw_txn
rolls the transaction back, so nothing of it stays (the caller's idempotency path takes it from there).
On SQLite the same text runs statement by statement (checkpoints.sqlite_multi, `INSERT OR IGNORE`)."""

from __future__ import annotations

from checkpoints import billing, ledger
from checkpoints.db import raw_txn, results
from checkpoints.runs import NewRun, now_ms, submitted_entry, validate_request
from fenced_core.errors import InsufficientCredits
from fenced_core.settings import get_settings

_IF_HELD = "FROM DUAL WHERE @held = 1"
_QUERY = (
    "INSERT IGNORE INTO user_accounts (user_id, balance_credits, held_credits, updated_at_ms) "
    "SELECT %s, %s, 0, %s FROM DUAL WHERE %s >= %s; "
    "UPDATE user_accounts SET held_credits = held_credits + %s, updated_at_ms = %s "
    "WHERE user_id = %s AND balance_credits - held_credits >= %s; "
    "SET @held = ROW_COUNT(); "
    "INSERT INTO run_holds (run_id, user_id, credits_held, state, credits_charged, created_at_ms, expires_at_ms) "
    f"SELECT %s, %s, %s, 'held', NULL, %s, %s {_IF_HELD}; "
    "INSERT INTO run_checkpoints (run_id, user_id, kind, query, agent, agent_version, state, epoch, owner, step, "
    "phase, checkpoint, prompt_tokens, completion_tokens, model_calls, last_event_id, deliveries, "
    "total_deliveries, created_at_ms, updated_at_ms) "
    f"SELECT %s, %s, %s, %s, %s, %s, 'queued', 0, NULL, 0, 'none', NULL, 0, 0, 0, '', 0, 0, %s, %s {_IF_HELD}; "
    "INSERT INTO run_ledger (run_id, at_ms, epoch, actor, kind, reason, detail) "
    f"SELECT %s, %s, 0, %s, 'submitted', %s, %s {_IF_HELD}; "
    "SELECT @held, balance_credits - held_credits FROM user_accounts WHERE user_id = %s; "
    "COMMIT")


def create_run(new: NewRun, actor: str) -> int:
    """Create the run `new` (a fresh id) with its hold, in one round trip; the credits held. Raises
    InsufficientCredits (nothing written) when the user's available credits do not cover the hold, an
    IntegrityError when the run id exists (nothing written), DatabaseUnavailable on a transient error
    (nothing known: the caller's retry must look for the run first). Not retried here."""
    validate_request(new.user_id, new.kind, new.query)
    s = get_settings()
    credits = billing.hold_credits(new.kind)
    now = now_ms()
    reason, detail = submitted_entry(new.kind, new.agent, new.agent_version, credits)
    params = (
        new.user_id, s.default_balance_credits, now, s.default_balance_credits, credits,
        credits, now, new.user_id, credits,
        new.run_id, new.user_id, credits, now, billing.hold_expires_at(now),
        new.run_id, new.user_id, new.kind, new.query, new.agent, new.agent_version, now, now,
        new.run_id, now, actor, reason, ledger.encode_detail(detail),
        new.user_id)
    with raw_txn() as cur:
        cur.execute(_QUERY, params)
        out = results(cur)
    account = out[6][2]  # the SELECT's rows
    if account and int(account[0][0]) == 1:
        return credits
    available = int(account[0][1]) if account else s.default_balance_credits
    raise InsufficientCredits(new.user_id, credits, available)
