"""The suite runs against the stores FENCED_TEST_REDIS_URL / FENCED_TEST_MYSQL_URL name, in the test process
too, not only in the workers it starts: the fixtures FLUSHALL that Redis and empty that database, so a test
process left on the defaults would wipe the Redis and database of whatever else runs on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.workers import REPO_ROOT

PROBE = """
import json
import tests.conftest
from fenced_core.settings import get_settings
from fencing.connection import get_redis
from tasks.celery_app import app

kwargs = get_redis().connection_pool.connection_kwargs
print(json.dumps({"redis_url": get_settings().redis_url, "db_url": get_settings().db_url,
                  "redis": [kwargs["host"], kwargs["port"], kwargs["db"]], "broker": app.conf.broker_url}))
"""


def test_the_test_process_uses_the_stores_the_environment_names():
    env = {**os.environ, "FENCED_TEST_REDIS_URL": "redis://127.0.0.1:6391/3",
           "FENCED_TEST_MYSQL_URL": "mysql+pymysql://root@127.0.0.1:3306/fenced_elsewhere"}
    env.pop("FENCED_REDIS_URL", None)
    env.pop("FENCED_DB_URL", None)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"redis_url": "redis://127.0.0.1:6391/3",
                    "db_url": "mysql+pymysql://root@127.0.0.1:3306/fenced_elsewhere",
                    "redis": ["127.0.0.1", 6391, 3], "broker": "redis://127.0.0.1:6391/3"}, seen
