"""`python -m bench.api_live`: one API process, N WebSocket clients watching runs real workers execute.

Measures event appended (its Redis stream id's millisecond time) -> received by a client, p50/p95/p99,
and the API process's resident memory, idle and with every client connected. Every client's folded
stream is checked against the run's live view at the end (a mismatch or a drop is reported, not hidden).
Stores: a private redis-server and the MariaDB database `fenced_bench_live` (dropped and created).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MYSQL_SERVER = os.environ.get("FENCED_BENCH_MYSQL", "mysql+pymysql://root@127.0.0.1:3306")
DB_NAME = "fenced_bench_live"
TARGET_P95_MS = 100.0
RESULTS = ROOT / "bench" / "results"
MARK_START, MARK_END = "<!-- api-live -->", "<!-- /api-live -->"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.api_live", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=500, help="WebSocket clients (default 500)")
    p.add_argument("--runs", default="250,50", help="runs the clients watch, spread evenly; comma-separated for "
                   "several passes (default 250 = 2 clients per run, then 50 = 10 per run, a faster burst)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--step-ms", type=int, default=200, help="stub model latency per step (default 200)")
    p.add_argument("--smoke", action="store_true", help="20 clients on 10 runs: checks the harness")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the JSON goes")
    p.add_argument("--docs", type=Path, help="also write the section into DOCS/benchmarks.md")
    args = p.parse_args(argv)
    args.passes = [10] if args.smoke else [int(n) for n in str(args.runs).split(",") if n]
    if args.smoke:
        args.clients = 20
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    import psutil

    return round(psutil.Process(pid).memory_info().rss / 2**20, 1)


class ApiProcess:
    """`uvicorn fenced_api.app:create_app --factory`, one process (as `fenced api` runs it)."""

    def __init__(self, log_path: Path) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "fenced_api.app:create_app", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=os.environ.copy(), stdout=log_path.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.1)
        raise RuntimeError(f"the API did not start: {log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


class Client:
    """One watcher: its messages' latencies, its folded view and how it ended."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.latencies_ms: list[float] = []
        self.view: list[tuple[str, str]] = []
        self.code: int | None = None
        self.problems: list[str] = []

    def apply(self, msg: dict[str, Any], now_ms: float) -> None:
        if msg["type"] == "snapshot":
            self.view = [(e["id"], e["eid"]) for e in msg["events"]]
            return
        folded = msg.get("superseded", []) if msg["type"] == "event" else msg.get("eids", [])
        self.view = [(i, e) for i, e in self.view if e not in folded]
        if msg["type"] == "event":
            e = msg["event"]
            self.latencies_ms.append(now_ms - int(e["id"].split("-")[0]))
            if any(eid == e["eid"] for _i, eid in self.view):
                self.problems.append(f"{e['eid']} twice")
            self.view.append((e["id"], e["eid"]))


async def _watch(url: str, client: Client, connected: asyncio.Semaphore, ready: list[int]) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with connected:
        ws = await connect(url, ping_interval=None, open_timeout=60, max_size=None)
    ready.append(1)

    async def pinger() -> None:
        while True:
            await asyncio.sleep(30)
            await ws.send('{"type":"ping"}')

    pings = asyncio.ensure_future(pinger())
    try:
        while True:
            text = await ws.recv()
            client.apply(json.loads(text), time.time() * 1000)
    except ConnectionClosed as exc:
        client.code = exc.rcvd.code if exc.rcvd else None
    finally:
        pings.cancel()


def measure(args: argparse.Namespace, n_runs: int, log_dir: Path) -> dict[str, Any]:
    """Submit `n_runs` runs, connect every client, start the workers, wait for every stream to end."""
    from bench.stats import summary
    from checkpoints import api_keys
    from fencing import events
    from harness.workers import WorkerProcess
    from tasks import submit_run

    key = api_keys.issue(f"bench{n_runs}")
    api = ApiProcess(log_dir / f"api{n_runs}.log")
    workers: list[WorkerProcess] = []
    try:
        time.sleep(1)
        rss_idle = _rss_mb(api.proc.pid)
        run_ids = [submit_run(f"bench{n_runs}", f"buy item {i}") for i in range(n_runs)]
        clients = [Client(run_ids[i % len(run_ids)]) for i in range(args.clients)]
        peak = [rss_idle]

        async def main() -> dict[str, Any]:
            ready: list[int] = []
            gate = asyncio.Semaphore(50)
            url = f"ws://127.0.0.1:{api.port}/api/runs/{{}}/events?key={key}"
            started = time.monotonic()
            tasks = [asyncio.ensure_future(_watch(url.format(c.run_id), c, gate, ready)) for c in clients]
            while len(ready) < len(clients):
                await asyncio.sleep(0.05)
                if any(t.done() and t.exception() for t in tasks):
                    raise next(t.exception() for t in tasks if t.done() and t.exception())  # type: ignore[misc]
            connect_s = time.monotonic() - started
            rss_connected = _rss_mb(api.proc.pid)
            env = {**os.environ, "FENCED_STUB_STEP_MS": str(args.step_ms)}
            for i in range(args.workers):
                w = WorkerProcess(f"live{n_runs}-{i}", env=env, log_path=log_dir / f"worker{n_runs}-{i}.log",
                                  concurrency=args.concurrency)
                workers.append(await asyncio.to_thread(w.start))
            run_started = time.monotonic()
            pending = set(tasks)
            while pending:
                _done, pending = await asyncio.wait(pending, timeout=0.5)
                peak.append(_rss_mb(api.proc.pid))
                if time.monotonic() - run_started > 600:
                    raise RuntimeError(f"{len(pending)} streams still open after 600 s")
            return {"connect_s": round(connect_s, 2), "rss_connected_mb": rss_connected,
                    "watch_s": round(time.monotonic() - run_started, 2)}

        timing = asyncio.run(main())
    finally:
        for w in workers:
            w.stop()
        api.stop()
    views = {r: [(e.stream_id, e.eid) for e in events.live_view(events.read(r))] for r in set(run_ids)}
    mismatched = sum(c.view != views[c.run_id] or bool(c.problems) for c in clients)
    latencies = [lat for c in clients for lat in c.latencies_ms]
    codes: dict[str, int] = {}
    for c in clients:
        codes[str(c.code)] = codes.get(str(c.code), 0) + 1
    return {"clients": args.clients, "runs": n_runs, "events_delivered": len(latencies),
            "latency_ms": summary(latencies), "rss_idle_mb": rss_idle, "rss_peak_mb": max(peak), **timing,
            "close_codes": codes, "views_mismatched": mismatched}


