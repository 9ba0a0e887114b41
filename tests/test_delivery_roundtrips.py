"""Issue 17's delivery shortcuts, in-process on both stores: a continuation that took its handoff reads no
row before its claim; one that finds the lease free reads it, and if there is nothing to do lets the
lease go with its index entry due now (a wake-up refused meanwhile is rescued on the reaper's next tick)."""

from __future__ import annotations

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from checkpoints import runs
from fencing import keys
from fencing.lease import now_ms
from tasks import submit_run
from tasks.delivery import deliver

QUERY = "wireless headphones under $100"


def test_a_continuation_that_took_its_handoff_reads_no_row_first(store, redis_client, monkeypatch):
    run_id = submit_run("u-handoff", QUERY)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s)) == "continue"
    assert redis_client.get(keys.lease(run_id)) == f"handoff:{sent[-1]}"
    peeks: list[str] = []
    real = runs.peek_run
    monkeypatch.setattr(runs, "peek_run", lambda rid: peeks.append(rid) or real(rid))
    assert deliver(run_id, sent[-1], lambda _r, s: sent.append(s)) == "continue"
    assert peeks == [], "the handoff proves the row's step; the claim reads the row locked"
    assert runs.get_run(run_id).step == 2


def test_a_stale_continuation_that_finds_the_lease_free_lets_it_go_for_a_rescue(store, redis_client):
    run_id = submit_run("u-stale", QUERY)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s)) == "continue"
    redis_client.delete(keys.lease(run_id))  # the handoff expired (or Redis lost it)
    before = now_ms()
    assert deliver(run_id, 0, lambda _r, s: sent.append(s)) == "stale", "step 0 is done: a stale wake-up"
    assert not redis_client.exists(keys.lease(run_id)), "the stale wake-up let the lease go"
    due = [score for member, score in redis_client.zrange(keys.lease_index(run_id), 0, -1, withscores=True)
           if member.endswith(f"|{run_id}") and score <= now_ms()]
    assert due and min(due) >= before - 1, "its index entry is due now: the reaper looks at the run next tick"
    row = runs.get_run(run_id)
    assert (row.step, row.epoch, row.owner) == (1, 1, None), "a stale wake-up claims nothing"
    assert deliver(run_id, 1, lambda _r, s: sent.append(s)) == "continue", "the run goes on from a free lease"
