"""Issue 17's delivery shortcuts, in-process on both stores: no wake-up with a step reads the row before its
claim (the claim's locked read is the only read, and a refusal is judged from the row it read); one that
found the lease free and is refused lets the lease go with its index entry due now (a wake-up refused
meanwhile is rescued on the reaper's next tick)."""

from __future__ import annotations

import json

import examples.shopping  # noqa: F401 - registers the demo agent the deliveries run
from checkpoints import ledger, runs
from fencing import events, keys
from fencing.lease import now_ms
from tasks import queues, submit_run
from tasks.delivery import deliver
from tasks.submit import SubmitRequest, submit_many

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


def test_a_first_wake_up_reads_the_row_once_in_its_claim(store, redis_client, monkeypatch):
    """A run's first wake-up finds the lease free (no handoff yet): the claim's locked read is its only read
    of the row, where it used to peek at the row first (one SQL round trip a run, issue 17)."""
    run_id = submit_run("u-first", QUERY)
    assert not redis_client.exists(keys.lease(run_id))
    peeks: list[str] = []
    real = runs.peek_run
    monkeypatch.setattr(runs, "peek_run", lambda rid: peeks.append(rid) or real(rid))
    sent: list[int] = []
    assert deliver(run_id, 0, lambda _r, s: sent.append(s)) == "continue"
    assert peeks == [], "the claim reads the row locked; nothing reads it before"
    row = runs.get_run(run_id)
    assert (row.step, row.epoch) == (1, 1) and sent == [1]


def test_a_wake_up_for_an_ended_run_is_judged_by_the_claims_read_and_repairs_it(store, redis_client):
    """The claim refuses an ended run and the row it read decides the outcome: skipped, the missing final
    event repaired (its holder died after the terminal commit), the lease let go for a rescue look."""
    run_id = submit_run("u-ended", QUERY)
    sent: list[int] = [0]
    while (outcome := deliver(run_id, sent[-1], lambda _r, s: sent.append(s))) == "continue":
        pass
    assert outcome == "done"
    stream = keys.events(run_id)
    final = [i for i, fields in redis_client.xrange(stream) if fields.get("eid") == "run:done"]
    assert len(final) == 1
    redis_client.xdel(stream, *final)  # the holder died between its terminal commit and the final event
    redis_client.delete(keys.lease(run_id))
    epoch = runs.get_run(run_id).epoch
    before = now_ms()
    assert deliver(run_id, sent[-1], lambda _r, s: sent.append(s)) == "skipped"
    assert [f["eid"] for _i, f in redis_client.xrange(stream)].count("run:done") == 1, "final event repaired"
    assert runs.get_run(run_id).epoch == epoch, "an ended run is claimed by no one"
    assert not redis_client.exists(keys.lease(run_id))
    due = [score for member, score in redis_client.zrange(keys.lease_index(run_id), 0, -1, withscores=True)
           if member.endswith(f"|{run_id}") and score <= now_ms()]
    assert due and min(due) >= before - 1, "the refused wake-up's index entry is due now"


def test_submit_sends_the_first_wake_up_for_step_0(store, redis_client):
    """The first wake-up carries step 0, so it takes the path above (no row read before the claim); a
    rescue's wake-up (no step) still reads the row first, to know which handoff it may take."""
    one = submit_run("u-step0", QUERY)
    many = [o.run_id for o in submit_many([SubmitRequest("u-step0-a", QUERY), SubmitRequest("u-step0-b", QUERY)])]
    messages = [json.loads(m) for m in redis_client.lrange(queues.for_kind("normal"), 0, -1)]
    for run_id in (one, *many):
        ours = [m for m in messages if m["headers"]["id"] == run_id]
        assert [m["headers"]["argsrepr"] for m in ours] == [f"('{run_id}', 0)"], "submit_run and submit_many"


class _HolderLost(BaseException):
    """The holder's process dies here (nothing of it runs on: not even an `except Exception`)."""


def test_a_takeover_reads_only_the_events_since_the_last_checkpoint(store, redis_client, monkeypatch):
    """A takeover before checkpoint A looks for the lost holder's paid decision in the events after the
    run's last checkpoint, not in the whole stream: that read stays one step long however long the run
    (issue 17: at step 20 the whole stream cost ~0.9 ms of CPU per takeover), and the lost call is still
    noted as the platform's cost."""
    run_id = submit_run("u-lost-call", QUERY)
    sent: list[int] = []
    assert deliver(run_id, None, lambda _r, s: sent.append(s)) == "continue"
    checkpointed = runs.get_run(run_id).last_event_id
    before_checkpoint = [e.stream_id for e in events.read(run_id)]
    assert checkpointed and before_checkpoint[-1] == checkpointed, "checkpoint B covered the newest event"

    def crash(*_args, **_kwargs):
        raise _HolderLost()

    with monkeypatch.context() as m:  # step 1's holder decides (paid), then dies before checkpoint A
        m.setattr(runs, "write_decided", crash)
        try:
            deliver(run_id, sent[-1], lambda _r, s: sent.append(s))
        except _HolderLost:
            pass
        else:
            raise AssertionError("the holder was meant to die before checkpoint A")
    lost_epoch = runs.get_run(run_id).epoch
    assert any(e.eid == "s1:decision" and e.epoch == lost_epoch for e in events.read(run_id))
    redis_client.delete(keys.lease(run_id))  # its lease ran out

    reads: list[tuple[str, list[str]]] = []
    real_read = events.read

    def spy(rid, after="-", client=None):
        found = real_read(rid, after, client)
        reads.append((after, [e.stream_id for e in found]))
        return found

    monkeypatch.setattr(events, "read", spy)
    assert deliver(run_id, None, lambda _r, s: sent.append(s)) in ("continue", "done")
    assert reads, "the takeover looked for a lost decision"
    after, read_ids = reads[0]
    assert after == checkpointed, "read from the last checkpoint's event on"
    assert not set(read_ids) & set(before_checkpoint), "nothing the checkpoint covered was read again"
    lost = [e for e in ledger.history(run_id) if e.kind == "model_call_lost"]
    assert len(lost) == 1 and f"the model call of step 1 by epoch {lost_epoch} answered" in lost[0].reason, lost
