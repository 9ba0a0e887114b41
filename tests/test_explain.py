"""`fenced explain`: each answer checked on a run that went through that path, on real workers."""

from __future__ import annotations

import json
import re
import signal

import pytest
from typer.testing import CliRunner

from checkpoints import ledger, runs
from checkpoints.ledger import Entry
from fenced_cli import app
from fenced_core.errors import RunNotFound
from fencing import faults
from tasks import service, submit_run
from tasks.explain import explain, takeover_cause
from tests.workers_fixture import wait_for, wait_terminal

CLOCK = r"\d\d:\d\d:\d\d\.\d{3}"
runner = CliRunner()


def _entry(i: int, kind: str, epoch: int, reason: str = "", **detail: object) -> Entry:
    return Entry(i, "r1", 1_700_000_000_000 + i, epoch, "host:7:abcd/1", kind, reason, dict(detail))


@pytest.mark.parametrize(("reason", "cause"), [
    ("pool child 42 died running the step", "child_death"),
    ("holder process h:1:x has no Redis connection on 2 checks: presumed dead", "fast_takeover"),
    ("lease expired without a handover", "lease_expiry"),
    ("no lease and no progress for 4000 ms at step 1 (...): woken by the sweeper", "sweeper"),
    ("something new", "other"),
])
def test_takeover_cause_is_read_from_the_rescue_after_the_previous_claim(reason: str, cause: str) -> None:
    entries = [_entry(1, "claimed", 1, "step 0 claimed"),
               _entry(2, "rescue", 1, "lease expired without a handover"),  # an older holder's: not this one
               _entry(3, "takeover", 2, "previous holder ... step 0", previous_epoch=1),
               _entry(4, "rescue", 2, reason),
               _entry(5, "takeover", 3, "previous holder ... step 0", previous_epoch=2)]
    assert takeover_cause(entries, 3) == cause
    assert takeover_cause(entries, 2) == "lease_expiry"


def test_takeover_cause_waits_for_a_rescue_not_yet_recorded() -> None:
    entries = [_entry(1, "claimed", 1, "step 0 claimed"), _entry(2, "takeover", 2, "x", previous_epoch=1)]
    assert takeover_cause(entries, 2, final=False) is None, "the rescue's entry may land just after the claim"
    assert takeover_cause(entries, 2) == "no_rescue"
    timed_out = [*entries[:1], _entry(3, "step_timeout", 1, "ran past"), _entry(4, "rescue", 1, "lease expired"),
                 _entry(5, "takeover", 2, "x", previous_epoch=1)]
    assert takeover_cause(timed_out, 2) == "step_timeout", "a step timeout is why its lease expired"


def test_retried_says_how_often_why_and_when(workers) -> None:
    workers.start("a")
    run_id = submit_run("u1", "buy headphones [transient:2]")
    wait_terminal([run_id], timeout=40)
    x = explain(run_id)
    retried = x.answer("retried")
    assert retried is not None
    assert retried.sentences[0].startswith("It was retried 8 time(s), each for a transient failure")
    assert retried.sentences[1] == "Retries per step: step 0: 2, step 1: 2, step 2: 2, step 3: 2."
    first = retried.sentences[2]
    assert re.match(rf"at {CLOCK} \(epoch 1, a@\S+ pid \d+\), step 0: model failed transiently: ", first), first
    assert "stub provider overloaded (call 1 of step 0)" in first
    assert x.answer("dead_letter") is None and x.answer("workers") is None and x.answer("waited") is None
    charged = x.answer("charged_once")
    assert charged is not None and len([s for s in charged.sentences if "the hold was settled" in s]) == 1
    assert x.state == "done" and "it is done at step 3, epoch 4, after 4 claim(s) by 1 worker" in x.summary


