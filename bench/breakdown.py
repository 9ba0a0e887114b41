"""Where a fenced step's time goes: deliveries run in this process with a timer on every round trip.

`measure(runs)` submits runs and drives each through `tasks.delivery.deliver` right here (the
continuations it sends are real Celery messages to the real broker, removed afterwards), with each
piece of the protocol wrapped in a timer: lease, claim (its locked read is the only row read), events
(the first also raises the epoch mirror), checkpoint A, checkpoint B / terminal write, admission
release, lease release, send. The model call and tools (the work plain Celery does too) are timed as
`work`; `other` is the rest (Python, logging). For comparison, `plain_step_ms` times the same work plus
one Celery send.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.stats import summary
from bench.work import QUERY, STEPS_PER_RUN

# (label, module path, attribute): wrapped where the protocol looks them up.
PIECES = (
    ("lease acquire", "fencing.lease.Lease", "acquire"),
    ("claim (epoch + 1)", "checkpoints.runs", "claim_or_row"),  # its refusal is the row it read
    ("events", "fencing.events.Appends", "send"),  # events.append(_many) and a step's emit go through it
    ("checkpoint A", "checkpoints.runs", "write_decided"),
    ("checkpoint B", "checkpoints.runs", "write_step_done"),
    ("checkpoint B", "checkpoints.runs", "write_step_done_and_claim"),  # and the next step's inline claim
    ("terminal write", "checkpoints.runs", "finish"),
    ("admission release", "fencing.admission", "release_slot"),
    ("lease release", "fencing.lease.Lease", "release"),
    ("work (model + tools)", "examples.shopping.stub.StubModel", "decide"),
    ("work (model + tools)", "fenced_agents.loop.AgentLoop", "_call"),
)


class Timers:
    """Per-piece durations (ms) of the current delivery, collected per delivery."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.deliveries: list[dict[str, float]] = []

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.current[label] += (time.perf_counter() - t) * 1000
                self.calls[label] += 1

        return timed


@contextmanager
def instrumented(timers: Timers) -> Iterator[None]:
    import importlib

    saved = []
    for label, path, attr in PIECES:
        mod_name, _, cls = path.rpartition(".") if path[0].islower() and path.split(".")[-1][0].isupper() else (
            path, "", "")
        owner = getattr(importlib.import_module(mod_name), cls) if cls else importlib.import_module(path)
        original = owner.__dict__[attr]
        saved.append((owner, attr, original))
        setattr(owner, attr, timers.wrap(label, original))
    try:
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)


def measure(runs: int) -> dict[str, Any]:
    """Drive `runs` fenced runs through in-process deliveries; per-step p50/p99 of every piece (ms)."""
    import examples.shopping  # noqa: F401 - registers the agent the in-process deliveries run
    from bench.plain_app import plain_step  # noqa: F401 - registers the plain task for the comparison
    from tasks import submit_run
    from tasks.app import send_continuation

    timers = Timers()
    totals: list[float] = []

    def send(run_id: str, step: int) -> None:
        t = time.perf_counter()
        send_continuation(run_id, step)
        timers.current["send"] += (time.perf_counter() - t) * 1000

    for i in range(runs + 2):  # the first two warm up connections and caches
        run_id = submit_run(f"breakdown-{i}-{time.time_ns()}", QUERY)

        def each(total_ms: float, keep: bool = i >= 2) -> None:
            if keep:
                timers.deliveries.append({**timers.current, "total": total_ms})
                totals.append(total_ms)
            timers.current = defaultdict(float)

        with instrumented(timers):
            drive(run_id, each, send)
    labels = list(dict.fromkeys([p[0] for p in PIECES] + ["send"]))
    pieces = {}
    for label in labels:
        values = [d.get(label, 0.0) for d in timers.deliveries]
        pieces[label] = summary(values)
    others = [d["total"] - sum(v for k, v in d.items() if k != "total") for d in timers.deliveries]
    pieces["other (Python, logging)"] = summary(others)
    return {"steps": len(totals), "total": summary(totals), "pieces": pieces,
            "plain_step": plain_in_process(runs), **cpu_profile(runs)}


@contextmanager
def round_trips() -> Iterator[dict[str, int]]:
    """Count the round trips this process makes while inside: `sql` (one per query sent to MySQL/MariaDB
    through PyMySQL or mysqlclient, a multi-statement query counting once, COMMIT included) and `redis`
    (one per command or pipeline sent). SQLite has no round trips: its `sql` stays 0."""
    import redis.connection

    counts = {"sql": 0, "redis": 0}
    patched: list[tuple[Any, str, Any]] = []

    def count(owner: Any, attr: str, key: str) -> None:
        original = owner.__dict__[attr]

        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[key] += 1
            return original(*args, **kwargs)

        patched.append((owner, attr, original))
        setattr(owner, attr, counted)

    count(redis.connection.AbstractConnection, "send_packed_command", "redis")
    try:
        import pymysql.connections

        count(pymysql.connections.Connection, "_execute_command", "sql")
    except ImportError:
        pass
    try:
        import MySQLdb.connections  # type: ignore[import-not-found, import-untyped, unused-ignore]

        count(MySQLdb.connections.Connection, "query", "sql")
    except ImportError:
        pass
    try:
        yield counts
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


CPU_PASSES = 5  # the in-process CPU figures are the median pass of this many


