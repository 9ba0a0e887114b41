"""`python -m bench` / `fenced bench`: every benchmark figure in one run, written as JSON, markdown and PNG.

Sections (all by default): throughput (plain Celery, fenced on MariaDB and SQLite, DBOS; at zero latency in
`--rounds` interleaved rounds, compared round by round), submit (one client's
submits/s through submit_run and submit_many against plain Celery's apply_async, no workers), breakdown
(where a fenced step's time goes), checkpoint (size per step), growth (detection cost at 100 / 1k / 10k
runs in flight), takeover (kill -> task_resumed at a 30 s and a 3 s lease), longrun (50-step runs: step cost and
checkpoint bytes at steps 5, 20 and 50), inflight (1,000 runs with a 2 s model call on 2 workers: steps/s against
the ideal, step-to-step gap, memory per run, takeover under that load). The stores are private or
fresh: a redis-server of our own, the MariaDB database `fenced_bench` and the PostgreSQL database
`fenced_bench_dbos` (both dropped and created), a SQLite file in a temporary directory.

`--smoke` runs every section at tiny sizes in a minute or two: CI uses it to check the harness works.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("throughput", "submit", "breakdown", "checkpoint", "growth", "takeover", "longrun", "inflight")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the harness, measures nothing")
    p.add_argument("--runs", type=int, help="throughput burst size (default 400, smoke 20; a quarter with --model-ms)")
    p.add_argument("--latency-runs", type=int, help="runs timed one at a time (default 100, smoke 5)")
    p.add_argument("--model-ms", type=int, default=200,
                   help="the second throughput pass: stub model latency per step (0 = skip that pass)")
    p.add_argument("--rounds", type=int,
                   help="zero-latency throughput: rounds of every contender, interleaved (default 3, smoke 2)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--inflight-runs", type=int, help="inflight: runs kept in flight (default 1000, smoke 40)")
    p.add_argument("--inflight-concurrency", type=int, help="inflight: worker concurrency (default 500, smoke 20)")
    p.add_argument("--inflight-pool", default="gevent", choices=("gevent", "threads"),
                   help="inflight: the workers' pool")
    p.add_argument("--no-dbos", action="store_true", help="leave DBOS out (it needs PostgreSQL and `dbos`)")
    p.add_argument("--results", type=Path, help="where the JSON goes (default bench/results)")
    p.add_argument("--docs", type=Path, help="where benchmarks.md and .png go (default docs; smoke: --results)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only write the markdown and PNG from saved results")
    p.add_argument("--history", type=Path, nargs="+", metavar="JSON",
                   help="only print every target over these saved full runs, as one markdown table (oldest first)")
    args = p.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    unknown = set(args.only) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    args.runs = args.runs or (20 if args.smoke else 400)
    args.latency_runs = args.latency_runs or (5 if args.smoke else 100)
    args.rounds = args.rounds or (2 if args.smoke else 3)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.results = args.results or ROOT / "bench" / "results"
    args.docs = args.docs or (args.results if args.smoke else ROOT / "docs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.render:
        _render(_saved(args.render), args.docs)
        return 0
    if args.history:
        from bench.report import history

        saved = sorted((_saved(path) for path in args.history), key=lambda r: r["date"])
        print(history(saved), end="")
        return 0
    from bench.stores import BenchStores, machine, using

    started = time.monotonic()
    params = {"runs": args.runs, "latency_runs": args.latency_runs, "rounds": args.rounds, "workers": args.workers,
              "concurrency": args.concurrency, "model_ms": args.model_ms}
    result: dict[str, Any] = {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "smoke": args.smoke,
                              "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
                              "machine": machine(), "params": params}
    with BenchStores() as stores:
        # Before anything imports the Celery apps: they read the broker URL once.
        os.environ.update({"FENCED_REDIS_URL": stores.redis_url, "FENCED_MAX_QUEUED_RUNS": "1000000",
                           "FENCED_STUB_STEP_MS": "0", "FENCED_STUB_TOOL_MS": "0"})
        from harness.demo import quiet_core_logs
        from harness.embedded import reload_settings

        reload_settings()
        quiet_core_logs()
        say = _progress(started)
        say(f"stores: redis {stores.redis_url}, {stores.urls}, dbos {stores.dbos_url}; logs in {stores.base}")
        if "throughput" in args.only:
            result["throughput"] = _throughput(args, stores, say)
            if args.model_ms:
                result["throughput_model"] = _throughput(args, stores, say, step_ms=args.model_ms)
        mariadb = stores.urls["mariadb"]
        if "submit" in args.only:
            stores.flush_redis()
            with using(stores.redis_url, mariadb, **LIMITS):
                from bench import submit

                runs = 20 if args.smoke else SUBMITS
                say(f"submit: {runs} submits from one client each way, no workers")
                result["submit"] = submit.run(runs, list(SUBMIT_BATCHES))
                say(f"  best fenced {result['submit']['best_fenced_per_s']} submits/s")
        if "breakdown" in args.only:
            result["breakdown"] = {}
            for store, url in stores.urls.items():
                stores.flush_redis()
                with using(stores.redis_url, url):
                    from bench import breakdown

                    say(f"breakdown on {store}")
                    result["breakdown"][store] = breakdown.measure(3 if args.smoke else 50)
        if "checkpoint" in args.only:
            with using(stores.redis_url, mariadb):
                from bench import checkpoint_size

                say("checkpoint size")
                result["checkpoint"] = checkpoint_size.measure()
        if "growth" in args.only:
            stores.flush_redis()
            with using(stores.redis_url, mariadb):
                from bench import growth

                sizes = (100, 1000) if args.smoke else (100, 1_000, 10_000)
                say(f"growth at {sizes} runs in flight")
                result["growth"] = growth.measure(sizes)
        if "takeover" in args.only:
            result["takeover"] = _takeover(args, stores, say)
        if "longrun" in args.only:
            stores.flush_redis()
            with using(stores.redis_url, mariadb, **LIMITS):
                from bench import longrun

                say("longrun: 50-step runs driven in this process")
                result["longrun"] = longrun.measure(2 if args.smoke else 6, longrun.STEPS)
        if "inflight" in args.only:
            result["inflight"] = _inflight(args, stores, say)
    result["elapsed_s"] = time.monotonic() - started
    _write(result, args)
    say(f"done in {result['elapsed_s']:.0f} s")
    return 0 if _healthy(result) else 1


ONE_BY_ONE = "fenced on mariadb, submit_run one at a time"


def _throughput(args: argparse.Namespace, stores: Any, say: Any, step_ms: int = 0) -> list[dict[str, Any]]:
    """Every contender on the same burst; with `step_ms`, a smaller burst and no latency runs."""
    from bench import throughput as tp

    runs = args.runs if not step_ms else max(8, args.runs // 4)
    p = tp.Params(runs=runs, latency_runs=0 if step_ms else args.latency_runs, workers=args.workers,
                  concurrency=args.concurrency, log_dir=stores.base, step_ms=step_ms)
    contenders: list[tuple[str, Any]] = [("plain Celery", lambda: tp.plain(p))]
    for store, url in stores.urls.items():
        contenders.append((f"fenced on {store}", lambda s=store, u=url: tp.fenced(p, s, stores.redis_url, u)))
    if not step_ms and "mariadb" in stores.urls:
        # The burst as before 2026-12-01: one submit_run per run, so the client's submits bound it.
        one = dataclasses.replace(p, submit_batch=1, latency_runs=0)
        contenders.append((ONE_BY_ONE, lambda: tp.fenced(one, "mariadb", stores.redis_url, stores.urls["mariadb"],
                                                         name=ONE_BY_ONE)))
    if not args.no_dbos:
        contenders.append(("DBOS", lambda: tp.dbos(p, stores.dbos_url)))
    # Zero-latency figures move with a shared VM's speed from one minute to the next: every contender runs
    # in each round, rounds one after another, so each ratio compares passes seconds apart (bench.report).
    rounds = 1 if step_ms else args.rounds
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in contenders}
    for k in range(rounds):
        for name, run in contenders:
            stores.flush_redis()
            which = f", round {k + 1} of {rounds}" if rounds > 1 else ""
            say(f"throughput: {name}, model {step_ms} ms per step{which}")
            r = run().to_dict()
            say(f"  {r['runs_per_s']} runs/s, step p50 {r['step_latency_ms']['p50']} ms")
            passes[name].append(r)
    return [tp.combine(ps) for ps in passes.values()]


# The submit section: submits from one client each way, and the submit_many batch sizes (bench.submit).
SUBMITS = 1000
SUBMIT_BATCHES = (50, 100)

# Admission and billing limits lifted for the long and in-flight runs (thousands of runs for a few users).
LIMITS = {"FENCED_MAX_QUEUED_RUNS": "10000000", "FENCED_MAX_RUNS_PER_USER": "10000000",
          "FENCED_DEFAULT_BALANCE_CREDITS": "1000000000000"}


def _inflight(args: argparse.Namespace, stores: Any, say: Any) -> dict[str, Any]:
    from bench import inflight
    from bench.stores import using

    if args.smoke:
        p = inflight.Params(runs=args.inflight_runs or 40, concurrency=args.inflight_concurrency or 20,
                            pool=args.inflight_pool, model_ms=500, steps=8, window_s=2.0, log_dir=stores.base)
    else:
        p = inflight.Params(runs=args.inflight_runs or 1000, concurrency=args.inflight_concurrency or 500,
                            pool=args.inflight_pool, log_dir=stores.base)
    stores.flush_redis()
    with using(stores.redis_url, stores.urls["mariadb"], **LIMITS, FENCED_IMPORTS=inflight.IMPORTS):
        say(f"inflight: {p.runs} runs of {p.steps} steps, model {p.model_ms} ms, {p.workers} workers x {p.pool} "
            f"{p.concurrency}")
        r = inflight.measure(p)
        w = r["window"]
        say(f"  {w['steps_per_s']} steps/s of {w['ideal_steps_per_s']} ideal, gap p95 {w['gap_ms']['p95']} ms")
        return r


def _takeover(args: argparse.Namespace, stores: Any, say: Any) -> list[dict[str, Any]]:
    from bench import takeover
    from bench.stores import using

    plan = [(3_000, False, 2)] if args.smoke else [(30_000, False, 4), (3_000, False, 8), (30_000, True, 4),
                                                  (3_000, True, 4)]
    out = []
    for lease_ms, fast, rounds in plan:
        stores.flush_redis()
        with using(stores.redis_url, stores.urls["mariadb"]):
            say(f"takeover: {lease_ms / 1000:g} s lease, fast takeover {'on' if fast else 'off'}, {rounds} kills")
            t = takeover.measure(lease_ms, fast, rounds, stores.base)
            say(f"  p50 {t['p50']} ms, p95 {t['p95']} ms over {t['n']} takeovers; {t['passed']}/{t['runs']} runs ok")
            out.append(t)
    return out


def _healthy(r: dict[str, Any]) -> bool:
    """Every run the benchmark started finished and passed its checks (speed is not judged here)."""
    ok = all(x["done"] == x["runs"] and not x["failed_checks"]
             for c in r.get("throughput", []) + r.get("throughput_model", []) for x in c.get("passes", [c]))
    inflight = r.get("inflight")
    ok = ok and (inflight is None or inflight["runs_passed"] == inflight["params"]["runs"])
    return ok and all(t["ok"] for t in r.get("takeover", []))


def _write(r: dict[str, Any], args: argparse.Namespace) -> None:
    args.results.mkdir(parents=True, exist_ok=True)
    stem = "smoke" if r["smoke"] else f"bench-{r['date'][:10]}"
    text = json.dumps(r, indent=1, default=str)
    (args.results / f"{stem}.json").write_text(text)
    if not r["smoke"]:
        (args.results / "latest.json").write_text(text)
    for store, b in r.get("breakdown", {}).items():
        if "profile" in b:
            (args.results / f"profile-{store}{'-smoke' if r['smoke'] else ''}.txt").write_text(
                f"cProfile of in-process fenced deliveries on {store}, {r['date']} (by own time)\n\n{b['profile']}\n")
    print(_render(r, args.docs))


# In docs/benchmarks.md, everything from this line on is kept when a full run rewrites the page: the
# sections written by hand or by other commands (routing, submission, in flight, step cost).
KEPT = "<!-- kept by fenced bench: the sections below are written by hand or by other commands -->"


def kept_sections(page: Path) -> str:
    """What `page` holds from the KEPT line on ('' without one)."""
    text = page.read_text() if page.exists() else ""
    at = text.find(KEPT)
    return "" if at < 0 else "\n" + text[at:]


def _saved(path: Path) -> dict[str, Any]:
    """A saved full run (bench/results/bench-*.json); a file that is not one stops the command in one line."""
    try:
        r = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        _refuse(f"cannot read saved results {path}: {exc}")
    if not isinstance(r, dict) or "date" not in r:
        _refuse(f"{path} is not a saved `fenced bench` run (it has no date)")
    return r


def _refuse(message: str) -> NoReturn:
    """Bad input from the command line: one line on stderr, exit 2 (as argparse does)."""
    print(f"python -m bench: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _render(r: dict[str, Any], docs: Path) -> str:
    """Write benchmarks.md and benchmarks.png under `docs`; returns the markdown."""
    from bench.api_live import saved_section
    from bench.report import markdown, plot

    docs.mkdir(parents=True, exist_ok=True)
    md = markdown(r)
    page = docs / "benchmarks.md"
    # The live-events figures come from their own run (python -m bench.api_live), and the sections
    # after KEPT from elsewhere: kept, not lost.
    page.write_text(md + "\n![benchmarks](benchmarks.png)\n" + saved_section() + kept_sections(page))
    plot(r, docs / "benchmarks.png")
    return md


def _progress(started: float) -> Any:
    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    return say
