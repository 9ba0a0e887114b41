"""The `fenced` commands for runs and processes: submit, status, runs, events, ledger, worker, flower,
bench, migrate, demo; and `main`, the script's entry point."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from fenced_cli.common import (
    CLI_DB_RETRY_S,
    RUN_STATES,
    JsonOpt,
    Kind,
    RunArg,
    _clock,
    _ms,
    _require_store,
    app,
    emit_json,
    fail,
    out,
    refuse_if_epochs_behind,
    refused,
    resolve_run,
    run_dict,
)


# -- commands ----------------------------------------------------------------------------------------
@app.command()
def submit(
    query: Annotated[str, typer.Argument(help="What the user asked; - reads it from standard input.")],
    user: Annotated[str, typer.Option("--user", "-u", help="The user the run is billed to.")] = "cli",
    kind: Annotated[Kind, typer.Option("--kind", "-k", help="normal or large (bigger hold, own queue).")] = Kind.normal,
    key: Annotated[str | None, typer.Option(
        "--key", help="Idempotency key: submitting again with the same user and key returns the same run.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a run (row + billing hold) and send its first wake-up; prints the run id."""
    from fenced_core.errors import AdmissionRefused, InvalidRequest

    if query == "-":
        query = sys.stdin.read()
    # Checked here too so that bad input never reaches (or opens) the stores.
    if not query.strip():
        fail("query must not be empty")
    if not user or len(user) > 128:
        fail("--user must be 1 to 128 characters")
    from fenced_core.settings import get_settings
    from tasks import submit_run

    if get_settings().db_url.startswith("sqlite"):
        from checkpoints.db import migrate

        migrate()  # the embedded store makes its own schema (idempotent); MySQL/MariaDB: `fenced migrate`
    refuse_if_epochs_behind()
    try:
        run_id = submit_run(user, query, kind.value, idempotency_key=key)
    except (InvalidRequest, AdmissionRefused) as exc:
        refused(exc)
    if as_json:
        emit_json({"run_id": run_id, "user_id": user, "kind": kind.value, "query": query})
    else:
        typer.echo(run_id)


