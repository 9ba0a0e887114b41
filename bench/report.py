"""The benchmark report: a markdown page and a PNG (throughput bars, per-step breakdown) from results."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}"


def targets(r: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for every target of the benchmark issue that this run measured."""
    out: list[tuple[str, str, bool | None]] = []
    tp = {c["name"]: c for c in r.get("throughput", [])}
    plain = tp.get("plain Celery")
    for store in ("mariadb", "sqlite"):
        fenced = tp.get(f"fenced on {store}")
        if plain and fenced:
            ratio, spread = _by_round(fenced, plain, _throughput_ratio, ".2f")
            out.append((f"fenced ({store}) throughput >= 0.7 x plain Celery", f"{ratio:.2f} x{spread}", ratio >= 0.7))
            over, spread = _by_round(fenced, plain, _step_overhead, ".1f")
            out.append((f"fenced ({store}) step overhead <= 2 ms p50 over plain Celery", f"{over:.1f} ms{spread}",
                        over <= 2))
        dbos = tp.get("DBOS on PostgreSQL")
        if fenced and dbos:
            ratio, spread = _by_round(fenced, dbos, _throughput_ratio, ".2f")
            out.append((f"fenced ({store}) throughput >= DBOS", f"{ratio:.2f} x DBOS{spread}", ratio >= 1))
    for store, b in r.get("breakdown", {}).items():
        if "cpu_ms_per_step" in b:
            trips = (f" ({b['sql_round_trips_per_step']:g} SQL + {b['redis_round_trips_per_step']:g} Redis round "
                     "trips per step)") if "sql_round_trips_per_step" in b else ""
            spread = _passes(b)
            out.append((f"fenced ({store}) client CPU per step <= 1.5 ms (in-process deliveries)",
                        f"{b['cpu_ms_per_step']:.2f} ms{spread}{trips}", b["cpu_ms_per_step"] <= 1.5))
    sub = r.get("submit")
    if sub:
        out.append((f"one client submits >= {sub['target_per_s']:g} runs/s on MariaDB (submit_run or submit_many)",
                    f"{sub['best_fenced_per_s']:,.0f}/s ({_best_phase(sub)})", sub["met"]))
    tm = {c["name"]: c for c in r.get("throughput_model", [])}
    if tm.get("plain Celery") and tm.get("fenced on mariadb"):
        ratio = tm["fenced on mariadb"]["runs_per_s"] / tm["plain Celery"]["runs_per_s"]
        out.append((f"fenced (mariadb) throughput >= 0.7 x plain Celery, model {r['params'].get('model_ms')} ms/step",
                    f"{ratio:.2f} x", ratio >= 0.7))
    for t in r.get("takeover", []):
        if t["p95"] is not None:
            # The chaos kill scenario's own bound (chaos.scenarios.bounds): lease only, two leases + a reaper
            # tick + 2 s (a first rescue's wake-up lost with the killed worker is sent again a lease later);
            # fast takeover, 3 s.
            mode = "fast takeover" if t["fast_takeover"] else "lease only"
            out.append((f"takeover p95 <= {t['target_p95_ms'] / 1000:g} s, the chaos bound "
                        f"({t['lease_ms'] / 1000:g} s lease, {mode})",
                        f"{t['p95'] / 1000:.2f} s", t["p95"] <= t["target_p95_ms"]))
    lr = r.get("longrun")
    if lr:
        ratio = lr["ratio_last_to_first"]
        out.append((f"{lr['steps']}-step runs: step 50 writes and costs <= {lr['target_ratio']} x step 5 (flat)",
                    f"bytes written {ratio['written_bytes']} x, CPU {ratio['cpu_ms']} x", lr["met"]))
    from bench.inflight import targets as inflight_targets

    # Judged again from the measurements (not the rows saved with them), so a re-render applies today's rules.
    for t in (inflight_targets(r["inflight"]) if r.get("inflight", {}).get("window") else []):
        out.append((f"in flight ({r['inflight']['params']['runs']:,} runs, {r['inflight']['params']['pool']}): "
                    f"{t['target']}", t["measured"], t["met"]))
    rows = r.get("growth", {}).get("rows", [])
    if len(rows) >= 2:
        first, last = rows[0]["reaper, none expired"], rows[-1]["reaper, none expired"]
        flat = last["redis_cmds"] == first["redis_cmds"] and last["round_trips"] == first["round_trips"]
        out.append((f"detection cost flat in runs in flight ({rows[0]['in_flight']:,} -> {rows[-1]['in_flight']:,})",
                    f"reaper tick {first['ms']} -> {last['ms']} ms, {last['redis_cmds']:g} commands", flat))
    return out


def markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [f"# Benchmarks ({r['date']})", "",
             f"`{r['command']}` on {m['cpu']}; {m['os']}; Python {m['python']}; {m['packages']}; "
             f"{m['redis-server']}; {m['mariadb']}; {m['postgresql']}; SQLite {m['sqlite']}. "
             f"Took {r['elapsed_s']:.0f} s.", ""]
    if r.get("smoke"):
        lines += ["**Smoke run**: tiny sizes, checks the harness only; these figures are not measurements.", ""]
    found = targets(r)
    if found:
        lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {t} | {v} | {'yes' if ok else 'NO'} |" for t, v, ok in found]
        lines.append("")
    if r.get("throughput"):
        p = r["params"]
        lines += ["## Throughput and latency", "",
                  f"{p['runs']} runs of 4 zero-latency stub steps submitted as fast as one client can, "
                  f"{p['workers']} worker processes x concurrency {p['concurrency']} for every contender, one "
                  f"private Redis. Latency: {p['latency_runs']} runs one at a time, submit to done as a client "
                  "sees it; per step = run / 4.", "",
                  "| contender | runs/s | steps/s | submit s | run p50 ms | run p99 ms | step p50 ms | "
                  "step p99 ms | done |", "|---|---|---|---|---|---|---|---|---|"]
        for c in r["throughput"]:
            lat, step = c["latency_ms"], c["step_latency_ms"]
            lines.append(f"| {c['name']} | {_f(c['runs_per_s'])} | {_f(c['steps_per_s'])} | {c['submit_s']:.2f} | "
                         f"{_f(lat['p50'])} | {_f(lat['p99'])} | {_f(step['p50'])} | {_f(step['p99'])} | "
                         f"{c['done']}/{c['runs']} |")
        rounds = [c for c in r["throughput"] if "passes" in c]
        if rounds:
            lines += ["", f"Each contender ran in {len(rounds[0]['passes'])} rounds, one after another (every "
                      "contender once a round); a row is its median round by runs/s, and the targets compare the "
                      "contenders round by round (the median of the rounds' ratios). runs/s and step p50 ms, round "
                      "by round:", ""]
            lines += [f"- {c['name']}: " + "; ".join(
                f"{x['runs_per_s']:g} runs/s, {_f(x['step_latency_ms']['p50'], 2)} ms" for x in c["passes"])
                for c in rounds]
        notes = list(dict.fromkeys(f"{c['name']}: {n}" for c in r["throughput"] for n in c["notes"]))
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    if r.get("throughput_model"):
        tm = r["throughput_model"]
        plain = tm[0]["runs_per_s"] or 1.0
        lines += [f"### With a model that takes {r['params'].get('model_ms', '?')} ms per step", "",
                  f"The same, {tm[0]['runs']} runs, the stub model sleeping like a provider call: the machinery's cost "
                  "next to the work it protects.", "",
                  "| contender | runs/s | steps/s | x plain Celery | done |", "|---|---|---|---|---|"]
        lines += [f"| {c['name']} | {_f(c['runs_per_s'])} | {_f(c['steps_per_s'])} | {c['runs_per_s'] / plain:.2f} | "
                  f"{c['done']}/{c['runs']} |" for c in tm]
        lines.append("")
    if r.get("submit"):
        lines += submit_section(r["submit"])
    if r.get("breakdown"):
        lines += ["## Where a fenced step's time goes", "",
                  "Deliveries run in the benchmark process with a timer on every round trip (ms per step, "
                  "p50 / p99; a piece that only some steps have, like the terminal write, has p50 0).", ""]
        stores = list(r["breakdown"])
        lines += ["| piece | " + " | ".join(stores) + " |", "|---|" + "---|" * len(stores)]
        pieces = list(next(iter(r["breakdown"].values()))["pieces"])
        for piece in ["total", *pieces]:
            cells = []
            for s in stores:
                b = r["breakdown"][s]
                v = b["total"] if piece == "total" else b["pieces"][piece]
                cells.append(f"{_f(v['p50'], 2)} / {_f(v['p99'], 2)}")
            lines.append(f"| {'**whole step**' if piece == 'total' else piece} | " + " | ".join(cells) + " |")
        plain = next(iter(r["breakdown"].values()))["plain_step"]
        lines += [f"| *plain Celery step, same work + send* | {_f(plain['p50'], 2)} / {_f(plain['p99'], 2)} |"
                  + " |" * (len(stores) - 1), ""]
        if "cpu_ms_per_step" in plain:
            bd = r["breakdown"]
            cpu = ", ".join(f"{s}: {bd[s]['cpu_ms_per_step']} ms CPU{_passes(bd[s])} in {bd[s]['wall_ms_per_step']} ms"
                            for s in stores)
            lines += [f"CPU of the delivering process per step, untimed, as a worker runs them (the median of "
                      f"the passes, all passes in brackets): {cpu}; plain Celery: {plain['cpu_ms_per_step']} ms"
                      f"{_passes(plain)}. Top functions by own time under cProfile: "
                      "`bench/results/profile-<store>.txt`.", ""]
            if all("one_step_per_delivery" in bd[s] for s in stores):
                one = ", ".join(f"{s}: {bd[s]['one_step_per_delivery']['cpu_ms_per_step']} ms CPU in "
                                f"{bd[s]['one_step_per_delivery']['wall_ms_per_step']} ms" for s in stores)
                n = bd[stores[0]].get("inline_steps")
                lines += [f"As a worker runs them means up to {n} steps inline after a delivery's own "
                          f"(`FENCED_INLINE_STEPS={n}`); with one delivery per step (`FENCED_INLINE_STEPS=0`, "
                          f"every step handed over through the broker): {one}.", ""]
            if all("sql_round_trips_per_step" in bd[s] for s in stores):
                trips = ", ".join(f"{s}: {bd[s]['sql_round_trips_per_step']:g} SQL and "
                                  f"{bd[s]['redis_round_trips_per_step']:g} Redis" for s in stores)
                lines += [f"Round trips per step, counted over {bd[stores[0]]['counted_steps']} steps (queries sent, "
                          f"a multi-statement query once; Redis commands or pipelines, the continuation's send "
                          f"and the benchmark's own queue cleanup included): {trips}.", ""]
    if r.get("takeover"):
        lines += ["## Takeover latency", "", "SIGKILL of a whole worker to `task_resumed` of each run it held "
                  "(chaos kill scenario, 2 workers, 6 runs per round, kills at four moments).", "",
                  "| lease | fast takeover | kills judged | takeovers | p50 s | p95 s | max s | runs passed |",
                  "|---|---|---|---|---|---|---|---|"]
        for t in r["takeover"]:
            s = [_f(t[k] / 1000, 2) if t[k] is not None else "n/a" for k in ("p50", "p95", "max")]
            lines.append(f"| {t['lease_ms'] / 1000:g} s | {'on' if t['fast_takeover'] else 'off'} | {t['rounds']} | "
                         f"{t['n']} | {s[0]} | {s[1]} | {s[2]} | {t['passed']}/{t['runs']} |")
        lines.append("")
    if r.get("growth"):
        g = r["growth"]
        d = g["defaults"]
        lines += ["## Detection cost against runs in flight", "",
                  f"Median of {g['ticks']} ticks; in-flight runs simulated as live leases + `running` rows. "
                  f"Defaults: reaper every {d['reaper_tick_ms']} ms in each worker, liveness check every "
                  f"{d['liveness_tick_ms']} ms and sweeper every {d['sweeper_interval_ms']} ms in one worker "
                  "of the cluster.", "",
                  "| in flight | tick | ms | Redis commands | round trips | SQL statements | runs rescued |",
                  "|---|---|---|---|---|---|---|"]
        for row in g["rows"]:
            for tick, c in row.items():
                if tick == "in_flight":
                    continue
                lines.append(f"| {row['in_flight']:,} | {tick} | {c['ms']} | {c['redis_cmds']:g} | "
                             f"{c['round_trips']:g} | {c['sql']:g} | {c['rescued']:g} |")
        lines += ["", f"Lease renewal, one watchdog heartbeat per process (every {d['heartbeat_ms']} ms):", "",
                  "| leases held by the process | ms | Redis commands | round trips |", "|---|---|---|---|"]
        lines += [f"| {x['leases']:,} | {x['ms']} | {x['redis_cmds']:g} | {x['round_trips']:g} |" for x in g["renewal"]]
        lines.append("")
    if r.get("checkpoint"):
        c = r["checkpoint"]
        lines += ["## Checkpoint size", "", f"The demo agent, query {c['query']!r}: every checkpoint row.", "",
                  "| step | phase | stored bytes (zlib) | JSON bytes |", "|---|---|---|---|"]
        lines += [f"| {x['step']} | {x['phase']} | {x['stored_bytes']:,} | {x['json_bytes']:,} |" for x in c["rows"]]
        lines.append("")
    if r.get("longrun"):
        lines += longrun_section(r["longrun"])
    if r.get("inflight"):
        lines += inflight_section(r["inflight"])
    return "\n".join(lines)


