"""The mutation matrix: shows the chaos suite catches broken builds, one named mutation at a time.

Each entry of MUTATIONS is a small edit of one shipped file (exact text, found exactly once, replaced),
the scenario that must catch it and the named condition(s) it must fail on (fenced.history.CONDITIONS
and HEALTHY_CONDITIONS, plus the scenario-level `takeovers`, `bound` and `zombie`). `check_mutation`
runs that scenario twice, against workers from two copies of the tracked tree: the control (unmutated;
it must pass) and the mutant (it must fail on one of the named conditions, not on just anything).

Some mutations need a probe to be reachable: a fault point that shipped code does not have. A probe
is applied to the control and the mutant alike, so the only difference between them is the mutation.
An entry with `equivalent` set names a mutant no scenario can tell apart from the shipped code, and
why; it is still run (it must survive), and a failure of it means the table is wrong.

The mutations live only here and in temporary copies; nothing that ships has a switch for them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
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
from fenced.workers import REPO_ROOT

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Edit:
    """Replace `find` (which must occur exactly once in `file`) by `replace`."""

    file: str
    find: str
    replace: str


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    edits: tuple[Edit, ...]
    scenario: str  # a key of scenario_functions()
    kwargs: dict[str, int]
    conditions: tuple[str, ...]  # the mutant must fail on one of these
    cfg: dict[str, int] = field(default_factory=dict)  # ChaosConfig overrides for both runs
    probes: tuple[Edit, ...] = ()  # applied to the control and the mutant alike
    equivalent: str = ""  # why no scenario can catch it ("" = it must be caught)
    blocked: str = ""  # a defect elsewhere that keeps the mutated code from running: not caught until fixed
    ci: bool = False  # in the default test subset (the rest run with FENCED_MUTATIONS=all)


# A fault point before each tool call, named after the tool (`before_ask_user`): the only place a holder
# can freeze between its tool's start event (fenced by the Redis epoch mirror) and the tool's own write.
TOOL_PROBE = Edit(
    "tasks/step.py",
    '            tool = ToolContext(self.c, call.id, self.step)\n',
    '            faults.point(f"before_{call.name}", self.run_id)  # mutation probe\n'
    '            tool = ToolContext(self.c, call.id, self.step)\n',
)

# A fault point where a delivery lets go of its lease (release or handoff): a slow hand-over, so a
# continuation sent before it would be picked up while the lease is still held.
LET_GO_PROBE = Edit(
    "tasks/delivery.py",
    "    try:\n        if lease.timed_out:\n            return\n",
    "    from fenced import faults\n\n    faults.point(\"before_let_go\", lease.run_id)  # mutation probe\n"
    "    try:\n        if lease.timed_out:\n            return\n",
)

MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation(
        "checkpoint-epoch", "the fenced checkpoint UPDATE loses `AND epoch = ?` (runs._fenced_update)",
        (Edit("checkpoints/runs.py",
              '_rc.epoch == sa.bindparam("w_epoch"), _rc.state == "running",\n    ).values({c:',
              '_rc.state == "running",\n    ).values({c:'),),
        "zombie", {"times": 2}, ("stale_write",), ci=True),
    Mutation(
        "claim-epoch", "the claim's compare-and-set loses `AND epoch = ?` (runs._CLAIM)",
        (Edit("checkpoints/runs.py",
              '_rc.epoch == sa.bindparam("w_epoch"), _rc.state.in_(LIVE_STATES),',
              '_rc.state.in_(LIVE_STATES),'),),
        "zombie-takeovers", {"times": 2}, ("stale_write", "takeovers"),
        equivalent="the claim reads the row it updates under a row lock in the same transaction (SELECT ... "
                   "FOR UPDATE; SQLite: BEGIN IMMEDIATE), so the epoch it compares is always the one it read"),
    Mutation(
        "settle-twice", "settling a hold moves it out of the user's account twice (billing.settle_txn)",
        (Edit("checkpoints/billing.py",
              "    _account_txn(conn, run_id, epoch, actor, hold.user_id, held, charge, now_ms)\n",
              "    _account_txn(conn, run_id, epoch, actor, hold.user_id, held, charge, now_ms)\n"
              "    _account_txn(conn, run_id, epoch, actor, hold.user_id, held, charge, now_ms)\n"),),
        "steady", {"runs": 4}, ("account",), ci=True),
    Mutation(
        "effect-lookup", "an effect's replay skips the lookup of its first result (effects._perform_once_txn)",
        (Edit("checkpoints/effects.py",
              "    done = conn.execute(sa.select(effects.c.result).where(effects.c.request_key == key)).scalar()\n",
              "    done = None\n"),),
        # The replay's insert hits the unique request key, rolls back to its savepoint and returns the first
        # result: same card, but no effect_reused in the ledger (and an expired card is never renewed).
        "effect-replay", {"times": 2}, ("effect_recorded",)),
    Mutation(
        "release-prefix", "a dead holder's lease release deletes any lease, not only that holder's "
                          "(release_prefix.lua)",
        (Edit("fencing/lua/release_prefix.lua",
              "if current and string.sub(current, 1, #prefix) == prefix then",
              "if current then"),),
        # Before 520e0e6 this mutant survived: liveness.child_died, the caller that relies on the check,
        # never ran (the parent did not recognise billiard's wrapped WorkerLostError).
        "child-freeze-kill", {"times": 2}, ("takeovers",)),
    Mutation(
        "send-before-release", "the continuation is sent before the lease is handed over (delivery.deliver)",
        (Edit("tasks/delivery.py",
              '        _let_go(lease, handoff, rescue_soon=outcome in ("lease_lost", "db_unavailable", "error"))\n'
              '        if handoff is not None:\n'
              '            send_next(run_id, handoff)\n',
              '        if handoff is not None:\n'
              '            send_next(run_id, handoff)\n'
              '        _let_go(lease, handoff, rescue_soon=outcome in ("lease_lost", "db_unavailable", "error"))\n'),),
        # Without the probe the sender wins the race nearly always (the release is one round trip).
        "steady", {"runs": 4, "slow_release_ms": 300}, ("healthy", "handoff_gap"), probes=(LET_GO_PROBE,), ci=True),
    Mutation(
        "no-fast-takeover", "fast takeover off by default (settings.fast_takeover)",
        (Edit("fenced/settings.py", "fast_takeover: bool = Field(True,", "fast_takeover: bool = Field(False,"),),
        # A lease twice the bound: only the lease's expiry frees a killed worker's runs.
        "kill-bound", {"rounds": 2, "runs": 4, "bound_ms": 4000}, ("bound",), cfg={"lease_ms": 8000}),
    Mutation(
        "ask-unfenced", "recording a question loses its fence (inputs._ask_txn)",
        (Edit("checkpoints/inputs.py",
              '    fenced_update_txn(conn, c.run.run_id, c.epoch, f"question {tool_call_id}")\n', ""),),
        "zombie-ask", {"times": 2}, ("stale_write",), probes=(TOOL_PROBE,), ci=True),
    Mutation(
        "release-any", "a holder's release drops the lease whoever holds it (release.lua)",
        (Edit("fencing/lua/release.lua", "if redis.call('GET', lease_key) ~= token then\n    return 0\nend\n", ""),),
        "zombie-takeovers", {"times": 2}, ("takeovers",)),
    Mutation(
        "renew-any", "a holder's renewal extends the lease whoever holds it (renew.lua)",
        (Edit("fencing/lua/renew.lua",
              "if redis.call('GET', lease_key) == token then\n    redis.call('PEXPIRE', lease_key, ttl_ms)\n"
              "    return 1\nend\nreturn 0",
              "redis.call('PEXPIRE', lease_key, ttl_ms)\nreturn 1"),),
        "zombie-takeovers", {"times": 2}, ("stale_write", "takeovers", "stream_order"),
        equivalent="a fenced-out holder that believes it still holds the lease only runs on to its next write, "
                   "which the epoch refuses (database or Redis mirror); renewing the new holder's lease "
                   "delays nothing, since the new holder renews it anyway"),
    Mutation(
        "event-epoch", "an event append skips the epoch mirror comparison (append_event.lua)",
        (Edit("fencing/lua/append_event.lua", "if current > epoch then\n    return false\nend\n", ""),),
        "zombie", {"times": 2}, ("stream_order",), ci=True),
)}


# -- copies of the tree -------------------------------------------------------------------------------
def copy_tree(dest: Path) -> Path:
    """Copy the tracked (and untracked, not ignored) files of the working tree to `dest`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT,
                           check=True, capture_output=True, text=True).stdout.splitlines()
    for rel in files:
        src = REPO_ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def apply(root: Path, edits: tuple[Edit, ...], name: str) -> None:
    for edit in edits:
        target = root / edit.file
        source = target.read_text()
        if source.count(edit.find) != 1:
            raise RuntimeError(f"mutation {name!r}: its text occurs {source.count(edit.find)} times in {edit.file}, "
                               "not once; update MUTATIONS in chaos/mutation.py")
        target.write_text(source.replace(edit.find, edit.replace))


