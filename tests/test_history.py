"""A run's history in sealed segments (checkpoints.history): each checkpoint write stays bounded, every
read gets the whole history back, old (version 1) blobs stay readable, a newer blob is refused."""

from __future__ import annotations

import json
import zlib
from typing import Any

import pytest

from checkpoints import codec, history


def _entries(n: int) -> list[dict[str, object]]:
    return [{"step": i, "name": f"s{i}", "results": {"id": "x" * (i % 7)}} for i in range(n)]


def test_each_write_carries_less_than_a_segment_and_seals_each_segment_once():
    sealed, seals = 0, []
    for n in range(0, 60):
        stored = history.store({"history": _entries(n), "waited": True}, sealed)
        body = codec.decode(stored.blob)
        assert len(body["history"]) < history.SEGMENT and body["history"] == _entries(n)[stored.sealed:]
        assert history.sealed_of(body) == stored.sealed == n // history.SEGMENT * history.SEGMENT
        assert history.length(body) == n
        if n < history.SEGMENT:
            assert body == {"history": _entries(n), "waited": True}, "a short run's checkpoint is stored as given"
        assert body["waited"] is True
        seals += [seq for seq, _ in stored.segments]
        sealed = stored.sealed
    assert seals == [0, 1, 2], "every complete segment sealed exactly once, in order"


def test_a_delivery_encodes_each_entry_once_across_its_writes(monkeypatch):
    """A step writes two checkpoints and an inline delivery several steps: with the delivery's EntryBytes,
    each write encodes only the entries that are new since the last (what it stores reads back the same)."""
    from fenced_core import jsonbytes

    encoded: list[object] = []
    real = jsonbytes.dumps

    def counted(value: object) -> bytes:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(jsonbytes, "dumps", counted)
    entries, sealed, whole = history.EntryBytes(), 0, _entries(40)
    for n in range(40):
        for decision in ({"name": f"d{n}"}, None):  # checkpoint A (with its decision), then checkpoint B
            encoded.clear()
            cp: dict[str, Any] = {"history": whole[:n + (decision is None)]}
            if decision:
                cp["decision"] = decision
            stored = history.store(cp, sealed, entries)
            new = [e for e in encoded if e in whole]
            assert new == ([] if decision else [whole[n]]), f"step {n}: encoded {new}"
            body = codec.decode(stored.blob)
            assert body["history"] == cp["history"][stored.sealed:] and body.get("decision") == decision
            for seq, blob in stored.segments:
                assert codec.decode(blob)["entries"] == whole[seq * history.SEGMENT:(seq + 1) * history.SEGMENT]
            sealed = stored.sealed
            assert len(entries) == len(cp["history"]) - sealed, "entries sealed in a segment are forgotten"
    assert sealed == 32


def test_an_entry_is_fixed_once_encoded_and_a_new_object_at_its_place_is_encoded():
    entries, hist = history.EntryBytes(), _entries(3)
    history.store({"history": hist}, 0, entries)
    hist[1]["name"] = "changed in place"  # a recorded entry is a record: the stored one stays as first written
    hist[2] = {"step": 2, "name": "a new object"}
    body = codec.decode(history.store({"history": hist}, 0, entries).blob)
    assert [e["name"] for e in body["history"]] == ["s0", "s1", "a new object"]


def test_a_version_1_checkpoint_is_split_on_its_next_write():
    stored = history.store({"history": _entries(40)}, 0)  # a v1 blob carried all 40 entries
    assert [seq for seq, _ in stored.segments] == [0, 1] and stored.sealed == 32
    assert codec.decode(stored.segments[1][1])["entries"] == _entries(40)[16:32]


def test_a_sealed_count_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        history.store({"history": _entries(10)}, 16)


def test_version_1_blobs_stay_readable_and_unknown_versions_are_refused():
    v1 = zlib.compress(json.dumps({"v": 1, "history": _entries(3)}).encode())
    assert codec.decode(v1) == {"history": _entries(3)} and history.sealed_of(codec.decode(v1)) == 0
    v3 = zlib.compress(json.dumps({"v": 3, "history": []}).encode())
    with pytest.raises(ValueError, match="not readable"):
        codec.decode(v3)


