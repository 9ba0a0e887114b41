"""The `fenced` command line against a real SQLite store and the real local Redis (no workers)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from fenced_cli import app

runner = CliRunner()


def _point_at(db_url: str) -> None:
    from harness.embedded import reload_settings

    os.environ["FENCED_DB_URL"] = db_url
    reload_settings()


@pytest.fixture
def sqlite_store(tmp_path: Path, redis_client: object) -> Iterator[Path]:
    """An empty, migrated SQLite run store; Redis flushed before (by redis_client) and after."""
    from checkpoints.db import migrate

    previous = os.environ["FENCED_DB_URL"]
    path = tmp_path / "cli.db"
    _point_at(f"sqlite:///{path}")
    migrate()
    yield path
    redis_client.flushall()  # type: ignore[attr-defined]  # the wake-ups we sent: no worker will take them
    _point_at(previous)


def _count(table: sa.Table) -> int:
    from checkpoints.db import transaction

    with transaction() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _nothing_written(redis_client: object) -> None:
    from checkpoints.schema import run_checkpoints, run_holds, run_ledger

    assert (_count(run_checkpoints), _count(run_holds), _count(run_ledger)) == (0, 0, 0)
    assert redis_client.dbsize() == 0  # type: ignore[attr-defined]


def test_unknown_run_exits_2_on_every_command(sqlite_store: Path, redis_client: object) -> None:
    for args in (["status", "5e0d1c2b-0000-4000-8000-000000000000"], ["status", "nope"], ["events", "abcd"],
                 ["ledger", "abcd1234"], ["status", "abcd", "--json"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "no run with id" in result.stderr
        assert result.stdout == ""
    _nothing_written(redis_client)


def test_missing_sqlite_store_is_not_created(tmp_path: Path, redis_client: object) -> None:
    previous = os.environ["FENCED_DB_URL"]
    missing = tmp_path / "missing.db"
    _point_at(f"sqlite:///{missing}")
    try:
        result = runner.invoke(app, ["runs"])
    finally:
        _point_at(previous)
    assert result.exit_code == 2
    assert "no run store" in result.stderr
    assert not missing.exists()


@pytest.mark.parametrize("args", [
    ["submit", "--kind", "huge", "buy a lamp"],
    ["submit", "   "],
    ["submit", "--user", "", "buy a lamp"],
    ["submit", "--user", "u" * 129, "buy a lamp"],
])
def test_bad_submit_exits_2_and_writes_nothing(sqlite_store: Path, redis_client: object, args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip()
    assert result.stdout == ""
    _nothing_written(redis_client)


def test_runs_rejects_unknown_state(sqlite_store: Path) -> None:
    result = runner.invoke(app, ["runs", "--state", "bogus"])
    assert result.exit_code == 2
    assert "--state must be one of" in result.stderr


def test_submit_then_status_runs_events_ledger(sqlite_store: Path, redis_client: object) -> None:
    submitted = runner.invoke(app, ["submit", "--user", "alice", "--kind", "large", "buy a backpack", "--json"])
    assert submitted.exit_code == 0, submitted.output
    run_id = json.loads(submitted.stdout)["run_id"]
    assert redis_client.llen("agents.large") == 1  # type: ignore[attr-defined]  # the first wake-up

    status = json.loads(runner.invoke(app, ["status", run_id, "--json"]).stdout)
    assert (status["run_id"], status["user_id"], status["kind"]) == (run_id, "alice", "large")
    assert (status["state"], status["epoch"], status["step"], status["owner"]) == ("queued", 0, 0, None)
    assert [(h["state"], h["credits_held"], h["credits_charged"]) for h in status["holds"]] == [("held", 60, None)]
    assert [e["kind"] for e in status["ledger"]] == ["submitted"]
    assert status["cards"] == [] and status["events"] == 1

    text = runner.invoke(app, ["status", run_id[:8]])  # a unique prefix is enough
    assert text.exit_code == 0, text.output
    assert run_id in text.stdout and "queued" in text.stdout and "held: - of 60 held credits" in text.stdout

    listed = json.loads(runner.invoke(app, ["runs", "--json"]).stdout)
    assert [r["run_id"] for r in listed] == [run_id]
    assert json.loads(runner.invoke(app, ["runs", "--state", "done", "--json"]).stdout) == []
    table = runner.invoke(app, ["runs", "--state", "queued"])
    assert table.exit_code == 0 and run_id in table.stdout and "buy a backpack" in table.stdout

    events = json.loads(runner.invoke(app, ["events", run_id, "--json"]).stdout)
    assert [(e["type"], e["epoch"]) for e in events] == [("run_queued", 0)]
    ledger = json.loads(runner.invoke(app, ["ledger", run_id, "--json"]).stdout)
    assert [(e["kind"], e["actor"]) for e in ledger] == [("submitted", "api")]


def test_lifecycle_commands_refuse_bad_input_clearly(sqlite_store: Path, redis_client: object) -> None:
    from tasks import submit_run

    run_id = submit_run("u1", "buy a lamp")  # queued: no worker runs here
    for args, message in ((["confirm", "card_nope", "--user", "u1"], "no cart card"),
                          (["reply", run_id, "hello"], "not waiting"),
                          (["dlq", "show", run_id], "not in the dead letters"),
                          (["dlq", "replay", run_id], "only dead runs")):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr, (args, result.stderr)
    assert runner.invoke(app, ["cards", run_id]).stdout.strip() == "no cards"
    assert json.loads(runner.invoke(app, ["dlq", "list", "--json"]).stdout) == []


def test_cancel_then_cancel_again_is_a_clear_noop(sqlite_store: Path, redis_client: object) -> None:
    from tasks import submit_run

    run_id = submit_run("u1", "buy a lamp")
    first = runner.invoke(app, ["cancel", run_id, "--json"])
    assert first.exit_code == 0 and json.loads(first.stdout)["previous_state"] == "queued"
    second = runner.invoke(app, ["cancel", run_id])
    assert second.exit_code == 0 and "already cancelled: nothing to cancel" in second.stdout
    status = json.loads(runner.invoke(app, ["status", run_id, "--json"]).stdout)
    assert status["state"] == "cancelled"


def test_bench_passes_its_options_on_to_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fenced bench` is `python -m bench` behind typer: what it is given reaches the benchmark's argv (the
    interleaved rounds included), and a value the benchmark would refuse is refused here first."""
    import bench.cli

    seen: list[list[str]] = []
    monkeypatch.setattr(bench.cli, "main", lambda argv: seen.append(argv) or 0)
    ok = runner.invoke(app, ["bench", "--only", "throughput", "--rounds", "5", "--no-dbos", "--model-ms", "0"])
    assert ok.exit_code == 0, ok.output
    (argv,) = seen
    assert argv[argv.index("--rounds") + 1] == "5" and argv[argv.index("--only") + 1] == "throughput", argv
    assert "--no-dbos" in argv and bench.cli.parse(argv).rounds == 5
    refused = runner.invoke(app, ["bench", "--rounds", "0"])
    assert refused.exit_code == 2 and "--rounds" in refused.output and len(seen) == 1
    ok = runner.invoke(app, ["bench", "--only", "inflight", "--inflight-runs", "40", "--inflight-concurrency", "20",
                             "--inflight-pool", "threads", "--history", "a.json", "--history", "b.json"])
    assert ok.exit_code == 0, ok.output
    parsed = bench.cli.parse(seen[-1])
    assert (parsed.inflight_runs, parsed.inflight_concurrency, parsed.inflight_pool) == (40, 20, "threads"), seen[-1]
    assert [str(p) for p in parsed.history] == ["a.json", "b.json"], seen[-1]
    with pytest.raises(SystemExit) as bad:  # the benchmark's own parser names the field and the choices
        bench.cli.parse(["--inflight-pool", "prefork"])
    assert bad.value.code == 2