def markdown(r: dict[str, Any]) -> str:
    """The section for docs/benchmarks.md (between the api-live markers)."""
    rows = []
    for p in r["passes"]:
        lat = p["latency_ms"]
        ok = lat["p95"] is not None and lat["p95"] <= r["target_p95_ms"]
        rows.append(
            f"| {p['clients']} | {p['runs']} ({p['clients'] // p['runs']} each) | {p['events_delivered']} in "
            f"{p['watch_s']} s | {lat['p50']} | {lat['p95']} | {lat['p99']} | {lat['max']} | "
            f"{'met' if ok else 'MISSED'} | {p['rss_idle_mb']} -> {p['rss_connected_mb']} -> {p['rss_peak_mb']} MB | "
            f"{p['connect_s']} s | {p['close_codes']} | {p['views_mismatched']} |")
    return "\n".join([
        MARK_START, "## Live events (WebSocket fan-out)", "",
        f"{r['date']}, `{r['command']}`{' (smoke: sizes too small to mean anything)' if r['smoke'] else ''}. "
        f"One API process (uvicorn, one event loop) on this {r['machine_cores']}-core machine; the WebSocket "
        f"clients run in one asyncio process on the same machine and are all connected before "
        f"{r['workers']} workers x {r['concurrency']} threads start executing the runs (stub model "
        f"{r['step_ms']} ms per step); MariaDB and Redis share the same 2 cores. Latency: an event's Redis "
        f"stream id (its append time, ms) to its arrival at a client; target p95 <= {r['target_p95_ms']:g} ms. "
        "RSS: the API process idle -> with every client connected -> at its peak.", "",
        "| clients | runs watched | events delivered | p50 ms | p95 ms | p99 ms | max ms | p95 target | API RSS "
        "| connect all | close codes | views != live view |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, "", MARK_END])


def write_docs(md: str, docs: Path) -> None:
    """Put `md` into docs/benchmarks.md: replace the marked section, or append it."""
    path = docs / "benchmarks.md"
    text = path.read_text() if path.exists() else ""
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        text = head + md + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + md + "\n"
    path.write_text(text)


def saved_section(results: Path = RESULTS) -> str:
    """The last full run's section (for bench.cli, which rewrites benchmarks.md), or ''."""
    path = results / "api-live-latest.json"
    return "\n" + markdown(json.loads(path.read_text())) + "\n" if path.exists() else ""


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import sqlalchemy as sa

    from bench.stores import using
    from harness.demo import quiet_core_logs
    from harness.embedded import EmbeddedRedis

    base = Path(tempfile.mkdtemp(prefix="fenced-bench-live-"))
    engine = sa.create_engine(MYSQL_SERVER + "/")
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {DB_NAME}"))
        conn.execute(sa.text(f"CREATE DATABASE {DB_NAME}"))
    engine.dispose()
    redis = EmbeddedRedis(base / "redis")
    redis_url = redis.start().url
    limits = {"FENCED_MAX_RUNS_PER_USER": "1000000", "FENCED_MAX_QUEUED_RUNS": "1000000",
              "FENCED_DEFAULT_BALANCE_CREDITS": "1000000000", "FENCED_STUB_TOOL_MS": "0",
              "FENCED_IMPORTS": "examples.shopping"}
    r: dict[str, Any] = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "smoke": args.smoke, "machine_cores": os.cpu_count(),
        "command": " ".join(["python -m bench.api_live", *(argv if argv is not None else sys.argv[1:])]),
        "workers": args.workers, "concurrency": args.concurrency, "step_ms": args.step_ms,
        "target_p95_ms": TARGET_P95_MS, "passes": []}
    try:
        with using(redis_url, f"{MYSQL_SERVER}/{DB_NAME}", **limits):
            quiet_core_logs()
            for n_runs in args.passes:
                print(f"api-live: {args.clients} clients on {n_runs} runs; logs in {base}", file=sys.stderr)
                r["passes"].append(measure(args, n_runs, base))
    finally:
        redis.stop()
    args.results.mkdir(parents=True, exist_ok=True)
    text = json.dumps(r, indent=1)
    (args.results / ("api-live-smoke.json" if args.smoke else f"api-live-{r['date'][:10]}.json")).write_text(text)
    if not args.smoke:
        (args.results / "api-live-latest.json").write_text(text)
    md = markdown(r)
    if args.docs:
        write_docs(md, args.docs)
    print(md)
    healthy = all(p["views_mismatched"] == 0 and p["close_codes"] == {"1000": p["clients"]} for p in r["passes"])
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
