"""The long-run and in-flight benchmark sections measure what they say (their speed is not judged here).

`python -m bench --smoke --only longrun,inflight` on its own stores (a private redis-server, the
fenced_bench database), real Celery workers and a real kill -9: the figures must come from the runs
they name (every step delivered, every run's history complete, the window's steps counted from the
checkpoints it holds, the killed worker's runs taken over by someone else, all runs done once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.workers import REPO_ROOT


@pytest.mark.timeout(400)
def test_longrun_and_inflight_sections_measure_what_they_say(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--only", "longrun,inflight", "--no-dbos",
                           "--results", str(tmp_path)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=360)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "smoke.json").read_text())

    lr = r["longrun"]
    assert lr["deliveries"] == lr["runs"] * lr["steps"] == 2 * 52, lr
    # Every run's history, read back as a resume reads it, holds one record per step: nothing lost to storage.
    assert lr["history_entries"] == [lr["steps"]] * lr["runs"], lr["history_entries"]
    assert [x["step"] for x in lr["at"]] == [5, 20, 50]
    for x in lr["at"]:
        assert x["written_bytes"] > 0 and x["cpu_ms"] > 0 and x["checkpoint_b_stored_bytes"] > 0, x
    assert set(lr["ratio_last_to_first"]) >= {"written_bytes", "cpu_ms"}

    f = r["inflight"]
    p, w = f["params"], f["window"]
    assert (p["runs"], p["concurrency"], p["pool"]) == (40, 20, "gevent")
    assert w["runs_in_flight"] == p["runs"], "the window must start after every run started and end before one ended"
    assert w["steps"] > 0 and abs(w["steps_per_s"] * w["seconds"] - w["steps"]) <= 1, w
    assert w["peak_steps_per_s"] > 0, w
    assert w["ideal_steps_per_s"] == p["runs"] / (p["model_ms"] / 1000)
    assert 0 < w["gap_ms"]["n"] <= w["steps"] and w["gap_ms"]["p50"] >= 0, w
    # Every step end in the window was matched with the next step's first event, and with its claim.
    assert w["steps_without_event"] == 0, w
    split = w["claim_gap_ms"]
    assert split["inline"]["n"] + split["handed_over"]["n"] == w["gap_ms"]["n"], w
    assert f["memory"]["per_run_kb"] > 0 and f["memory"]["peak_db_connections"] > 0, f["memory"]
    t = f["takeover"]
    assert t["held_mid_step"] > 0 and t["claimed_again"] == t["held_mid_step"] and not t["not_claimed"], t
    # The runs counted as held were taken over from the killed process, as the ledger says.
    assert t["takeovers_from_victim"] == t["held_mid_step"], t
    # Every run held was rescued (its ledger entry) before its claim: the latency splits in two.
    assert t["rescued_ms"]["n"] == t["claimed_after_rescue_ms"]["n"] == t["held_mid_step"], t
    assert 0 < t["rescued_ms"]["p50"] <= t["latency_ms"]["p50"], t
    assert t["restarted"], t
    # Each run held was first claimed by the survivor or by the victim's restart, and the split adds up.
    assert sum(v["n"] for v in t["claimed_by_ms"].values()) == t["held_mid_step"], t
    assert set(t["claimed_by_ms"]) <= {"survivor", "restarted"}, t
    if "restarted" in t["claimed_by_ms"]:
        assert t["restarted_first_claim_ms"] <= t["claimed_by_ms"]["restarted"]["p50"], t
    assert f["runs_passed"] == p["runs"] and f["states"] == {"done": p["runs"]}, f
    # No consumer reconnect requeued the wake-ups still running (kombu's pool cap did, 2026-12-02).
    d = f["deliveries"]
    assert d["broker_restores"] == 0 and d["too_many_connections"] == 0, d
    assert any(row["target"].startswith("wake-ups delivered twice") for row in f["targets"]), f["targets"]
    assert {row["target"].split(" ")[0] for row in f["targets"]} >= {"steps/s", "p95", "takeover", "memory"}
    md = (tmp_path / "benchmarks.md").read_text()
    for heading in ("## Long runs: checkpoint growth", "## In flight: slow-model runs held at once", "## Targets"):
        assert heading in md


def test_the_steps_target_is_judged_against_every_run_submitted():
    """A machine too slow to keep every run in flight (the last runs start after the first ones end) does
    not meet the steps/s target against the few runs still in flight in its window."""
    from bench.inflight import targets

    def row(in_flight: int, per_s: float) -> dict:
        r = {"params": {"runs": 1000, "model_ms": 2000},
             "window": {"steps_per_s": per_s, "runs_in_flight": in_flight, "ideal_steps_per_s": in_flight / 2,
                        "ratio_to_ideal": round(per_s / (in_flight / 2), 3), "gap_ms": {"p95": 10.0, "p50": 5.0}}}
        return targets(r)[0]

    slow = row(225, 114.1)
    assert slow["met"] is False and "114.1 of 500 ideal = 0.228" in slow["measured"], slow
    assert "225 in flight in the window: 1.014" in slow["measured"], slow
    kept = row(1000, 450.0)
    from bench.inflight import peak_rate

    assert peak_rate([0, 100, 9_999, 10_000, 30_000], span_ms=10_000) == 0.3, "3 commits within one 10 s span"
    assert kept["met"] is True and kept["measured"] == "450.0 of 500 ideal = 0.9", kept


def test_a_gap_of_zero_meets_the_gap_target_and_none_does_not():
    """A p95 of 0.0 ms read as 'not measured' once (`p95 or 1e9`)."""
    from bench.inflight import targets

    def gap_row(p95: float | None) -> dict:
        return targets({"params": {"runs": 10, "model_ms": 2000},
                        "window": {"steps_per_s": 4.0, "runs_in_flight": 10, "gap_ms": {"p95": p95, "p50": p95}}})[1]

    assert gap_row(0.0)["met"] is True and gap_row(50.0)["met"] is True
    assert gap_row(50.1)["met"] is False and gap_row(None)["met"] is False


def test_a_zero_model_time_is_refused_with_the_option_named(capsys):
    """The ideal pace divides by the model time: --model-ms 0 crashed after a full run (ZeroDivisionError);
    now it is refused before anything starts."""
    from bench.inflight import main

    with pytest.raises(SystemExit) as exc:
        main(["--model-ms", "0"])
    assert exc.value.code == 2
    assert "--model-ms must be at least 1" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_cpu_split_measures_both_passes_on_real_workers(mysql_store, tmp_path):
    """`python -m bench.cpu_split`: a burst per FENCED_INLINE_STEPS value on real workers, CPU per step read
    from /proc for the workers, mariadbd and redis-server; the inline pass really ran steps inline and
    the other did not. The stores are the arguments', not the environment's (which points nowhere here):
    the command once submitted its burst to the environment's stores and waited forever."""
    from tests.conftest import MYSQL_URL, REDIS_URL

    elsewhere = {**os.environ, "FENCED_DB_URL": f"sqlite:///{tmp_path}/not-these.db",
                 "FENCED_REDIS_URL": "redis://127.0.0.1:6399/0", "FENCED_BROKER_URL": "redis://127.0.0.1:6399/0"}
    proc = subprocess.run([sys.executable, "-m", "bench.cpu_split", "--redis-url", REDIS_URL, "--db-url", MYSQL_URL,
                           "--runs", "20", "--inline", "8", "--inline", "0", "--log-dir", str(tmp_path)],
                          cwd=REPO_ROOT, env=elsewhere, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    on, off = (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))
    assert (on["inline_steps"], off["inline_steps"]) == (8, 0)
    for p in (on, off):
        assert p["runs"] == 20 and p["steps_per_s"] > 0, p
        assert all(p["cpu_ms_per_step"][k] > 0 for k in ("workers", "mariadb", "redis", "client")), p
    assert on["inline_deliveries"] >= 20 and off["inline_deliveries"] == 0, (on, off)


def test_the_rescue_batch_benchmark_rescues_every_run_both_ways(mysql_store):
    """bench.rescue_batch: each measured rescue released and woke every run it says (the wake-ups are on
    the queue, as many as the runs), once one by one and once in a batch, alternating."""
    from bench.rescue_batch import measure

    rows = measure(runs=25, rounds=2)
    assert [r["batched"] for r in rows] == [False, True, False, True]
    assert all(r["runs"] == r["rescued"] == r["queued"] == 25 for r in rows), rows
    assert all(r["wall_ms"] > 0 and r["cpu_ms"] >= 0 for r in rows), rows
