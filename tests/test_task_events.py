"""Worker configuration from the settings: FENCED_TASK_EVENTS (Celery task events, on by default for
Flower) and the default concurrency per pool (FENCED_CONCURRENCY unset)."""

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


CONCURRENCY_PROBE = ("import sys; sys.argv = ['celery'] + sys.argv[1:]; import celeryconfig as c; "
                     "print(c.worker_concurrency)")


@pytest.mark.parametrize(("argv", "value", "expected"), [
    ((), None, "64"),  # the threads pool, FENCED_CONCURRENCY unset: one thread per run waiting on its model
    (("--pool", "prefork"), None, "None"),  # prefork: Celery's own default (a process per CPU), never 64 processes
    (("-P", "gevent"), None, "64"),
    ((), "8", "8"),
    (("--pool", "prefork"), "3", "3"),
])
def test_worker_concurrency_defaults_by_pool(argv, value, expected):
    env = {k: v for k, v in os.environ.items() if k != "FENCED_CONCURRENCY"}
    if value is not None:
        env["FENCED_CONCURRENCY"] = value
    out = subprocess.run([sys.executable, "-c", CONCURRENCY_PROBE, *argv], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == expected
