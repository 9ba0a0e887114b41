"""The mutation matrix: shows the chaos suite catches broken builds, one named mutation at a time.

Each entry of MUTATIONS is a small edit of one shipped file (exact text, found exactly once, replaced),
the scenario that must catch it and the named condition(s) it must fail on (harness.history.CONDITIONS
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

import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.harness import (
    ChaosConfig,
)
from chaos.report import ScenarioResult
from harness.workers import REPO_ROOT

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
    cfg: dict[str, Any] = field(default_factory=dict)  # ChaosConfig overrides for both runs
    probes: tuple[Edit, ...] = ()  # applied to the control and the mutant alike
    equivalent: str = ""  # why no scenario can catch it ("" = it must be caught)
    blocked: str = ""  # a defect elsewhere that keeps the mutated code from running: not caught until fixed
    ci: bool = False  # in the default test subset (the rest run with FENCED_MUTATIONS=all)


# A fault point before each tool call, named after the tool (`before_ask_user`): the only place a holder
# can freeze between its tool's start event (fenced by the Redis epoch mirror) and the tool's own write.
TOOL_PROBE = Edit(
    "fenced_agents/loop.py",
    '            tool = self.tools.get(call.name)\n',
    '            faults.point(f"before_{call.name}", runner.run_id)  # mutation probe\n'
    '            tool = self.tools.get(call.name)\n',
)

# A fault point where a delivery lets go of its lease (release or handoff): a slow hand-over, so a
# continuation sent before it would be picked up while the lease is still held.
LET_GO_PROBE = Edit(
    "tasks/delivery.py",
    "    try:\n        if lease.timed_out or lease.released:",
    "    from fencing import faults\n\n    faults.point(\"before_let_go\", lease.run_id)  # mutation probe\n"
    "    try:\n        if lease.timed_out or lease.released:",
)

MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation(
        "checkpoint-epoch", "the fenced checkpoint UPDATE loses `AND epoch = ?` (runs._fenced_update)",
        (Edit("checkpoints/runs.py",
              '_rc.epoch == sa.bindparam("w_epoch"), _rc.state == "running",\n    ).values({c:',
              '_rc.state == "running",\n    ).values({c:'),
         # the same fence in the one-round-trip checkpoints (MySQL/MariaDB): the epoch's parameter kept
         Edit("checkpoints/runs.py",
              '_RAW_FENCE = "run_id = %s AND epoch = %s AND state = \'running\'"',
              '_RAW_FENCE = "run_id = %s AND %s IS NOT NULL AND state = \'running\'"')),
        "zombie", {"times": 2}, ("stale_write",), ci=True),
    Mutation(
        "claim-epoch", "the claim's compare-and-set loses `AND epoch = ?` (runs._CLAIM)",
        (Edit("checkpoints/runs.py",
              '_rc.epoch == sa.bindparam("w_epoch"), _rc.state.in_(LIVE_STATES),',
              '_rc.state.in_(LIVE_STATES),'),
         Edit("checkpoints/runs.py",
              '"updated_at_ms = %s WHERE run_id = %s AND epoch = %s AND state IN (\'queued\', \'running\'); "',
              '"updated_at_ms = %s WHERE run_id = %s AND %s IS NOT NULL AND state IN (\'queued\', \'running\'); "')),
        "zombie-takeovers", {"times": 2}, ("stale_write", "takeovers"),
        equivalent="the claim reads the row it updates under a row lock in the same transaction (SELECT ... "
                   "FOR UPDATE; SQLite: BEGIN IMMEDIATE), so the epoch it compares is always the one it read"),
    Mutation(
        "settle-twice", "settling a hold moves it out of the user's account twice (billing.settle_txn and settle_raw)",
        (Edit("checkpoints/billing.py",
              "    _account_txn(conn, run_id, epoch, actor, s.user_id, s.held, s.charge, now_ms)\n",
              "    _account_txn(conn, run_id, epoch, actor, s.user_id, s.held, s.charge, now_ms)\n"
              "    _account_txn(conn, run_id, epoch, actor, s.user_id, s.held, s.charge, now_ms)\n"),
         # the same in the two-round-trip terminal write (MySQL/MariaDB): the account update sent twice
         Edit("checkpoints/billing.py", "    statements = [_RAW_SETTLE, _RAW_CHARGE, ",
              "    statements = [_RAW_SETTLE, _RAW_CHARGE, _RAW_CHARGE, "),
         Edit("checkpoints/billing.py", "    params = [s.charge, now_ms, run_id, *charge,\n",
              "    params = [s.charge, now_ms, run_id, *charge, *charge,\n")),
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
              '        _let_go(lease, handoff, rescue_soon=rescue_soon)\n'
              '        if handoff is not None:\n'
              '            send_next(run_id, handoff)\n',
              '        if handoff is not None:\n'
              '            send_next(run_id, handoff)\n'
              '        _let_go(lease, handoff, rescue_soon=rescue_soon)\n'),),
        # Without the probe the sender wins the race nearly always (the release is one round trip).
        # Every step through the broker: an inline step hands nothing over, so it could not show this.
        "steady", {"runs": 4, "slow_release_ms": 300}, ("healthy", "handoff_gap"), probes=(LET_GO_PROBE,), ci=True,
        cfg={"inline_steps": 0}),
    Mutation(
        "no-fast-takeover", "fast takeover off by default (settings.fast_takeover)",
        (Edit("fenced_core/settings.py", "fast_takeover: bool = Field(True,", "fast_takeover: bool = Field(False,"),),
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
    from chaos.mutation_scenarios import (
        child_freeze_kill,
        effect_replay,
        kill_bound,
        steady,
        zombie_ask,
        zombie_takeovers,
    )

    return {"zombie": scenarios.zombie, "kill": scenarios.kill, "child-kill": scenarios.child_kill,
            "steady": steady, "effect-replay": effect_replay, "zombie-takeovers": zombie_takeovers,
            "child-freeze-kill": child_freeze_kill, "kill-bound": kill_bound, "zombie-ask": zombie_ask}
