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
    from fencing import registry
    from routing import policy

    s = get_settings()
    now = registry.now_ms()
    records = {w.name: w for w in registry.all_workers()}
    cands = policy.candidates(now)
    if as_json:
        emit_json({"policy": s.routing, "threshold": s.routing_threshold, "at_ms": now,
                   "workers": [{**records[c.worker].as_dict(), "routing": c.as_dict()} for c in cands]})
        return
    if not cands:
        out.print(f"no workers registered (policy {s.routing})")
        return
    table = Table(title=f"workers (policy {s.routing}, threshold {s.routing_threshold:g})")
    for col in ("worker", "status", "score", "fresh", "avg step", "running", "queued", "success", "qualifies",
                "host:pid", "pool", "labels"):
        table.add_column(col)
    for c in cands:
        w = records[c.worker]
        avg = f"{c.avg_step_ms / 1000:.2f} s" if c.avg_step_ms is not None else "-"
        labels = ",".join(w.as_dict().get("labels", []))
        table.add_row(c.worker, c.status, f"{c.score:.2f}", f"{c.freshness:.2f} ({c.age_ms / 1000:.1f} s)", avg,
                      str(c.running), str(c.queued), f"{c.success:.0%}", "yes" if c.qualified else f"no: {c.why_not}",
                      f"{w.fields.get('host', '?')}:{w.fields.get('pid', '?')}", w.fields.get("pool", "-"), labels)
    out.print(table)