def submit_section(sub: dict[str, Any]) -> list[str]:
    """One client's submission rate each way (bench.submit.run): no workers, so every wake-up it sent is
    still queued when a phase ends, which the phase checks (one message, and for fenced one run row, a submit)."""
    plain = next((x for x in sub["phases"] if x["run_rows"] is None), None)
    lines = ["## Submission from one client", "",
             f"{sub['runs']:,} submits each way from one process ({sub['users']} users), admission, the run row "
             "with its billing hold and the first wake-up per run; no workers run, so each phase ends with one "
             "message queued (and for fenced one row) per submit, checked.", "",
             "| path | submits/s | client CPU ms/submit | x plain Celery |", "|---|---|---|---|"]
    for x in sub["phases"]:
        ratio = f"{x['per_s'] / plain['per_s']:.2f}" if plain and plain["per_s"] else "n/a"
        lines.append(f"| {x['name']} | {x['per_s']:,.1f} | {x['client_cpu_ms_per_submit']:.3f} | {ratio} |")
    lines.append("")
    return lines


def _best_phase(sub: dict[str, Any]) -> str:
    """The name of the fenced phase that submitted fastest (the figure the target is judged on)."""
    fenced = [x for x in sub["phases"] if x["run_rows"] is not None]
    return max(fenced, key=lambda x: x["per_s"])["name"] if fenced else "n/a"