@app.command()
def status(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """A run's state, owner, usage, charge, answer, cards, recent ledger and event count."""
    from tasks import service

    shown = service.status(resolve_run(run_id).run_id)
    run, holds, entries = shown.run, shown.run.holds, shown.ledger
    cards = service.cards_of(run)
    if as_json:
        emit_json({**run_dict(run), "holds": holds, "cards": [vars(c) for c in cards],
                   "ledger": [vars(e) for e in entries], "ledger_entries": shown.ledger_entries,
                   "events": shown.events})
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    charge = ", ".join(f"{h['state']}: {h['credits_charged'] if h['credits_charged'] is not None else '-'} of "
                       f"{h['credits_held']} held credits" for h in holds) or "no hold"
    rows = [
        ("run", run.run_id),
        ("user / kind", f"{run.user_id} / {run.kind}"),
        ("query", run.query),
        ("state", f"{run.state}   step {run.step} (phase {run.phase})   epoch {run.epoch}"),
        ("owner", run.owner or "-"),
        ("deliveries", f"{run.deliveries} of this step, {run.total_deliveries} in all"),
        ("usage", f"{run.prompt_tokens} prompt + {run.completion_tokens} completion tokens, "
                  f"{run.model_calls} model calls"),
        ("charge", charge),
        ("answer", run.answer or "-"),
        ("error", f"[{run.error_class}] {run.error}" if run.error else "-"),
        ("cards", ", ".join(f"{c.card_id} ({c.state}, ${c.total_cents / 100:.2f})" for c in cards) or "-"),
        ("created / finished", f"{_ms(run.created_at_ms)} / {_ms(run.finished_at_ms)}"),
        ("events", str(shown.events) if shown.events is not None else "unavailable (Redis unreachable)"),
    ]
    for key, value in rows:
        grid.add_row(key, value)
    out.print(grid, markup=False)
    if entries:
        out.print(f"\nledger (last {len(entries)} of {shown.ledger_entries}):", markup=False)
        out.print(_ledger_table(entries))


@app.command("runs")
def list_runs(
    state: Annotated[str | None, typer.Option("--state", "-s", help=f"One of {', '.join(RUN_STATES)}.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=10_000, help="At most this many.")] = 20,
    as_json: JsonOpt = False,
) -> None:
    """The most recent runs, newest first."""
    from tasks import service

    if state is not None and state not in RUN_STATES:
        fail(f"--state must be one of {', '.join(RUN_STATES)}, not {state!r}")
    _require_store()
    found = service.list_runs(state=state, limit=limit).runs
    if as_json:
        emit_json([run_dict(r) for r in found])
        return
    table = Table(box=None, header_style="bold")
    for col in ("run", "created", "user", "kind", "state", "step", "epoch", "owner"):
        table.add_column(col, no_wrap=True)
    table.add_column("query", overflow="ellipsis", max_width=40)
    for r in found:
        table.add_row(r.run_id, _ms(r.created_at_ms), r.user_id, r.kind, r.state, str(r.step), str(r.epoch),
                      r.owner or "-", r.query if len(r.query) <= 40 else r.query[:39] + "…")
    out.print(table if found else "no runs", markup=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context) -> None:
    """Exec `celery -A tasks worker` with the project defaults; extra arguments go to celery (last wins)."""
    from fenced_core.pools import default_concurrency
    from fenced_core.settings import get_settings
    from harness.workers import ALL_QUEUES, pool_option, split_pool

    pool, extra = split_pool(ctx.args)
    concurrency = default_concurrency(pool, get_settings().concurrency)
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "worker", *pool_option(pool or "threads"),
            *(["-c", str(concurrency)] if concurrency else []), "-Q", ",".join(ALL_QUEUES), "-l", "info", *extra]
    sys.stdout.flush()
    os.execv(sys.executable, argv)  # noqa: S606 - replace this process: signals reach celery directly


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def flower(
    ctx: typer.Context,
    address: Annotated[str, typer.Option(help="Interface to bind. Anything but localhost needs --basic-auth.")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535)] = 5555,
    basic_auth: Annotated[str | None, typer.Option("--basic-auth", help="user:password[,user2:password2]")] = None,
) -> None:
    """Exec Flower for the workers (`celery -A tasks flower`), safe by default: bound to localhost, where
    its HTTP API is open to local callers; on any other address only with --basic-auth. Extra arguments
    go to Flower. Flower shows deliveries (wake-up messages); the run's truth is `fenced status RUN`."""
    local = address in ("127.0.0.1", "localhost", "::1")
    if not local and not basic_auth:
        fail(f"--address {address} exposes Flower beyond this machine: give --basic-auth user:password")
    env = dict(os.environ)
    if local and not basic_auth:
        env["FLOWER_UNAUTHENTICATED_API"] = "true"  # Flower refuses its API without auth unless told
    argv = [sys.executable, "-m", "celery", "-A", "tasks", "flower", f"--address={address}", f"--port={port}",
            *([f"--basic-auth={basic_auth}"] if basic_auth else []), *ctx.args]
    sys.stdout.flush()
    os.execve(sys.executable, argv, env)  # noqa: S606 - replace this process: signals reach flower directly


@app.command()
def bench(
    only: Annotated[str | None, typer.Option(help="Comma-separated sections: throughput, submit, breakdown, "
                                                  "checkpoint, growth, takeover, longrun, inflight (default: all)."
                                             )] = None,
    smoke: Annotated[bool, typer.Option("--smoke", help="Tiny sizes: checks the harness, measures nothing.")]
    = False,
    runs: Annotated[int | None, typer.Option(min=1, help="Throughput burst size (default 400, smoke 20).")] = None,
    latency_runs: Annotated[int | None, typer.Option(min=1, help="Runs timed one at a time (default 100).")]
    = None,
    model_ms: Annotated[int, typer.Option(min=0, help="Second throughput pass: model latency per step (0 = skip).")]
    = 200,
    rounds: Annotated[int | None, typer.Option(min=1, help="Zero-latency throughput: rounds of every contender, "
                                                          "interleaved (default 3, smoke 2).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes per contender.")] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrency per worker.")] = 4,
    no_dbos: Annotated[bool, typer.Option("--no-dbos", help="Leave DBOS out (needs PostgreSQL and `dbos`).")]
    = False,
    results: Annotated[Path | None, typer.Option(help="Where the JSON goes (default bench/results).")] = None,
    docs: Annotated[Path | None, typer.Option(help="Where benchmarks.md and .png go (default docs).")] = None,
    render: Annotated[Path | None, typer.Option(help="Only redraw the report from saved results (a JSON file).")]
    = None,
    history: Annotated[list[Path] | None, typer.Option(help="Only print every target over saved full runs (JSON "
                                                            "files, the option once per file) as one table.")]
    = None,
    inflight_runs: Annotated[int | None, typer.Option(min=1, help="In flight: runs kept in flight (default 1000).")]
    = None,
    inflight_concurrency: Annotated[int | None, typer.Option(min=1, help="In flight: worker concurrency "
                                                                        "(default 500).")] = None,
    inflight_pool: Annotated[str, typer.Option(help="In flight: the workers' pool (gevent or threads).")]
    = "gevent",
) -> None:
    """The benchmarks: plain Celery vs fenced (MariaDB, SQLite) vs DBOS, step breakdown, takeover, growth.

    Progress goes to stderr, one line per stage; the figures to bench/results and docs/benchmarks.md.
    Needs the bench extra: pip install -e '.\\[bench]' (typer reads help as Rich markup)."""
    try:
        from bench.cli import main as bench_main
    except ImportError as exc:
        fail(f"the benchmark is not installed here ({exc}); from a checkout: pip install -e '.[bench]'")
    argv = [*(["--only", only] if only else []), *(["--smoke"] if smoke else []),
            *(["--runs", str(runs)] if runs else []), *(["--latency-runs", str(latency_runs)] if latency_runs else []),
            "--model-ms", str(model_ms), *(["--rounds", str(rounds)] if rounds else []),
            "--workers", str(workers), "--concurrency", str(concurrency),
            *(["--no-dbos"] if no_dbos else []), *(["--results", str(results)] if results else []),
            *(["--docs", str(docs)] if docs else []), *(["--render", str(render)] if render else []),
            *(["--history", *map(str, history)] if history else []),
            *(["--inflight-runs", str(inflight_runs)] if inflight_runs else []),
            *(["--inflight-concurrency", str(inflight_concurrency)] if inflight_concurrency else []),
            "--inflight-pool", inflight_pool]
    raise typer.Exit(bench_main(argv))


@app.command()
def migrate() -> None:
    """Bring the run store's schema to head."""
    from checkpoints.db import migrate as run_migrations
    from fenced_core.settings import get_settings
    from harness.embedded import mask_url

    run_migrations()
    typer.echo(f"schema at head: {mask_url(get_settings().db_url)}")


@app.command()
def events(
    run_id: RunArg,
    raw: Annotated[bool, typer.Option("--raw", help="Every entry as stored, superseded half-steps too.")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until the run ends.")]
    = False,
    as_json: JsonOpt = False,
) -> None:
    """A run's event stream: the live view (superseded half-steps dropped, deduplicated) by default."""
    from tasks import service

    run = resolve_run(run_id)
    if follow:
        _follow(run.run_id)
        return
    page = service.events(run.run_id, raw=raw)
    shown = page.events
    if as_json:
        emit_json([vars(e) for e in shown])
        return
    table = Table(box=None, header_style="bold")
    for col in ("at (UTC)", "epoch", "step", "type", "eid", "data"):
        table.add_column(col, no_wrap=True)
    for e in shown:
        at = _clock(int(e.stream_id.split("-")[0])) if e.stream_id else "-"
        data = json.dumps(e.data, separators=(",", ":"), sort_keys=True)
        table.add_row(at, str(e.epoch), str(e.step), e.type, e.eid, data if len(data) <= 70 else data[:69] + "…")
    out.print(table, markup=False)
    if not raw and len(shown) != page.stored:
        out.print(f"({page.stored - len(shown)} superseded or duplicate entries hidden; --raw shows them)",
                  markup=False)


def _follow(run_id: str) -> None:
    """Print each event once as it is appended (merged by id, as the live view), until the run's final
    event; a run that ended before we looked prints what it has and stops."""
    import time

    from tasks import service

    seen: set[str] = set()
    after: str | None = None
    quiet_since = time.monotonic()
    while True:
        fresh = service.events(run_id, after=after, raw=True).events
        for e in fresh:
            after = e.stream_id
            if e.eid in seen:
                continue
            seen.add(e.eid)
            data = json.dumps(e.data, separators=(",", ":"), sort_keys=True)
            at = _clock(int(e.stream_id.split("-")[0]))
            typer.echo(f"{at} UTC  epoch {e.epoch}  step {e.step}  {e.type}  {e.eid}  {data}")
            if e.eid in service.FINAL_EVENT_IDS:
                return
        if fresh:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 2 and service.get_run(run_id).ended:
            return  # ended, and its final event is not in the stream (Redis lost it)
        time.sleep(0.2)


@app.command()
def ledger(run_id: RunArg, as_json: JsonOpt = False) -> None:
    """Every decision recorded for a run, with its reason, oldest first."""
    from tasks import service

    entries = service.ledger_of(resolve_run(run_id).run_id)
    if as_json:
        emit_json([vars(e) for e in entries])
        return
    out.print(_ledger_table(entries))


def _ledger_table(entries: list[Any]) -> Table:
    table = Table(box=None, header_style="bold")
    for col in ("at (UTC)", "epoch", "kind", "actor"):
        table.add_column(col, no_wrap=True)
    table.add_column("reason", overflow="fold")
    names = _actor_names(entries)
    for e in entries:
        table.add_row(_clock(e.at_ms), str(e.epoch), e.kind, names.get(e.actor, e.actor), e.reason)
    return table


def _actor_names(entries: list[Any]) -> dict[str, str]:
    """Lease tokens (`host:pid:nonce/delivery`) as people know workers: the Celery node and its pid, as
    each claim recorded them; a token without a claim here shows its host and pid."""
    names: dict[str, str] = {}
    for e in entries:
        parts = e.actor.split("/", 1)[0].split(":")
        if len(parts) != 3 or not parts[1].isdigit():
            continue  # a person, the CLI, the API: shown as they are
        node = e.detail.get("node") if e.kind in ("claimed", "takeover") else None
        if node:
            names[e.actor] = f"{node} pid {parts[1]}"
        else:
            names.setdefault(e.actor, f"pid {parts[1]} on {parts[0]}")
    return names


@app.command()
def demo(
    runs: Annotated[int, typer.Option("--runs", min=1, max=200, help="How many runs to submit.")] = 8,
    workers: Annotated[int, typer.Option("--workers", min=2, max=8, help="Worker processes (one is killed).")] = 2,
    as_json: JsonOpt = False,
) -> None:
    """Submit a batch, SIGKILL a worker mid-step, restart it, and check every run finished exactly once.

    Uses FENCED_REDIS_URL / FENCED_DB_URL when set; otherwise a private redis-server and a fresh SQLite
    file under ./.fenced/. Exit code 0 only if every verdict holds."""
    from harness.demo import render, run_demo

    # A SIGTERM'd demo cleans up like an interrupted one: no stray workers or redis-server left behind.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        result = run_demo(runs, workers)
    except KeyboardInterrupt:
        typer.echo("interrupted: workers and embedded Redis stopped", err=True)
        raise typer.Exit(130) from None
    if as_json:
        emit_json(result.to_dict())
    else:
        render(result)
    raise typer.Exit(0 if result.ok else 1)


def main() -> None:
    """Entry point of the `fenced` script: store outages become one clear line, not a traceback."""
    import kombu.exceptions
    import redis
    import sqlalchemy as sa

    from checkpoints.db import is_missing_schema, set_retry_window
    from fenced_core.settings import get_settings, safe_url

    if "FENCED_DB_RETRY_S" not in os.environ:
        # A person at a prompt: a database outage is reported after a few seconds, not a worker's minute.
        # Set in this process only: the workers this command starts keep their own window.
        set_retry_window(CLI_DB_RETRY_S)
    try:
        app()
    except redis.ConnectionError as exc:
        reason = str(exc).removeprefix("Redis unavailable: ")  # fencing's own wording of a driver error
        typer.echo(f"error: Redis unreachable at {safe_url(get_settings().redis_url)}: {reason}", err=True)
        sys.exit(1)
    except kombu.exceptions.OperationalError as exc:
        typer.echo(f"error: the broker is unreachable at {safe_url(get_settings().effective_broker_url)}: {exc}",
                   err=True)
        sys.exit(1)
    except sa.exc.DBAPIError as exc:
        if is_missing_schema(exc):
            typer.echo(f"error: the run store {safe_url(get_settings().db_url)} has no schema yet: "
                       "run `fenced migrate` (workers also create it when they start)", err=True)
            sys.exit(2)
        from checkpoints.db import is_config_error, refused_message, retried_s

        if is_config_error(exc):
            typer.echo(f"error: {refused_message(exc)}", err=True)
            sys.exit(2)
        # The time it really took: each attempt may itself wait (SQLite's busy timeout on a locked file), so
        # the retry window alone would understate it.
        took = retried_s(exc)
        if took is None:  # not a transient error: it was never retried
            typer.echo(f"error: {refused_message(exc, 'failed')}", err=True)
        else:
            typer.echo(f"error: run store unreachable after {took:.0f} s of retries: {exc.orig or exc}", err=True)
        sys.exit(1)

