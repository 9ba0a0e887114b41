"""The start-up check that the database's epochs never went back (docs/operations.md, "After a database
failover").

The fencing guarantee needs a database whose committed epochs never go back. A failover to a replica
that had not received the last commits breaks that: a run's epoch in the database can be lower than
its Redis epoch mirror (raised after every claim, never lowered), and the next claim would hand out an
epoch a living holder already owns. A worker and the `fenced` commands that write refuse to start then.

What it covers: the `FENCED_EPOCH_CHECK_RUNS` (10,000) most recently updated runs that the database
calls in flight (queued, running, waiting: a lost claim, checkpoint, cancel or terminal write leaves a
run there), compared with their mirrors (runs without a mirror, e.g. after a Redis wipe, are skipped).
Cost: one indexed query and one pipelined round trip per 1,000 mirrors. It does not see a lost commit
that Redis never mirrored (a lost submit, a lost checkpoint with no claim after it) nor runs beyond the
sample; it is a tripwire for the epoch going back, not a consistency audit. `repair()` (`fenced
repair-epochs`) raises each run found behind above its mirror."""

from __future__ import annotations

import time
from dataclasses import dataclass

from checkpoints import epochs
from fenced_core.errors import ConfigError
from fenced_core.settings import get_settings
from fencing.epoch import mirrors, raise_epoch

RECHECK_AFTER_S = 1.0  # a cancel raises the mirror just before its commit: a suspect is read again once


@dataclass(frozen=True)
class Behind:
    run_id: str
    db_epoch: int
    mirror: int


class EpochsBehind(ConfigError):
    """The database's epochs are behind the Redis mirrors: the database lost commits. Refuse to run."""

    def __init__(self, behind: list[Behind], checked: int) -> None:
        self.behind, self.checked = behind, checked
        shown = ", ".join(f"{b.run_id} (database epoch {b.db_epoch}, Redis mirror {b.mirror})" for b in behind[:10])
        more = f" and {len(behind) - 10} more" if len(behind) > 10 else ""
        super().__init__(
            f"the database's epochs are behind the Redis epoch mirrors for {len(behind)} of {checked} in-flight "
            f"runs: {shown}{more}. The database lost commits (a failover to a replica that had not received them?): "
            "fencing is not safe until it is repaired. Stop every worker, then raise each run's database epoch "
            "above its mirror (docs/operations.md, \"After a database failover\"); set FENCED_EPOCH_CHECK_RUNS=0 "
            "only to start anyway, knowing that a stale holder may write.")


def find_behind(limit: int | None = None, recheck_after_s: float = RECHECK_AFTER_S) -> tuple[list[Behind], int]:
    """(runs whose database epoch is below their mirror, runs checked). The database is read, then Redis,
    then the suspects' rows again: a claim commits before it raises the mirror, so a claim racing the
    check never looks behind; a cancel raises it just before its commit, so a suspect is re-read after
    `recheck_after_s` and kept only if still behind."""
    limit = get_settings().epoch_check_runs if limit is None else limit
    if limit <= 0:
        return [], 0
    in_db = epochs.in_flight(limit)
    seen = mirrors(list(in_db))
    suspects = [r for r, m in seen.items() if m > in_db[r]]
    for wait_s in (0.0, recheck_after_s):
        if not suspects:
            break
        time.sleep(wait_s)
        now = epochs.epochs_of(suspects)
        suspects = [r for r in suspects if r in now and now[r] < seen[r]]
        in_db.update({r: now[r] for r in suspects})
    return [Behind(r, in_db[r], seen[r]) for r in sorted(suspects)], len(in_db)


def ensure_epochs_not_behind(limit: int | None = None) -> int:
    """Raise EpochsBehind if any checked run's database epoch is below its mirror; returns runs checked."""
    behind, checked = find_behind(limit)
    if behind:
        raise EpochsBehind(behind, checked)
    return checked


def repair(actor: str, limit: int | None = None) -> list[tuple[Behind, int]]:
    """Raise every checked run whose database epoch is behind its mirror above the mirror (database
    first, then the mirror to the same epoch, so a stale holder's events are refused too); returns each
    run repaired with its new epoch. Run it with every worker stopped: a worker that took the run
    before the repair would be fenced out by it, which is safe, but wasted work."""
    behind, _checked = find_behind(limit)
    done = []
    for b in behind:
        new = epochs.raise_behind(b.run_id, b.db_epoch, b.mirror, actor)
        if new is not None:
            raise_epoch(b.run_id, new)
            done.append((b, new))
    return done
