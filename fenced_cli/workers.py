"""`fenced workers [--json]`: the worker registry with each worker's live routing score and its factors."""

from __future__ import annotations

from rich.table import Table

from fenced_cli.common import JsonOpt, app, emit_json, out


@app.command()
def workers(as_json: JsonOpt = False) -> None:
    """Every registered worker (online, draining, offline) with its routing score now: freshness of its
    heartbeat, average step time, runs in flight (running + routed and not yet taken), success rate;
    whether it qualifies for new runs under FENCED_ROUTING=reach, and why not."""
    from fenced_core.settings import get_settings
    from routing import view

    s = get_settings()
    if as_json:
        emit_json(view.snapshot())
        return
    workers_now = view.scored()
    if not workers_now:
        out.print(f"no workers registered (policy {s.routing})")
        return
    table = Table(title=f"workers (policy {s.routing}, threshold {s.routing_threshold:g})")
    for col in ("worker", "status", "score", "fresh", "avg step", "running", "queued", "success", "qualifies",
                "host:pid", "pool", "labels"):
        table.add_column(col)
    for sw in workers_now:
        c, w = sw.routing, sw.record
        avg = f"{c.avg_step_ms / 1000:.2f} s" if c.avg_step_ms is not None else "-"
        labels = ",".join(w.as_dict().get("labels", []))
        table.add_row(c.worker, c.status, f"{c.score:.2f}", f"{c.freshness:.2f} ({c.age_ms / 1000:.1f} s)", avg,
                      str(c.running), str(c.queued), f"{c.success:.0%}", "yes" if c.qualified else f"no: {c.why_not}",
                      f"{w.fields.get('host', '?')}:{w.fields.get('pid', '?')}", w.fields.get("pool", "-"), labels)
    out.print(table)