def longrun_section(lr: dict[str, Any]) -> list[str]:
    lines = ["## Long runs: checkpoint growth", "",
             f"{lr['runs']} runs of {lr['steps']} steps of the `bench_steps` agent (one 0 ms model call and one "
             "read-only tool returning ~0.4 KB per step), every delivery driven in the benchmark process. "
             "Each figure: median over the runs and the step either side. Bytes written: every blob the step "
             "sent to the database, counted at the driver (checkpoints A and B; a history segment every 16 "
             "steps).", "",
             "| step | wall ms | CPU ms | checkpoint bytes written | checkpoint B stored (zlib) | its JSON |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {x['step']} | {x['wall_ms']:.2f} | {x['cpu_ms']:.2f} | {x['written_bytes']:,.0f} | "
              f"{x['checkpoint_b_stored_bytes']:,.0f} | {x['checkpoint_b_json_bytes']:,.0f} |" for x in lr["at"]]
    ratio = lr["ratio_last_to_first"]
    lines += ["", f"Step 50 / step 5: bytes written {ratio['written_bytes']} x, CPU {ratio['cpu_ms']} x, wall "
              f"{ratio['wall_ms']} x. Every run's history read back: {sorted(set(lr['history_entries']))} entries.", ""]
    return lines


def inflight_section(f: dict[str, Any]) -> list[str]:
    p, w, m = f["params"], f["window"], f["memory"]
    lines = ["## In flight: slow-model runs held at once", "",
             f"{p['runs']:,} runs of {p['steps']} steps (`bench_steps`: a model call that sleeps {p['model_ms']} ms, "
             f"one read-only tool), all submitted at once, on {p['workers']} worker processes x `--pool {p['pool']}` "
             f"concurrency {p['concurrency']}{' ' + str(p['env']) if p.get('env') else ''}. Window: from one model "
             f"call after the last run's first step started, {w['seconds']} s. Load average (the machine, "
             f"all users) {f.get('load_in_window')}.", "",
             "| figure | value |", "|---|---|",
             f"| runs in flight in the window | {w['runs_in_flight']:,} |",
             f"| steps/s (ideal: in flight / model time) | {w['steps_per_s']} ({w['ideal_steps_per_s']}) = "
             f"{w['ratio_to_ideal']} |",
             f"| step end (checkpoint B) -> next step's first event, p50 / p95 / max ms | {w['gap_ms']['p50']} / "
             f"{w['gap_ms']['p95']} / {w['gap_ms']['max']} (n {w['gap_ms']['n']}) |",
             *_claim_gaps(w),
             f"| worker CPU per step (both processes) | {w['worker_cpu_ms_per_step']} ms |",
             f"| Redis CPU per step | {w['redis_cpu_ms_per_step']} ms |",
             f"| worker RSS idle -> peak | {f['idle_rss_mb']} -> {m['peak_rss_mb']} MB |",
             f"| memory per in-flight run | {m['per_run_kb']} KiB |",
             f"| peak Redis clients / MariaDB connections | {m['peak_redis_clients']} / {m['peak_db_connections']} |"]
    t = f.get("takeover")
    if t:
        lat = t["latency_ms"]
        lines.append(f"| kill -9 of one worker (restarted at once): runs it held mid-step -> claimed again, "
                     f"p50 / p95 / max ms | {t['held_mid_step']} -> {t['claimed_again']}: {lat['p50']} / "
                     f"{lat['p95']} / {lat['max']} |")
        if t.get("rescued_ms"):
            det, rest = t["rescued_ms"], t["claimed_after_rescue_ms"]
            lines.append(f"| of which kill -> rescue sent / rescue -> claim, p50 / p95 ms | {det['p50']} / "
                         f"{det['p95']} and {rest['p50']} / {rest['p95']} |")
        if t.get("claimed_by_ms"):
            by = "; ".join(f"{who} {v['n']} (p50 {v['p50']}, p95 {v['p95']})" for who, v in t["claimed_by_ms"].items())
            first = t.get("restarted_first_claim_ms")
            lines.append(f"| who claimed them, kill -> claim ms; the restarted worker's first claim of any run | "
                         f"{by}; {'none by then' if first is None else f'{first} ms'} |")
    if "runs_passed" in f:
        lines.append(f"| runs done and passing their verdict | {f['runs_passed']}/{p['runs']} ({f['states']}) |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {x['target']} | {x['measured']} | {'yes' if x['met'] else 'NO'} |" for x in f["targets"]]
    lines.append("")
    return lines