def mutated_copy(dest: Path, name: str = "checkpoint-epoch") -> Path:
    """Copy the tracked tree to `dest` with mutation `name` (and its probes) applied."""
    m = MUTATIONS[name]
    copy_tree(dest)
    apply(dest, m.probes + m.edits, name)
    return dest


def control_copy(dest: Path, name: str) -> Path:
    """The control for mutation `name`: the tracked tree with only its probes applied."""
    m = MUTATIONS[name]
    copy_tree(dest)
    apply(dest, m.probes, name)
    return dest


# -- the check ----------------------------------------------------------------------------------------
@dataclass
class MutationResult:
    name: str
    scenario: str
    expected: tuple[str, ...]
    equivalent: str
    blocked: str
    control: ScenarioResult
    mutant: ScenarioResult

    @property
    def control_ok(self) -> bool:
        return self.control.ok

    @property
    def mutant_failed(self) -> list[str]:
        """The conditions the mutant failed on, most frequent first."""
        return [c for c, _ in Counter(f.condition for f in self.mutant.failures).most_common()]

    @property
    def caught(self) -> bool:
        """The control passed and the mutant failed on one of the conditions named for it."""
        return self.control_ok and any(c in self.expected for c in self.mutant_failed)

    @property
    def ok(self) -> bool:
        """Caught; for an equivalent mutant (nothing can catch it), a passing control is all there is to ask."""
        return self.control_ok if self.equivalent else self.caught

    def to_dict(self) -> dict[str, Any]:
        return {"mutation": self.name, "scenario": self.scenario, "expected": list(self.expected),
                "equivalent": self.equivalent or None, "blocked": self.blocked or None, "control_ok": self.control_ok,
                "mutant_failed_on": self.mutant_failed, "caught": self.caught, "ok": self.ok,
                "control": self.control.to_dict(), "mutant": self.mutant.to_dict()}


