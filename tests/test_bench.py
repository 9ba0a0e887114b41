"""The benchmark harness works end to end (`python -m bench --smoke`); its speed is not judged here.

The smoke run uses its own stores (a private redis-server, the fenced_bench / fenced_bench_dbos
databases, a temporary SQLite file), real Celery workers, real DBOS workers and a real kill."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.breakdown import CPU_PASSES
from bench.cli import ONE_BY_ONE
from harness.workers import REPO_ROOT


@pytest.mark.timeout(600)
def test_smoke_run_measures_every_section(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--results", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "smoke.json").read_text())
    names = [c["name"] for c in r["throughput"]]
    assert names == ["plain Celery", "fenced on mariadb", "fenced on sqlite", ONE_BY_ONE, "DBOS on PostgreSQL"]
    for c in r["throughput"]:
        assert c["done"] == c["runs"] == 20 and c["runs_per_s"] > 0, c
        assert c["latency_ms"]["n"] == (0 if c["name"] == ONE_BY_ONE else 5), c
        assert c["name"] == ONE_BY_ONE or c["latency_ms"]["p50"] > 0, c
        assert not c["failed_checks"], c
        batched = any("submit_many in batches of 50" in n for n in c["notes"])
        assert batched == (c["name"].startswith("fenced on ") and c["name"] != ONE_BY_ONE), c
    # Every contender once a round, the rounds one after another; each keeps every pass, and its figure is
    # its median round's (with two rounds, the slower).
    assert r["params"]["rounds"] == 2
    order = [line.split("throughput: ", 1)[1] for line in proc.stderr.splitlines() if ", round " in line]
    labels = [n.removesuffix(" on PostgreSQL") for n in names]  # the progress line says "DBOS"
    assert order == [f"{n}, model 0 ms per step, round {k} of 2" for k in (1, 2) for n in labels], order
    for c in r["throughput"]:
        assert len(c["passes"]) == 2 and all(x["done"] == x["runs"] == 20 for x in c["passes"]), c
        assert c["runs_per_s"] == min(x["runs_per_s"] for x in c["passes"]), c
    names.remove(ONE_BY_ONE)
    model = r["throughput_model"]
    assert [c["name"] for c in model] == names and all(c["done"] == c["runs"] == 8 for c in model)
    sub = r["submit"]  # no workers: each phase ended with a message (and a fenced run row) per submit
    assert [x["name"] for x in sub["phases"]] == ["submit_run", "submit_many (batches of 50)",
                                                  "submit_many (batches of 100)", "plain Celery apply_async"]
    for x in sub["phases"]:
        assert x["submits"] == x["messages_waiting"] == 20 and x["per_s"] > 0, x
        assert x["run_rows"] == (None if x["name"].startswith("plain") else 20), x
    assert sub["best_fenced_per_s"] == max(x["per_s"] for x in sub["phases"][:3])
    for store in ("mariadb", "sqlite"):
        b = r["breakdown"][store]
        assert b["cpu_ms_per_step"] > 0 and "function calls" in b["profile"]
        assert b["inline_steps"] == 8 and b["one_step_per_delivery"]["cpu_ms_per_step"] > 0, "both ways measured"
        for measured in (b, b["plain_step"]):  # the figure is the median pass, every pass kept
            passes = measured["cpu_ms_per_step_passes"]
            assert len(passes) == CPU_PASSES and measured["cpu_ms_per_step"] == sorted(passes)[CPU_PASSES // 2], passes
        assert (tmp_path / f"profile-{store}-smoke.txt").exists()
        assert b["steps"] == 12  # 3 runs x 4 steps
        for piece in ("claim (epoch + 1)", "checkpoint A", "checkpoint B", "events", "send"):
            assert b["pieces"][piece]["p50"] > 0, (store, piece)
        assert b["counted_steps"] == 4 and b["redis_round_trips_per_step"] > 0, b
        assert (b["sql_round_trips_per_step"] > 0) == (store == "mariadb"), "SQLite has no round trips to count"
    phases = [(x["step"], x["phase"]) for x in r["checkpoint"]["rows"]]
    assert phases[:2] == [(0, "decided"), (0, "done")] and phases[-1] == (3, "decided")
    assert all(x["stored_bytes"] > 0 for x in r["checkpoint"]["rows"])
    small, big = r["growth"]["rows"]
    assert (small["in_flight"], big["in_flight"]) == (100, 1000)
    for tick in ("reaper, none expired", "reaper, 10 expired", "liveness check", "presumed dead (5 leases)"):
        assert small[tick]["redis_cmds"] == big[tick]["redis_cmds"], f"{tick} grew with runs in flight"
    assert small["presumed dead (5 leases)"]["rescued"] == big["presumed dead (5 leases)"]["rescued"] == 5
    assert small["reaper, 10 expired"]["rescued"] == 10
    quiet = "sweeper, every row quiet past its grace"
    assert small[quiet]["rescued"] == big[quiet]["rescued"] == 0, "a live lease must keep the sweeper away"
    assert all(x["round_trips"] == 1 for x in r["growth"]["renewal"]), "renewal must be one batch per process"
    (t,) = r["takeover"]
    assert t["ok"] and t["n"] > 0 and t["p95"] < t["target_p95_ms"], t
    md = (tmp_path / "benchmarks.md").read_text()
    assert "fenced (mariadb) client CPU per step <= 1.5 ms" in md and "Round trips per step" in md
    assert "| fenced (mariadb) throughput >= 0.7 x plain Celery | " in md and " x (rounds " in md, "compared by round"
    best = f"{sub['best_fenced_per_s']:,.0f}/s"
    assert f"| one client submits >= 500 runs/s on MariaDB (submit_run or submit_many) | {best} (" in md
    for heading in ("## Targets", "## Throughput and latency", "### With a model that takes 200 ms",
                    "## Submission from one client",
                    "## Where a fenced step's time goes",
                    "## Takeover latency", "## Detection cost", "## Checkpoint size", "Smoke run"):
        assert heading in md
    assert (tmp_path / "benchmarks.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_live_events_smoke(tmp_path):
    """`python -m bench.api_live --smoke`: one API process, 20 WebSocket clients on 10 runs real workers
    execute (about 10 s); every stream ends after its run's final event and folds into its live view."""
    proc = subprocess.run([sys.executable, "-m", "bench.api_live", "--smoke", "--results", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (r,) = json.loads((tmp_path / "api-live-smoke.json").read_text())["passes"]
    assert (r["clients"], r["runs"]) == (20, 10) and r["close_codes"] == {"1000": 20}, r
    assert r["views_mismatched"] == 0 and r["events_delivered"] > 20 * 4, r
    assert r["latency_ms"]["p50"] is not None and r["rss_peak_mb"] >= r["rss_idle_mb"] > 0, r
    assert "## Live events (WebSocket fan-out)" in proc.stdout


def test_the_round_trip_counter_counts_what_it_says(store):
    """bench.breakdown.round_trips: one per query sent to MySQL/MariaDB (a multi-statement query with its
    COMMIT counts once), none for SQLite, one per Redis command or pipeline."""
    from bench.breakdown import round_trips
    from checkpoints import runs
    from fencing.connection import get_redis

    with round_trips() as trips:
        assert runs.peek_run("no-such-run") is None  # SELECT and COMMIT, one query on MySQL
        get_redis().ping()
        pipe = get_redis().pipeline(transaction=False)
        pipe.get("a").get("b")
        pipe.execute()
    assert trips == {"sql": 1 if store == "mysql" else 0, "redis": 2}, trips


def test_the_blob_byte_counter_counts_what_the_driver_sends(mysql_store):
    """bench.longrun.blob_bytes: the bytes parameters of each statement, through whichever MySQL driver the
    store's URL names (the 52-step section's "bytes written"; it read None on mysqlclient before)."""
    import sqlalchemy as sa

    from bench.longrun import blob_bytes
    from checkpoints.db import transaction

    with blob_bytes() as seen, transaction() as conn:
        conn.execute(sa.text("SELECT :a, :b"), {"a": b"\x00" * 7, "b": "text is not counted"})
        conn.execute(sa.text("SELECT 1"))
    assert seen == [7, 0], seen


def test_a_full_run_rewrites_its_sections_and_keeps_the_rest(tmp_path):
    """`fenced bench` rewrites docs/benchmarks.md; what follows the KEPT line (routing, submission, in flight,
    step cost: written by hand or by other commands) survives the rewrite, once, however many runs."""
    from bench.cli import KEPT, _render

    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks (an old run)\n\nstale figures\n\n" + KEPT + "\n\n## Written by hand\n\nkept text\n")
    result = json.loads((REPO_ROOT / "bench" / "results" / "latest.json").read_text())
    for _ in range(2):
        _render(result, tmp_path)
    text = page.read_text()
    assert "stale figures" not in text and "## Targets" in text
    assert text.count(KEPT) == 1 and text.count("## Written by hand\n\nkept text\n") == 1
    assert text.index("## Targets") < text.index(KEPT)


def test_the_batching_benchmark_measures_appends_and_checkpoints_per_round_trip(mysql_store):
    """`python -m bench.batching`: every append it times lands (the count in the streams is exact), its
    keys are removed afterwards, and its checkpoint statements reach the server yet write nothing
    (fenced on a run that does not exist)."""
    from fencing.connection import get_redis
    from tests.conftest import MYSQL_URL, REDIS_URL

    proc = subprocess.run([sys.executable, "-m", "bench.batching", "--redis-url", REDIS_URL, "--db-url", MYSQL_URL,
                           "--redis-batches", "1,4", "--sql-batches", "1,3", "--rounds", "2", "--repeat", "6"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # Run i gets one append per batch of every size above i: a warm-up, then rounds x repeat batches.
    assert result["redis"]["appended"] == 2 * (1 + 2 * 6) + 3 * (1 + 2 * 6)
    assert set(result["redis"]["per_append_us"]) == {"1", "4"}
    assert all(us > 0 for us in result["redis"]["per_append_us"].values())
    assert set(result["sql"]["per_checkpoint_us"]) == {"1", "3"}
    assert all(us > 0 for us in result["sql"]["per_checkpoint_us"].values())
    assert result["sql"]["rows_matched"] == 0
    assert get_redis().keys("*bench-batching-*") == []
    assert "event appends, 4 per round trip" in proc.stderr


def test_targets_compare_the_contenders_round_by_round():
    """bench.report: with interleaved rounds, a ratio is the median of the rounds' ratios (passes seconds
    apart), not the ratio of medians taken from different minutes; a result of one pass compares its figures."""
    from bench.report import targets

    def contender(name: str, rounds: list[tuple[float, float]]) -> dict:
        passes = [{"name": name, "runs_per_s": rps, "step_latency_ms": {"p50": p50}} for rps, p50 in rounds]
        middle = sorted(passes, key=lambda x: x["runs_per_s"])[1]
        return {**middle, "passes": passes}

    plain = contender("plain Celery", [(100, 1.0), (200, 1.5), (300, 2.0)])
    fenced = contender("fenced on mariadb", [(90, 2.0), (190, 4.0), (120, 5.0)])  # ratios 0.9, 0.95, 0.4
    found = {t: (v, ok) for t, v, ok in targets({"throughput": [plain, fenced]})}
    assert found["fenced (mariadb) throughput >= 0.7 x plain Celery"] == ("0.90 x (rounds 0.40-0.95)", True)
    assert found["fenced (mariadb) step overhead <= 2 ms p50 over plain Celery"] == ("2.5 ms (rounds 1.0-3.0)", False)
    one = [{k: v for k, v in c.items() if k != "passes"} for c in (plain, fenced)]  # 120 / 200
    found = {t: (v, ok) for t, v, ok in targets({"throughput": one})}
    assert found["fenced (mariadb) throughput >= 0.7 x plain Celery"] == ("0.60 x", False)


def test_a_takeover_target_names_and_judges_the_chaos_bound_it_is_held_to():
    """bench.report: each takeover row states the bound it is judged by (chaos.scenarios.bounds: lease only,
    two leases + a tick + 2 s), not a bound it does not apply: a 3 s lease's 6.7 s p95 is within 8.375 s."""
    from bench.report import targets

    def takeover(fast: bool, p95: float, target: int) -> dict:
        return {"lease_ms": 3000, "fast_takeover": fast, "p95": p95, "target_p95_ms": target}

    found = {t: (v, ok) for t, v, ok in targets({"takeover": [
        takeover(False, 6707.0, 8375), takeover(True, 3100.0, 3000)]})}
    assert found == {"takeover p95 <= 8.375 s, the chaos bound (3 s lease, lease only)": ("6.71 s", True),
                     "takeover p95 <= 3 s, the chaos bound (3 s lease, fast takeover)": ("3.10 s", False)}


def test_a_contender_of_several_rounds_shows_what_went_wrong_in_any_of_them():
    """bench.throughput.combine: the median round stands for the contender, but a broken promise or an
    unfinished round elsewhere is not hidden behind it (and `fenced bench` exits 1 on either)."""
    from bench.cli import _healthy
    from bench.throughput import combine

    def one(rps: float, done: int = 20, failed: tuple[str, ...] = ()) -> dict:
        return {"name": "fenced on mariadb", "runs": 20, "done": done, "runs_per_s": rps, "notes": ["batched"],
                "failed_checks": list(failed)}

    c = combine([one(90, failed=("r1: two cards",)), one(80), one(70, done=19)])
    assert c["runs_per_s"] == 80 and c["done"] == 20 and len(c["passes"]) == 3
    assert c["failed_checks"] == ["r1: two cards"] and c["notes"] == ["batched", "round 3: 19 of 20 runs done"]
    assert not _healthy({"throughput": [combine([one(90), one(80), one(70, done=19)])]})
    assert _healthy({"throughput": [combine([one(90), one(80), one(70)])]})


def test_the_history_table_shows_every_target_run_by_run(tmp_path, capsys):
    """`python -m bench --history A.json B.json`: one row per target, one column per run (oldest first, by
    the run's date, with its machine), each cell the measured value, marked NO when missed; a target a run
    did not measure reads `-`."""
    from bench.cli import main

    def result(date: str, cpu: str, plain: float, fenced: float) -> dict:
        def c(name: str, rps: float, p50: float) -> dict:
            return {"name": name, "runs_per_s": rps, "step_latency_ms": {"p50": p50}}
        return {"date": f"{date} UTC", "machine": {"cpu": f"{cpu}, 2 cores, 24 GiB"},
                "throughput": [c("plain Celery", plain, 1.0), c("fenced on mariadb", fenced, 2.5)]}

    newer, older = tmp_path / "b.json", tmp_path / "a.json"
    newer.write_text(json.dumps(result("2026-12-06 22:04", "AMD EPYC", 200, 160)))
    only_submit = {"date": "2026-12-05 12:50 UTC", "machine": {"cpu": "Intel(R) Xeon(R) Processor, 2 cores"},
                   "submit": {"target_per_s": 500, "best_fenced_per_s": 2300.0, "met": True,
                              "phases": [{"name": "submit_many (batches of 100)", "per_s": 2300.0, "run_rows": 20}]}}
    older.write_text(json.dumps(only_submit))
    assert main(["--history", str(newer), str(older)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| target (UTC; machine) | 2026-12-05 12:50, Intel Xeon | 2026-12-06 22:04, AMD EPYC |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["fenced (mariadb) throughput >= 0.7 x plain Celery"].endswith("| - | 0.80 x |")
    assert rows["fenced (mariadb) step overhead <= 2 ms p50 over plain Celery"].endswith("| - | 1.5 ms |")
    assert rows["one client submits >= 500 runs/s on MariaDB (submit_run or submit_many)"].endswith("| 2,300/s | - |")
    newer.write_text(json.dumps(result("2026-12-06 22:04", "AMD EPYC", 200, 100)))
    assert main(["--history", str(newer)]) == 0
    assert "| 0.50 x **NO** |" in capsys.readouterr().out
    (tmp_path / "not-a-run.json").write_text("[1]")
    for bad, says in ((tmp_path / "missing.json", "cannot read saved results"), (tmp_path / "not-a-run.json",
                                                                                  "is not a saved `fenced bench` run")):
        with pytest.raises(SystemExit) as refused:
            main(["--history", str(newer), str(bad)])
        assert refused.value.code == 2
        err = capsys.readouterr().err
        assert says in err and str(bad) in err and err.count("\n") == 1, err