def plot(r: dict[str, Any], path: Path) -> None:
    """Throughput bars and the per-step breakdown (p50) side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 1.4]})
    passes = [("model 0 ms/step", r.get("throughput", [])),
              (f"model {r['params'].get('model_ms')} ms/step", r.get("throughput_model", []))]
    passes = [(label, tp) for label, tp in passes if tp]
    names = [c["name"] for c in passes[0][1]] if passes else []
    width = 0.8 / max(1, len(passes))
    for i, (label, tp) in enumerate(passes):
        plain = tp[0]["runs_per_s"] or 1.0
        xs = [j + (i - (len(passes) - 1) / 2) * width for j in range(len(tp))]
        bars = ax1.bar(xs, [c["runs_per_s"] / plain for c in tp], width, label=label,
                       color=["#1f77b4", "#ff7f0e"][i % 2])
        ax1.bar_label(bars, labels=[f"{c['runs_per_s']:.{0 if c['runs_per_s'] >= 20 else 1}f}/s" for c in tp],
                      fontsize=7)
    ax1.set_xticks(range(len(names)), [n.replace(" on ", "\non ") for n in names], fontsize=8)
    ax1.axhline(0.7, color="#d62728", lw=0.8, ls="--")
    ax1.set_ylabel("throughput, x plain Celery (labels: runs/s)")
    ax1.set_title("Throughput, same work and workers")
    if passes:
        ax1.legend(fontsize=8)
    bd = r.get("breakdown", {})
    if bd:
        pieces = [p for p in next(iter(bd.values()))["pieces"]]
        labels = [*bd, "plain Celery"]
        left = [0.0] * len(labels)
        cmap = plt.get_cmap("tab20")
        for i, piece in enumerate(pieces):
            vals = [bd[s]["pieces"][piece]["p50"] or 0.0 for s in bd] + [0.0]
            ax2.barh(labels, vals, left=left, color=cmap(i % 20), label=piece)
            left = [a + b for a, b in zip(left, vals, strict=True)]
        plain = next(iter(bd.values()))["plain_step"]["p50"]
        ax2.barh(labels, [0.0] * len(bd) + [plain], left=left, color="#888888", label="plain step (work + send)")
        ax2.set_xlabel("ms per step (p50 of each piece)")
        ax2.set_title("Where a fenced step's time goes")
        ax2.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"fenced benchmarks, {r['date']}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _claim_gaps(w: dict[str, Any]) -> list[str]:
    """Checkpoint B -> the next attempt's claim, by how it was claimed (older results have no split)."""
    split = w.get("claim_gap_ms")
    if not split:
        return []
    return [f"| ... to the next claim, {how.replace('_', ' ')}: p50 / p95 / max ms | {g.get('p50')} / {g.get('p95')} / "
            f"{g.get('max')} (n {g.get('n')}) |" for how, g in split.items()]