def test_segments_and_tail_read_back_as_the_whole_history(store):
    from checkpoints.db import transaction

    run_id = f"hist-{store}"
    full = _entries(37)
    stored = history.store({"history": full}, 0)
    with transaction() as conn:
        history.write_segments_txn(conn, run_id, stored.segments)
        history.write_segments_txn(conn, run_id, stored.segments)  # a retried transaction: same rows, no duplicate
    with transaction(readonly=True) as conn:
        loaded = history.load_txn(conn, run_id, codec.decode(stored.blob))
    assert loaded["history"] == full and history.length(loaded) == 37
    with transaction() as conn:
        history.write_segments_txn(conn, "other-run", stored.segments[:1])
    with transaction(readonly=True) as conn, pytest.raises(RuntimeError, match="expected"):
        history.load_txn(conn, "other-run", codec.decode(stored.blob))


def _drive(run_id: str, until_step: int | None = None) -> str:
    """Deliver the run's steps here as a worker would (continuations not sent); stop before `until_step`."""
    from checkpoints import runs
    from tasks.delivery import deliver

    outcome = "continue"
    while outcome == "continue":
        run = runs.peek_run(run_id)
        assert run is not None
        if until_step is not None and run.step >= until_step:
            break
        outcome = deliver(run_id, run.step, lambda *_: None)
    return outcome


def test_a_long_run_taken_over_mid_way_resumes_with_its_whole_history(mysql_store):
    """A 40-step run (two sealed segments) whose holder of step 20 dies after its claim: the next holder
    takes over, sees every earlier step, and the run ends done once with 40 records, each paid once."""
    from bench import steps_agent
    from checkpoints import ledger, runs
    from harness.verdict import check_run
    from tasks.submit import submit_run

    run_id = submit_run("long-1", steps_agent.query(40), agent=steps_agent.NAME)
    assert _drive(run_id, until_step=20) == "continue"
    assert runs.claim(run_id, "dead-host:1:x/lost") is not None  # claimed, then the process died
    assert _drive(run_id) == "done"
    run = runs.get_run(run_id)
    assert run is not None and run.state == "done" and run.model_calls == 40
    assert [h["name"] for h in run.checkpoint["history"]] == [f"s{i}" for i in range(40)]
    assert history.sealed_of(run.checkpoint) == 32 and history.length(run.checkpoint) == 40
    assert "takeover" in [e.kind for e in ledger.history(run_id)]
    assert check_run(run_id).ok, check_run(run_id).failed


def test_a_version_1_row_of_a_long_run_resumes_and_is_split(mysql_store):
    """A run checkpointed by a build before segments (codec version 1, all 20 entries in the row) resumes
    with its whole history; its next write seals the complete segment and keeps only the tail."""
    import sqlalchemy as sa

    from bench import steps_agent
    from checkpoints import runs
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints as rc
    from checkpoints.schema import run_history
    from tasks.submit import submit_run

    run_id = submit_run("long-2", steps_agent.query(24), agent=steps_agent.NAME)
    assert _drive(run_id, until_step=20) == "continue"
    whole = runs.get_run(run_id)
    assert whole is not None and len(whole.checkpoint["history"]) == 20
    v1 = zlib.compress(json.dumps({"v": 1, "history": whole.checkpoint["history"]}).encode())
    with transaction() as conn:
        conn.execute(sa.delete(run_history).where(run_history.c.run_id == run_id))
        conn.execute(rc.update().where(rc.c.run_id == run_id).values(checkpoint=v1))
    assert _drive(run_id) == "done"
    run = runs.get_run(run_id)
    assert run is not None and [h["name"] for h in run.checkpoint["history"]] == [f"s{i}" for i in range(24)]
    with transaction(readonly=True) as conn:
        row_blob = conn.execute(sa.select(rc.c.checkpoint).where(rc.c.run_id == run_id)).scalar_one()
        seqs = conn.execute(sa.select(run_history.c.seq).where(run_history.c.run_id == run_id)).scalars().all()
    assert sorted(seqs) == [0] and len(codec.decode(row_blob)["history"]) == 24 - 16


