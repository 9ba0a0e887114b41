"""`fenced chaos --app MODULE`: the chaos scenarios on a user's own agent, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from checkpoints.db import transaction
from checkpoints.schema import run_checkpoints

pytestmark = pytest.mark.chaos
ROOT = Path(__file__).resolve().parents[1]


def fenced(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    # The support model takes 300 ms a step (its own setting; the demo stub's FENCED_STUB_STEP_MS is not
    # its), so the kills and freezes find a step in flight.
    return subprocess.run([sys.executable, "-m", "fenced_cli", *args], cwd=ROOT,
                          env={**os.environ, "SUPPORT_STEP_MS": "300"}, capture_output=True, text=True,
                          timeout=timeout)


def test_kill_and_zombie_scenarios_pass_on_a_users_agent(mysql_store):
    done = fenced("chaos", "--app", "tests.apps.support_agent", "--agent", "support", "-s", "kill", "-s", "zombie",
                  "--rounds", "2", "--runs", "3", "--lease-ms", "2000", "--step-ms", "200", "--json")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(done.stdout)
    assert [r["scenario"] for r in results] == ["kill", "zombie"]
    for r in results:
        assert r["runs"] > 0 and r["acted"] > 0, r
        assert r["ok"], r["failures"]
    with transaction(readonly=True) as conn:
        agents = {a for (a,) in conn.execute(sa.select(run_checkpoints.c.agent))}
    assert agents == {"support"}, "every scenario run was the user's agent's"


def test_a_module_that_does_not_import_is_one_clear_line():
    done = fenced("chaos", "--app", "no_such_module_here", "-s", "kill", timeout=60)
    assert done.returncode == 2
    assert "--app no_such_module_here: cannot import it here" in done.stderr


def test_an_app_with_several_agents_needs_agent_and_poison_is_the_demos():
    several = fenced("chaos", "--app", "tests.apps.support_agent", "-s", "kill", timeout=60)
    assert several.returncode == 2 and "name the one to run with --agent" in several.stderr, several.stderr
    poison = fenced("chaos", "--app", "tests.apps.support_agent", "--agent", "support", "-s", "poison", timeout=60)
    assert poison.returncode == 2 and "drive the demo agent's test markers" in poison.stderr, poison.stderr
