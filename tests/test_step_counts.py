"""bench.step_counts counts what a step asks of the stores (the README's scaling model is built on it)."""

from __future__ import annotations

from bench.step_counts import count


def test_a_step_is_counted_on_both_stores(mysql_store, redis_client):
    result = count(runs=2)
    per = result["per_step"]
    assert result["steps"] == 8  # two four-step runs
    # At least the claim, checkpoint A and checkpoint B (or the terminal write) commit per step, each a
    # round trip of its own; and a step appends events, takes and releases its lease through Redis.
    assert per["db round trips"] >= 3
    assert result["db_write_statements_per_step"] >= 3
    assert per["redis round trips"] >= 3
    assert result["redis_commands_by_name"]["evalsha"] >= 3
    assert result["redis_commands_per_step"] >= result["redis_commands_by_name"]["evalsha"]
