"""FENCED_TASK_EVENTS turns Celery's task events off for a worker and its sends (on by default: Flower)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.workers import REPO_ROOT

PROBE = "import celeryconfig as c; print(c.worker_send_task_events, c.task_send_sent_event)"


@pytest.mark.parametrize(("value", "expected"), [(None, "True True"), ("0", "False False"), ("1", "True True")])
def test_task_events_follow_the_setting(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "FENCED_TASK_EVENTS"}
    if value is not None:
        env["FENCED_TASK_EVENTS"] = value
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == expected