def test_dead_letter_says_the_retry_budget_ran_out(workers) -> None:
    workers.start("a", FENCED_RETRY_BUDGET="1")
    run_id = submit_run("u1", "laptop [transient:99]")
    [run] = wait_terminal([run_id], timeout=30)
    assert run.state == "dead"
    dead = explain(run_id).answer("dead_letter")
    assert dead is not None
    assert re.match(rf"at {CLOCK} \(epoch 1, a@\S+ pid \d+\) it was dead-lettered because a transient failure "
                    "outlived the step's retry budget: model: stub provider overloaded", dead.sentences[0]), dead
    assert "Step 0 was claimed 1 time(s)" in dead.sentences[1]
    assert "Its credit hold stays held, so a replay can settle it" in dead.sentences[2]
    # Replayed, it is no longer a dead letter: the answer says who replayed it and from where.
    service.replay_dead_letter(run_id, "ops")
    wait_for(lambda: [e.kind for e in ledger.history(run_id)].count("dead_lettered") == 2, 30,
             "the replay to be dead-lettered again")
    again = explain(run_id).answer("dead_letter")
    assert again is not None
    assert any(s.endswith("dead letter replayed by ops: resumes step 0 from checkpoint phase 'none' with a fresh "
                          "delivery budget, paid by its open hold.") for s in again.sentences), again


def test_poison_dead_letter_says_every_delivery_died(workers) -> None:
    workers.start("a", pool="prefork", concurrency=2)
    run_id = submit_run("u1", "buy [poison] headphones")
    [run] = wait_terminal([run_id], timeout=60)
    assert run.state == "dead"
    x = explain(run_id)
    dead = x.answer("dead_letter")
    assert dead is not None
    assert "every delivery of step 1 ended before finishing it" in dead.sentences[0]
    assert "step 1 claimed 3 times without finishing" in dead.sentences[0]
    assert dead.sentences[1].startswith("Step 1 was claimed 4 time(s): ")
    takeovers = x.answer("workers")
    assert takeovers is not None
    # Each crash of a pool child is seen by its parent (child death) or by the connection check (fast takeover).
    took = [s for s in takeovers.sentences if " took it over from " in s]
    assert len(took) == 3, takeovers.sentences
    assert all("because pool child" in s or "presumed dead" in s for s in took), took


def test_a_takeover_explains_two_workers_resume_one_charge_and_one_card(workers) -> None:
    slow = {"FENCED_STUB_STEP_MS": "700"}
    workers.start("a", **slow)
    workers.start("b", **slow)
    run_id = submit_run("u1", "buy headphones")
    # Kill the holder after step 2's tools (the cart card exists), before its checkpoint B.
    wait_for(lambda: runs.get_run(run_id).step == 2, 30, "step 2")
    faults.arm("after_tools")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id, hit
    victim = workers.by_pid(hit[2])
    victim.kill(signal.SIGKILL)
    [run] = wait_terminal([run_id], timeout=40)
    assert run.state == "done"
    survivor = next(w for w in workers.workers if w is not victim)
    x = explain(run_id)

    two = x.answer("workers")
    assert two is not None
    assert two.sentences[0].startswith("2 worker process(es) held it: ")
    took = [s for s in two.sentences if " took it over from " in s]
    assert len(took) == 1, two.sentences
    assert re.match(rf"at {CLOCK} \(epoch \d+, {survivor.name}@\S+ pid {survivor.pid}\) took it over from "
                    rf"{victim.name}@\S+ pid {victim.pid} \(epoch \d+\), because ", took[0]), took[0]
    assert ("presumed dead" in took[0]) or ("lease expired" in took[0]), took[0]

    resumed = x.answer("resumed")
    assert resumed is not None
    assert re.search(r"took it over and resumed from checkpoint A of step 2 \(phase decided\): the model's "
                     "recorded decision is replayed, not paid again", resumed.sentences[0]), resumed

    charged = x.answer("charged_once")
    assert charged is not None
    assert sum("the hold was settled: charged 16 of 20 held credits" in s for s in charged.sentences) == 1
    assert any("resumed from checkpoint A, so the model call of step 2 was replayed from its record, not paid "
               "again" in s for s in charged.sentences), charged

    effects = x.answer("effects_once")
    assert effects is not None
    kinds = [e.kind for e in ledger.history(run_id) if e.kind.startswith("effect_")]
    assert kinds == ["effect_created", "effect_reused"]
    assert f"{victim.name}@" in effects.sentences[0] and "add_to_cart done once" in effects.sentences[0]
    assert f"{survivor.name}@" in effects.sentences[1] and "nothing was made again" in effects.sentences[1]


