"""The scenarios only the mutation matrix runs (chaos.scenarios has the rest): each exercises a path a
mutation of chaos/mutation.py breaks, and judges it on the condition that mutation must fail."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

import sqlalchemy as sa

from chaos.harness import (
    QUERIES,
    ChaosConfig,
    Cluster,
    clear_faults,
    judge,
    owner_pid,
    resumed_at_ms,
    rows,
    wait_for,
    wait_terminal,
)
from chaos.report import ScenarioResult

Progress = Callable[[str], None]


def _submit() -> Callable[[str, str], str]:
    """submit_run with users unique to this call (every user starts with a fresh balance)."""
    from tasks import submit_run

    nonce = uuid.uuid4().hex[:6]
    return lambda user, query: submit_run(f"{user}-{nonce}", query)


@contextmanager
def _cluster(cfg: ChaosConfig) -> Iterator[tuple[Cluster, Callable[[str, str], str]]]:
    cluster = Cluster(cfg)
    try:
        yield cluster, _submit()
    finally:
        clear_faults()
        cluster.close()


def _arm(point: str, action: str, times: int = 1, hang_s: float = 3600) -> None:
    """faults.arm for any point name (a probe's points are unknown to the shipped fault list)."""
    from fencing import keys
    from fencing.connection import get_redis

    get_redis().hset(keys.FAULTS, mapping={point: times, f"{point}:action": action, f"{point}:hang_s": hang_s})


def _has_event(run_id: str, eid: str) -> bool:
    from fencing import events

    return any(ev.eid == eid for ev in events.read(run_id))


def _ledger_kinds(run_id: str, kind: str) -> list[Any]:
    from checkpoints import ledger

    return [e for e in ledger.history(run_id) if e.kind == kind]


def _in_state(run_id: str, state: str) -> bool:
    return any(r.state == state for r in rows([run_id]))


def _refused(run_id: str, tokens: set[str]) -> bool:
    return any(e.actor in tokens for e in _ledger_kinds(run_id, "fence_rejected"))


def check_takeovers(result: ScenarioResult, run_ids: list[str], allowed: int) -> None:
    """Condition `takeovers`: a run is taken over at most `allowed` times, as often as the scenario took a
    holder away from it (a lease dropped under a live holder shows as a takeover nothing caused)."""
    for run_id in run_ids:
        n = len(_ledger_kinds(run_id, "takeover"))
        if n > allowed:
            result.fail(run_id, "takeovers", f"taken over {n} times; the scenario took {allowed} holder(s) away")


def _runs_since(since_ms: int, user_prefix: str) -> list[str]:
    from checkpoints.db import transaction
    from checkpoints.schema import run_checkpoints

    with transaction(readonly=True) as conn:
        return list(conn.execute(sa.select(run_checkpoints.c.run_id).where(
            run_checkpoints.c.created_at_ms >= since_ms, run_checkpoints.c.user_id.like(f"{user_prefix}%"))).scalars())


def steady(cfg: ChaosConfig, runs: int = 6, slow_release_ms: int = 0, progress: Progress = print) -> ScenarioResult:
    """Nothing happens: `runs` runs on two workers, judged as healthy runs too (no takeover or rescue, every
    step handed to the next within max(1 s, lease / 2)). `slow_release_ms`: every delivery waits that long
    before it lets go of its lease (probe point `before_let_go`): slow, but healthy."""
    result = ScenarioResult("steady", {"runs": runs, "lease_ms": cfg.lease_ms, "slow_release_ms": slow_release_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        if slow_release_ms:
            _arm("before_let_go", "hang", times=runs * 8, hang_s=slow_release_ms / 1000)
        ids = [submit(f"steady-{i}", QUERIES[i % len(QUERIES)]) for i in range(runs)]
        if not wait_terminal(ids, cfg.timeout_s):
            result.notes.append(f"not every run ended within {cfg.timeout_s:.0f} s")
        judge(result, ids, None, healthy=True, gap_ms=max(1000, cfg.lease_ms // 2))
        progress(f"steady: {runs} runs judged")
    return result


def effect_replay(cfg: ChaosConfig, times: int = 2, progress: Progress = print) -> ScenarioResult:
    """Kill the holder between a cart step's tools and its checkpoint B: the next holder replays the
    add-to-cart effect, which must return the first card and say so in the ledger."""
    from fencing import faults

    result = ScenarioResult("effect-replay", {"times": times, "lease_ms": cfg.lease_ms})
    with _cluster(cfg) as (cluster, submit):
        cluster.start(2)
        for i in range(times):
            run_id = submit(f"effect-{i}", QUERIES[i % len(QUERIES)])  # every query buys: a card at step 2
            # Armed once step 2 started: the next tools to end are its add_to_cart (one run in flight).
            if not wait_for(partial(_has_event, run_id, "s2:start"), 60, every_s=0.02):
                result.fail(run_id, "effect-replay", "step 2 never started")
                result.runs += 1
                continue
            faults.arm("after_tools")
            hit = faults.next_hit(30)
            clear_faults()
            victim = cluster.node_of(hit[2]) if hit else None
            if victim is None or hit is None or hit[1] != run_id:
                result.fail(run_id, "effect-replay", f"no holder stopped after the cart step's tools ({hit})")
                result.runs += 1
                continue
            victim.kill(signal.SIGKILL)
            time.sleep(1)
            victim.restart()
            wait_terminal([run_id], cfg.timeout_s)
            if not any(e.detail.get("phase") == "decided" for e in _ledger_kinds(run_id, "takeover")):
                result.fail(run_id, "effect-replay", "no takeover replayed the decided cart step")
            judge(result, [run_id], None)
            progress(f"effect-replay {i + 1}/{times}")
    return result


def zombie_ask(cfg: ChaosConfig, times: int = 2, progress: Progress = print) -> ScenarioResult:
    """A holder freezes right before its ask_user tool records the question (probe point
    `before_ask_user`); the new holder replays the step and is held at the same point while the zombie
    is woken, so the zombie's question write comes first, after the newer claim: it must be refused.
    Then a person replies and the run must finish."""
    from fencing import faults
    from tasks.control import reply_to_run

    result = ScenarioResult("zombie-ask", {"times": times, "lease_ms": cfg.lease_ms})
    slow = replace(cfg, step_ms=max(cfg.step_ms, 600))
    with _cluster(slow) as (cluster, submit):
        cluster.start(2)
        for i in range(times):
            run_id = submit(f"zombie-ask-{i}", f"{QUERIES[i % len(QUERIES)]} [ask]")
            result.runs += 1
            if not wait_for(partial(_has_event, run_id, "s1:start"), 60, every_s=0.02):
                result.fail(run_id, "zombie", "step 1 never started")
                continue
            _arm("before_ask_user", "stop")
            hit = faults.next_hit(30)
            zombie = cluster.node_of(hit[2]) if hit else None
            if zombie is None:
                result.fail(run_id, "zombie", f"no holder reached the question ({hit})")
                continue
            freeze_ms = time.time() * 1000
            _arm("before_ask_user", "hang", hang_s=2)  # the new holder's replay waits there
            second = faults.next_hit(slow.timeout_s)
            zombie.kill(signal.SIGCONT)
            if second is None:
                result.fail(run_id, "zombie", "no new holder replayed the question")
            waiting = wait_for(partial(_in_state, run_id, "waiting"), slow.timeout_s)
            clear_faults()
            if waiting:
                reply_to_run(run_id, "any brand", by="chaos")
            ended = wait_terminal([run_id], slow.timeout_s)
            tokens = {e.actor for e in _ledger_kinds(run_id, "claimed") + _ledger_kinds(run_id, "takeover")
                      if zombie.owns(owner_pid(e.actor) or -1)}
            refused = wait_for(partial(_refused, run_id, tokens), 15, every_s=0.2)
            result.runs -= 1  # judge counts it
            judge(result, [run_id], None)
            if not ended or not refused or resumed_at_ms(run_id, freeze_ms) is None:
                result.fail(run_id, "zombie", f"ended={ended}, waited={bool(waiting)}, "
                                              f"old holder refused={bool(refused)}")
            progress(f"zombie-ask {i + 1}/{times}: {'refused' if refused else 'NOT refused'}")
    return result


def zombie_takeovers(cfg: ChaosConfig, times: int = 2, progress: Progress = print) -> ScenarioResult:
    """The zombie scenario, plus `takeovers`: one freeze per run, so at most one takeover per run."""
    from chaos import scenarios

    since = int(time.time() * 1000)
    result = scenarios.zombie(cfg, times=times, progress=progress)
    check_takeovers(result, _runs_since(since, "zombie-"), 1)
    return result


def kill_bound(cfg: ChaosConfig, rounds: int = 2, runs: int = 4, bound_ms: int = 4000,
               progress: Progress = print) -> ScenarioResult:
    """The kill scenario, plus `bound`: every killed holder's run resumed within `bound_ms` of the kill."""
    from chaos import scenarios

    result = scenarios.kill(cfg, rounds=rounds, runs=runs, progress=progress)
    late = [ms for ms in result.latencies_ms.get("whole-worker kill", []) if ms > bound_ms]
    if late or not result.latencies_ms.get("whole-worker kill"):
        result.fail("kill", "bound", f"takeovers after {sorted(late)} ms exceed {bound_ms} ms (lease {cfg.lease_ms} ms)"
                    if late else "no kill interrupted a run: nothing measured")
    return result


def child_freeze_kill(cfg: ChaosConfig, times: int = 2, progress: Progress = print) -> ScenarioResult:
    """A prefork pool child freezes mid-step (SIGSTOP) and, once another worker took its run over after
    the lease ran out, is SIGKILLed (an OOM kill of a stuck process). Its parent then releases the dead
    child's lease and rescues the run, but the lease is the new holder's by then and must stay so: one
    freeze, one takeover (`takeovers`)."""
    result = ScenarioResult("child-freeze-kill", {"times": times, "lease_ms": cfg.lease_ms})
    # Steps longer than the parent takes to notice its child died (about a second): the new holder is
    # still in its step when the parent cleans up, so a lease taken from it cannot go unnoticed.
    slow = replace(cfg, step_ms=max(cfg.step_ms, 2500))
    with _cluster(slow) as (cluster, submit):
        [parent] = cluster.start(1, pool="prefork", prefix="p")
        cluster.start(1)
        frozen = 0
        for i in range(times * 3):
            if frozen == times:
                break
            run_id = submit(f"child-freeze-{i}", QUERIES[i % len(QUERIES)])

            def child_pid(r: str = run_id) -> int | None:
                pid = next((owner_pid(x.owner) for x in rows([r]) if x.owner), None)
                return pid if pid and pid != parent.pid and parent.owns(pid) else None

            pid = wait_for(child_pid, 30)
            if pid is None:  # the threads worker took it: not this scenario's case
                wait_terminal([run_id], slow.timeout_s)
                continue
            freeze_ms = time.time() * 1000
            os.kill(pid, signal.SIGSTOP)
            try:
                resumed = wait_for(partial(resumed_at_ms, run_id, freeze_ms), slow.lease_ms / 1000 + 10)
            finally:
                os.kill(pid, signal.SIGKILL)
            frozen += 1
            wait_terminal([run_id], slow.timeout_s)
            if resumed is None:
                result.fail(run_id, "stream", "pool child frozen past its lease but no task_resumed")
            else:
                result.latency("pool child freeze", resumed - freeze_ms)
            judge(result, [run_id], None)
            check_takeovers(result, [run_id], 1)
            progress(f"child-freeze-kill {frozen}/{times}")
        if frozen < times:
            result.notes.append(f"only {frozen} of {times} runs were held by a pool child")
            if not frozen:
                result.fail("child-freeze-kill", "takeovers", "no run was held by a pool child: nothing tested")
    return result