def check_mutation(name: str, cfg: ChaosConfig, progress: Progress = print, workdir: Path | None = None
                   ) -> MutationResult:
    """Run mutation `name`'s scenario against workers from an unmutated copy (the control) and from a
    mutated copy; both runs use `cfg` with the mutation's overrides, and their logs go under cfg.log_dir."""
    m = MUTATIONS[name]
    scenario = scenario_functions()[m.scenario]
    with tempfile.TemporaryDirectory(prefix=f"fenced-mutation-{name}-", dir=workdir) as tmp:
        control_tree = control_copy(Path(tmp) / "control", name)
        mutant_tree = mutated_copy(Path(tmp) / "mutant", name)
        results = []
        for label, tree in (("control", control_tree), ("mutant", mutant_tree)):
            run_cfg = replace(cfg, **m.cfg, cwd=tree, log_dir=cfg.log_dir / name / label)
            started = time.monotonic()
            result = scenario(run_cfg, progress=lambda msg, lb=label: progress(f"{name} ({lb}): {msg}"), **m.kwargs)
            result.elapsed_s = time.monotonic() - started
            result.name = f"{m.scenario} ({label})"
            results.append(result)
    return MutationResult(name, m.scenario, m.conditions, m.equivalent, m.blocked, results[0], results[1])


# -- the scenarios the matrix adds (chaos.scenarios has the rest) ----------------------------------------
def scenario_functions() -> dict[str, Callable[..., ScenarioResult]]:
    from chaos import scenarios

    return {"zombie": scenarios.zombie, "kill": scenarios.kill, "child-kill": scenarios.child_kill,
            "steady": steady, "effect-replay": effect_replay, "zombie-takeovers": zombie_takeovers,
            "child-freeze-kill": child_freeze_kill, "kill-bound": kill_bound, "zombie-ask": zombie_ask}


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
    from fenced import faults

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
    from fenced import faults
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