def history(results: list[dict[str, Any]]) -> str:
    """A markdown table of every target over several full runs (oldest first): each target's measured value
    and whether it was met, run by run. A target a run did not measure reads `-`."""
    runs = [(f"{r['date'].removesuffix(' UTC')}, {_cpu(r)}", {t: (v.split(" (")[0], ok) for t, v, ok in targets(r)})
            for r in results]
    names = list(dict.fromkeys(t for _, found in runs for t in found))
    lines = ["| target (UTC; machine) | " + " | ".join(run for run, _ in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for name in names:
        cells = [f"{found[name][0]}{'' if found[name][1] else ' **NO**'}" if name in found else "-"
                 for _, found in runs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _cpu(r: dict[str, Any]) -> str:
    """`AMD EPYC`: the machine's CPU without its size (the same figures differ markedly between machines)."""
    return str(r.get("machine", {}).get("cpu", "?")).split(",")[0].replace("(R)", "").removesuffix(" Processor")


def _by_round(a: dict[str, Any], b: dict[str, Any], compare: Callable[[dict[str, Any], dict[str, Any]], float],
              fmt: str) -> tuple[float, str]:
    """`compare(a's pass, b's pass)` round by round (bench.throughput.combine keeps every interleaved pass),
    its median, and ` (rounds lo-hi)`; results of one pass (before 2026-12-06 22:00) compare their figures."""
    pa, pb = a.get("passes", [a]), b.get("passes", [b])
    if len(pa) != len(pb):
        pa, pb = [a], [b]
    values = [compare(x, y) for x, y in zip(pa, pb, strict=True)]
    spread = f" (rounds {min(values):{fmt}}-{max(values):{fmt}})" if len(values) > 1 else ""
    return statistics.median(values), spread


def _throughput_ratio(fenced: dict[str, Any], other: dict[str, Any]) -> float:
    return float(fenced["runs_per_s"] / other["runs_per_s"])


def _step_overhead(fenced: dict[str, Any], plain: dict[str, Any]) -> float:
    return float(fenced["step_latency_ms"]["p50"] - plain["step_latency_ms"]["p50"])


def _passes(b: dict[str, Any]) -> str:
    """ ` (passes 1.31-1.62)`: the spread of the in-process CPU passes (results before 2026-12-06 have one)."""
    passes = b.get("cpu_ms_per_step_passes")
    return f" (passes {min(passes):.2f}-{max(passes):.2f})" if passes else ""