def cpu_profile(runs: int, top: int = 25) -> dict[str, Any]:
    """This process's CPU per fenced step (no timers), and where it goes: cProfile's top functions by
    internal time over the same kind of deliveries (the profiler costs time itself; compare shares).

    The CPU per step is the median of CPU_PASSES passes of `runs` // 2 runs each (on a shared VM one
    pass has read anywhere from 1.1 to 2.1 ms for the same code); every pass's figure is kept."""
    import cProfile
    import io
    import pstats

    from fenced_core.settings import get_settings
    from tasks import submit_run

    # As a worker runs them (FENCED_INLINE_STEPS: a step ready at once runs in the delivery before it),
    # and, for comparison, one delivery per step (every step handed over through the broker).
    inline = get_settings().inline_steps
    half = max(1, runs // 2)
    ids = [submit_run(f"cpu-{i}-{time.time_ns()}", QUERY) for i in range(2 + (CPU_PASSES + 2) * half)]
    for run_id in ids[:2]:
        drive(run_id, lambda _ms: None, inline=inline)
    steps = STEPS_PER_RUN * half

    def timed(batch: list[str], each_inline: int) -> tuple[float, float]:
        cpu, wall = time.process_time(), time.perf_counter()
        for run_id in batch:
            drive(run_id, lambda _ms: None, inline=each_inline)
        return (time.process_time() - cpu) * 1000 / steps, (time.perf_counter() - wall) * 1000 / steps

    batches = [ids[2 + k * half:2 + (k + 1) * half] for k in range(CPU_PASSES + 2)]
    passes = [timed(batch, inline) for batch in batches[:CPU_PASSES]]
    cpu_ms, wall_ms = median_pass(passes)
    one_cpu_ms, one_wall_ms = timed(batches[CPU_PASSES], 0)
    # The same deliveries again, counted (the counting costs CPU of its own: not in the figures above).
    with round_trips() as trips:
        for run_id in batches[CPU_PASSES + 1]:
            drive(run_id, lambda _ms: None, inline=inline)
    counted_steps = STEPS_PER_RUN * half
    profile = cProfile.Profile()
    profile.enable()
    for run_id in [submit_run(f"cpu-p{i}-{time.time_ns()}", QUERY) for i in range(half)]:
        drive(run_id, lambda _ms: None, inline=inline)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return {"cpu_ms_per_step": round(cpu_ms, 2), "wall_ms_per_step": round(wall_ms, 2), "inline_steps": inline,
            "cpu_ms_per_step_passes": [round(c, 2) for c, _w in passes],
            "one_step_per_delivery": {"cpu_ms_per_step": round(one_cpu_ms, 2),
                                      "wall_ms_per_step": round(one_wall_ms, 2)},
            "sql_round_trips_per_step": round(trips["sql"] / counted_steps, 2),
            "redis_round_trips_per_step": round(trips["redis"] / counted_steps, 2),
            "counted_steps": counted_steps, "profile": out.getvalue().strip()}


def median_pass(passes: list[tuple[float, float]]) -> tuple[float, float]:
    """The pass whose CPU is the median (an odd count: the middle one), with its own wall time."""
    return sorted(passes)[(len(passes) - 1) // 2]


def drive(run_id: str, each: Callable[[float], None],
          send: Callable[[str, int], None] | None = None, inline: int = 0) -> None:
    """Deliver every step of a submitted run here, as a worker would (`inline`: as deliver's, steps a
    delivery may run after its own); `each(ms)` after each delivery.

    `send` (default: the real continuation send) is called for every continuation; the messages that
    reach the broker are removed, since this process delivers the steps itself."""
    from fencing.connection import get_redis
    from tasks import queues
    from tasks.app import send_continuation
    from tasks.delivery import deliver

    sent: list[int] = []

    def send_next(rid: str, step: int) -> None:
        (send or send_continuation)(rid, step)
        sent.append(step)

    step = 0  # the first wake-up's step, as submit sends it
    for _ in range(STEPS_PER_RUN):
        t = time.perf_counter()
        outcome = deliver(run_id, step, send_next, inline=inline)
        each((time.perf_counter() - t) * 1000)
        if outcome == "done":
            break
        if outcome != "continue":
            raise RuntimeError(f"delivery of {run_id} step {step} ended {outcome}")
        step = sent[-1]
    get_redis().delete(queues.NORMAL, queues.CONTINUE)


def plain_in_process(runs: int) -> dict[str, Any]:
    """The plain task's step in this process: the same work plus one Celery send (no broker round trip
    to receive it); per-step ms, and this process's CPU per step (the median of CPU_PASSES passes)."""
    from bench.plain_app import plain_step
    from bench.work import agent_step
    from fencing.connection import get_redis
    from tasks import queues

    def one_run(run: str) -> list[float]:
        history: list[dict[str, Any]] = []
        values = []
        for step in range(STEPS_PER_RUN):
            t = time.perf_counter()
            history, answer = agent_step(run, step, history)
            if answer is None:
                plain_step.apply_async(args=(run, step + 1, history), queue=queues.CONTINUE,
                                       routing_key=queues.CONTINUE)
            values.append((time.perf_counter() - t) * 1000)
        return values

    for warm in ("p-warm-0", "p-warm-1"):
        one_run(warm)
    per_pass = max(1, runs // CPU_PASSES)
    values: list[float] = []
    passes: list[tuple[float, float]] = []
    for k in range(CPU_PASSES):
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(per_pass):
            values += one_run(f"p{k}-{i}")
        steps = STEPS_PER_RUN * per_pass
        passes.append(((time.process_time() - cpu) * 1000 / steps, (time.perf_counter() - wall) * 1000 / steps))
    get_redis().delete(queues.CONTINUE)
    return {**summary(values), "cpu_ms_per_step": round(median_pass(passes)[0], 2),
            "cpu_ms_per_step_passes": [round(c, 2) for c, _w in passes]}