def test_a_model_call_lost_before_checkpoint_a_is_the_platforms_cost(workers) -> None:
    workers.start("a")
    workers.start("b")
    faults.arm("before_checkpoint_a")  # the decision's event is out (the call was paid), checkpoint A not written
    run_id = submit_run("u1", "compare laptops")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    wait_terminal([run_id], timeout=40)
    x = explain(run_id)
    charged = x.answer("charged_once")
    assert charged is not None
    assert any("the model call of step 0 by epoch 1 answered but was never checkpointed" in s
               and "platform's cost" in s for s in charged.sentences), charged
    resumed = x.answer("resumed")
    assert resumed is not None and "at the start of step 0 (phase none)" in resumed.sentences[0]


def test_waited_says_for_what_and_the_reply_resumed_it(workers) -> None:
    workers.start("a")
    run_id = submit_run("u1", "headphones [ask]")
    wait_for(lambda: runs.get_run(run_id).state == "waiting", 30, "the run to wait")
    waiting = explain(run_id).answer("waited")
    assert waiting is not None
    assert re.match(rf"at {CLOCK} \(epoch 2, a@\S+ pid \d+\) it was parked \(waiting for input: Any preferred "
                    r"brand\?\)\. No worker held it", waiting.sentences[0]), waiting
    assert waiting.sentences[-1] == "It is waiting now for an answer to: Any preferred brand?"
    service.reply(run_id, "Sony", "u1")
    [run] = wait_terminal([run_id], timeout=30)
    assert run.state == "done"
    waited = explain(run_id).answer("waited")
    assert waited is not None
    assert re.match(rf"at {CLOCK} \(epoch 2, u1\): reply to ask_user call_\w+ \(turn 1\); run queued\.",
                    waited.sentences[1]), waited
    assert re.match(rf"It resumed {CLOCK} on a@\S+ pid \d+ \(epoch 3\), \d+\.\d s after the reply\.",
                    waited.sentences[2]), waited
    resumed = explain(run_id).answer("resumed")
    assert resumed is not None and "claimed it and resumed from checkpoint A of step 1" in resumed.sentences[0]


def test_cli_prints_data_literally_and_json(workers) -> None:
    workers.start("a")
    user = "[red]eve[/red]"  # user data: printed as given, never as markup
    run_id = submit_run(user, "headphones [transient:1]")
    wait_terminal([run_id], timeout=40)
    shown = runner.invoke(app, ["explain", run_id[:8]])
    assert shown.exit_code == 0, shown.output
    assert f"of user {user} was submitted" in shown.stdout
    assert "Why was it retried, and how often?" in shown.stdout and "  - It was retried 4 time(s)" in shown.stdout
    data = json.loads(runner.invoke(app, ["explain", run_id, "--json"]).stdout)
    assert data["run_id"] == run_id and data["state"] == "done"
    assert [a["topic"] for a in data["answers"]] == ["outcome", "retried", "charged_once"]
    assert runner.invoke(app, ["explain", "ffffffff-0000"]).exit_code == 2


def test_another_users_run_is_not_explained(workers) -> None:
    run_id = submit_run("alice", "a lamp")
    with pytest.raises(RunNotFound):
        explain(run_id, "mallory")
    assert explain(run_id, "alice").state == "queued"