def test_a_process_reads_each_sealed_segment_of_a_run_once(mysql_store):
    """The segments a claim read, and those this process's own committed checkpoints sealed, stay with the
    process (they never change once written): the run's next claims here join the history without a read.
    Forgotten at step 20 (as if the run came from another worker), segment 0 is read once, by that claim;
    segment 1, sealed here afterwards, never."""
    from bench import steps_agent
    from bench.step_counts import _counting
    from checkpoints import runs
    from tasks.delivery import deliver
    from tasks.submit import submit_run

    run_id = submit_run("long-3", steps_agent.query(40), agent=steps_agent.NAME)
    history._SEEN.clear()
    reads: dict[int, int] = {}
    real = history._read_txn

    def counted(conn, rid, count):  # type: ignore[no-untyped-def]
        reads[step] = reads.get(step, 0) + 1
        return real(conn, rid, count)

    trips: dict[int, float] = {}
    history._read_txn = counted  # type: ignore[assignment]
    try:
        outcome, step = "continue", 0
        while outcome == "continue":
            if step == 20:
                history._SEEN.clear()
            with _counting() as counts:
                outcome = deliver(run_id, step, lambda *_: None)
            trips[step] = counts["db round trips"]
            step += 1
    finally:
        history._read_txn = real  # type: ignore[assignment]
    assert outcome == "done"
    assert reads == {20: 1}, "a segment read only by a claim in a process that neither read nor sealed it"
    # Round trips are counted at PyMySQL's socket (0 through mysqlclient): the reads above hold for both.
    assert trips[16] == trips[10] and trips[36] == trips[10], f"later claims read nothing more: {trips}"
    run = runs.get_run(run_id)
    assert run is not None and [h["name"] for h in run.checkpoint["history"]] == [f"s{i}" for i in range(40)]


def test_a_segment_a_fenced_out_holder_would_have_sealed_is_not_kept(mysql_store):
    """Kept only after its transaction committed: a holder fenced out sealed nothing, and the step it
    recorded runs again on the new holder, perhaps to another record."""
    from bench import steps_agent
    from checkpoints import runs
    from fenced_core.errors import FencedOut
    from tasks.submit import submit_run

    run_id = submit_run("long-4", steps_agent.query(20), agent=steps_agent.NAME)
    assert _drive(run_id, until_step=15) == "continue"
    history._SEEN.clear()
    old = runs.claim(run_id, "old-host:1:x/a")
    assert old is not None and len(old.run.checkpoint["history"]) == 15
    assert runs.claim(run_id, "new-host:1:x/b") is not None  # the takeover: the old claim's epoch is stale
    record = {"step": 15, "name": "s15", "results": {}}
    with pytest.raises(FencedOut):
        runs.write_step_done(old, 15, {"history": [*old.run.checkpoint["history"], record]},
                             runs.Usage(), old.run.last_event_id or "0-0")
    assert history._SEEN.get(history._default_store(), run_id, 1) is None, "nothing kept from a refused write"


def test_kept_segments_are_kept_by_store_and_run_and_decoded_afresh_for_each_reader(store):
    from checkpoints.db import transaction

    run_id = "kept-1"
    stored = history.store({"history": _entries(20)}, 0)
    with transaction() as conn:
        history.write_segments_txn(conn, run_id, stored.segments)
    history._SEEN.clear()
    checkpoint = codec.decode(stored.blob)
    first = history.load(run_id, checkpoint)
    first["history"][0]["name"] = "changed in place by a program"
    second = history.load(run_id, checkpoint)
    assert second["history"] == _entries(20), "each load decodes its own entries"
    seen = history._Seen(3)
    seen.put("db-a", "r", [(0, b"0"), (1, b"1")])
    assert seen.get("db-b", "r", 1) is None and seen.get("db-a", "other", 1) is None
    assert seen.get("db-a", "r", 3) is None, "every segment the row names, or none"
    assert seen.get("db-a", "r", 2) == [b"0", b"1"]
    seen.put("db-a", "s", [(0, b"x"), (1, b"y")])  # four entries in a cache of three: the least recently used goes
    assert seen.get("db-a", "r", 1) is None and seen.get("db-a", "s", 2) == [b"x", b"y"]
