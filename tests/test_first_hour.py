"""A user's first hour (issue 16, the parts done): the real `fenced` and `celery` commands with real
environment variables: bad settings, bracketed data, a store without schema, stores that are down."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import MYSQL_URL, REDIS_URL

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def fenced(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`fenced ARGS` with `env` added to this process's environment (and the test Redis), within 60 s."""
    return subprocess.run([str(BIN / "fenced"), *args], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "FENCED_REDIS_URL": REDIS_URL, **env})


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


BAD_SETTINGS = [
    ("FENCED_DB_URL", "postgres://u@h/db", "PostgreSQL is not a supported run store"),
    ("FENCED_DB_URL", "postgresql://u@h/db?bogus=1", "PostgreSQL is not a supported run store"),
    ("FENCED_DB_URL", "mysql://root@127.0.0.1/db", "mysql+pymysql://"),
    ("FENCED_DB_URL", "bogus", "sqlite:///PATH"),
    ("FENCED_REDIS_URL", "http://127.0.0.1:6379", "redis://"),
    ("FENCED_LEASE_TTL_MS", "0", "greater than 0"),
    ("FENCED_LEASE_TTL_MS", "-5", "greater than 0"),
    ("FENCED_LEASE_TTL_MS", "abc", "valid integer"),
    ("FENCED_CONCURRENCY", "0", "greater than 0"),
    ("FENCED_RETRY_BUDGET", "-1", "greater than or equal to 0"),
    ("FENCED_FAST_TAKEOVER", "maybe", "valid boolean"),
    ("FENCED_MODEL", "antropic", "'stub' or 'openai'"),
]


@pytest.mark.parametrize(("var", "value", "accepted"), BAD_SETTINGS)
def test_a_bad_setting_is_one_line_naming_the_variable_and_what_is_accepted(var, value, accepted):
    proc = fenced("runs", **{var: value})
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert f"{var}={value!r}" in line and accepted in line, line


def test_a_worker_with_a_bad_setting_says_so_in_one_line():
    proc = subprocess.run([str(BIN / "celery"), "-A", "tasks", "worker"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "FENCED_LEASE_TTL_MS": "0"})
    assert proc.returncode == 2
    assert "FENCED_LEASE_TTL_MS='0'" in one_line_error(proc)


def test_version():
    proc = fenced("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("fenced ")


def test_bracketed_user_and_model_text_is_printed_literally(tmp_path, redis_client):
    db = {"FENCED_DB_URL": f"sqlite:///{tmp_path / 'store.db'}"}
    user, query = "[/x]", "buy [bold]socks[/bold] [terminal]"
    submitted = fenced("submit", query, "--user", user, **db)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    cancelled = fenced("cancel", run_id, "--user", user, **db)
    assert cancelled.returncode == 0, cancelled.stderr
    for command in ("ledger", "status"):
        shown = fenced(command, run_id, **db)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert user in shown.stdout, shown.stdout
    runs = fenced("runs", **db)
    assert query in runs.stdout.replace("\n", " ") or "[bold]socks[/bold]" in runs.stdout, runs.stdout


def test_the_embedded_store_makes_its_own_schema(tmp_path, redis_client):
    proc = fenced("submit", "buy a hat", "--user", "u1", FENCED_DB_URL=f"sqlite:///{tmp_path / 'new.db'}")
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip()) == 36


def test_a_database_without_schema_says_run_migrate_at_once(redis_client):
    import sqlalchemy as sa

    server = MYSQL_URL.rsplit("/", 1)[0]
    with sa.create_engine(server + "/").connect() as conn:
        conn.exec_driver_sql("DROP DATABASE IF EXISTS fenced_no_schema")
        conn.exec_driver_sql("CREATE DATABASE fenced_no_schema")
    started = time.monotonic()
    proc = fenced("submit", "buy a hat", FENCED_DB_URL=server + "/fenced_no_schema")
    assert proc.returncode == 2
    assert "fenced migrate" in one_line_error(proc)
    assert time.monotonic() - started < 30, "a missing schema is not a transient error"
    assert redis_client.zcard("fenced:{admission}:user:cli") == 0, "the refused submit holds no admission slot"


def test_a_database_that_is_down_fails_after_a_short_retry_with_one_line(tmp_path, redis_client):
    started = time.monotonic()
    proc = fenced("submit", "buy a hat", FENCED_DB_URL="mysql+pymysql://root@127.0.0.1:1/nothing")
    assert proc.returncode == 1
    notice, error = [line for line in proc.stderr.splitlines() if line.strip()]
    assert notice.startswith("waiting for the run store (retrying for up to 5 s)"), proc.stderr
    took = time.monotonic() - started
    said = re.match(r"error: run store unreachable after (\d+) s of retries: ", error)
    assert said, proc.stderr
    assert 5 <= int(said[1]) <= took + 1, (said[1], took)  # at least the window; never more than it took
    assert took < 40, "the CLI does not wait a worker's minute"


def test_a_sqlite_file_that_cannot_be_opened_fails_naming_the_url(tmp_path, redis_client):
    """A SQLite path whose directory does not exist: one line naming the store and FENCED_DB_URL."""
    url = f"sqlite:///{tmp_path / 'no_such_dir' / 'runs.db'}"
    proc = fenced("submit", "[red]buy a hat[/red]", FENCED_DB_URL=url)
    assert proc.returncode == 1
    assert one_line_error(proc) == (f"error: the run store {url} failed: unable to open database file "
                                    "(check FENCED_DB_URL)")
    assert redis_client.zcard("fenced:{admission}:user:cli") == 0, "the refused submit holds no admission slot"


@pytest.mark.parametrize("url_part, said", [("nobody:wrong@{hostport}/test", "Access denied for user 'nobody'"),
                                             ("{userhost}/fenced_no_such_db", "Unknown database 'fenced_no_such_db'")])
def test_wrong_database_settings_fail_at_once_naming_the_url(url_part, said, redis_client, tmp_path):
    """A wrong user, password or database name is no outage: no retry window ("unreachable after 5 s of
    retries" it used to say), one line naming the store (password masked) and FENCED_DB_URL; and a worker
    given it refuses to start instead of failing every delivery."""
    from sqlalchemy.engine import make_url

    server = make_url(MYSQL_URL)
    url = f"{server.drivername}://" + url_part.format(hostport=f"{server.host}:{server.port or 3306}",
                                                     userhost=f"{server.username}@{server.host}:{server.port or 3306}")
    started = time.monotonic()
    proc = fenced("submit", "buy a hat", FENCED_DB_URL=url)
    assert proc.returncode == 2, proc.stderr
    error = one_line_error(proc)
    assert error.startswith("error: the run store ") and said in error and "(check FENCED_DB_URL)" in error
    assert "wrong" not in error, "the password is masked"
    assert time.monotonic() - started < 5, "not retried"
    assert redis_client.zcard("fenced:{admission}:user:cli") == 0, "the refused submit holds no admission slot"

    from harness.workers import WorkerProcess

    worker = WorkerProcess("refused", log_path=tmp_path / "w.log", concurrency=1)
    worker.env["FENCED_DB_URL"] = url
    worker.start(wait_ready=False)
    assert worker.proc is not None
    try:
        assert worker.proc.wait(60) != 0
    finally:
        worker.stop()
    logs = worker.logs()
    assert "fenced worker refuses to start: the run store " in logs and said in logs, logs[-2000:]
    assert "ready." not in logs, "it consumed nothing"


def test_a_locked_sqlite_file_fails_saying_how_long_it_really_waited(tmp_path, redis_client):
    """Each attempt on a locked SQLite file waits its busy timeout (5 s) before failing, so the CLI's
    5 s retry window ends after two of them: the message says the ~10 s it took, not the window. Reading
    the schema's revision first does not wait for the write lock (it used to, then took the store for an
    unversioned one and waited again in Alembic, failing with no retry at all)."""
    import sqlite3

    db = tmp_path / "store.db"
    assert fenced("migrate", FENCED_DB_URL=f"sqlite:///{db}").returncode == 0
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock all along
    try:
        started = time.monotonic()
        proc = fenced("submit", "buy a hat", "--user", "u1", FENCED_DB_URL=f"sqlite:///{db}")
        took = time.monotonic() - started
    finally:
        holder.rollback()
        holder.close()
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    notice, error = [line for line in proc.stderr.splitlines() if line.strip()]
    assert notice.startswith("waiting for the run store (retrying for up to 5 s, each try waiting up to 5 s "
                             "for the write lock)"), proc.stderr
    said = re.match(r"error: run store unreachable after (\d+) s of retries: database is locked$", error)
    assert said, proc.stderr
    assert took - 2 <= int(said[1]) <= took + 1, (said[1], took)
    assert took > 7, "two attempts of a 5 s busy timeout: the window alone would understate this"
    runs = fenced("runs", "--json", FENCED_DB_URL=f"sqlite:///{db}")
    assert runs.stdout.strip() in ("[]", ""), "the refused submit wrote nothing"


def test_redis_down_says_redis_is_unreachable_and_writes_nothing(tmp_path):
    """An outage exits 1 (retry later), whichever step meets it first: admission on an empty store, the
    epoch check once the store holds an unfinished run (it exited 2 on the one and 1 on the other)."""
    db = f"sqlite:///{tmp_path / 'store.db'}"
    down = "redis://:secret@127.0.0.1:1/0"
    proc = fenced("submit", "buy a hat", FENCED_DB_URL=db, FENCED_REDIS_URL=down)
    assert proc.returncode == 1
    line = one_line_error(proc)
    assert "Redis is unreachable at redis://:***@127.0.0.1:1/0" in line and "nothing was written" in line
    runs = fenced("runs", "--json", FENCED_DB_URL=db)
    assert runs.stdout.strip() in ("[]", ""), runs.stdout
    assert fenced("submit", "buy a coat", FENCED_DB_URL=db).returncode == 0  # an unfinished run in the store
    proc = fenced("submit", "buy a hat", FENCED_DB_URL=db, FENCED_REDIS_URL=down)
    assert proc.returncode == 1
    assert one_line_error(proc).startswith("error: Redis unreachable at redis://:***@127.0.0.1:1/0: "), proc.stderr
    assert len(json.loads(fenced("runs", "--json", FENCED_DB_URL=db).stdout)) == 1, "the second refusal wrote nothing"


@pytest.mark.parametrize(("args", "pool"), [((), "thread"), (("--pool", "prefork"), "prefork")])
def test_celery_worker_runs_the_pool_the_readme_says(args, pool, redis_client):
    """`celery -A tasks worker` with no flags runs the threads pool; an explicit `--pool prefork` is kept
    (Celery alone would replace an explicit prefork by a configured pool)."""
    proc = subprocess.Popen([str(BIN / "celery"), "-A", "tasks", "worker", *args, "-Q", "agents.continue",
                             "--without-gossip", "--without-mingle", "--without-heartbeat"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ}, start_new_session=True)
    try:
        assert proc.stdout is not None
        banner = next((line for line in proc.stdout if "concurrency:" in line), "")
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert f"({pool})" in banner, banner


def test_celery_worker_skips_mingle_without_being_told(redis_client):
    """`celery -A tasks worker` as the README gives it (no --without-mingle): fenced's app skips Celery's
    mingle (a hello that waits a full second at every start, for revoked task ids fenced never uses)."""
    proc = subprocess.Popen([str(BIN / "celery"), "-A", "tasks", "worker", "-Q", "agents.continue", "-l", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ}, start_new_session=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "ready." in line:
                break
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert any("ready." in line for line in seen), "".join(seen)
    assert not any("mingle" in line for line in seen), "".join(seen)


@pytest.mark.chaos
def test_a_result_handle_and_a_followed_stream(workers):
    """`wait` blocks until the run ends and returns its answer; `fenced events RUN --follow` prints each
    event once as it comes and stops at the final event; AsyncResult has no result to give."""
    from tasks import result, submit_run, wait

    workers.start("a")
    run_id = submit_run("u-follow", "buy headphones")
    follower = subprocess.Popen([str(BIN / "fenced"), "events", run_id, "--follow"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ})
    done = wait(run_id, timeout_s=60)
    assert done.state == "done" and done.answer and done.ended
    assert result(run_id) == done
    out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    lines = out.splitlines()
    assert lines[-1].split()[6] == "run_done" and sum(" run_done " in line for line in lines) == 1, out
    assert sum(" step_done " in line for line in lines) == 3, out
    with pytest.raises(TimeoutError):
        wait(submit_run("u-follow", "buy socks"), timeout_s=0.01, poll_s=0.01)


def test_fenced_flower_serves_its_api_on_localhost_and_refuses_to_expose_itself_without_auth(redis_client):
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(BIN / "fenced"), "flower", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ}, start_new_session=True)
    try:
        status = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/workers", timeout=2) as resp:
                    status = resp.status
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200, "Flower's API answers local callers"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    exposed = fenced("flower", "--address", "0.0.0.0")
    assert exposed.returncode == 2 and "--basic-auth" in one_line_error(exposed)


def test_the_stubs_test_markers_are_dead_outside_tests_and_chaos(settings_env):
    """A deployed stub (no FENCED_FAULTS_ENABLED) treats "[poison]" as text, not as an order to die."""
    from examples.shopping.stub import StubModel
    from fenced_agents.model import AgentContext

    settings_env(faults_enabled=0, stub_step_ms=0, stub_count_paid=0)
    history = [{"step": 0, "tool_calls": [{"id": "c0", "name": "item_search"}],
                "results": {"c0": [{"id": "sku-001"}, {"id": "sku-002"}]}}]
    ctx = AgentContext("r-markers", "buy [poison] [terminal] [ask] [transient:9] shoes", "normal", 1, history)
    decision = StubModel().decide(ctx)  # alive: no SIGKILL, no TerminalError, no TransientError
    assert [c.name for c in decision.tool_calls] == ["compare"], "no ask_user either"


def test_a_query_over_the_limit_is_refused_and_the_cli_reads_stdin(tmp_path, redis_client, mysql_store):
    from checkpoints import runs
    from fenced_core.errors import InvalidRequest
    from tasks import submit_run

    with pytest.raises(InvalidRequest, match="FENCED_MAX_QUERY_CHARS"):
        submit_run("u-big", "x" * 1_000_000)
    assert runs.list_runs() == [], "nothing written"
    assert redis_client.zcard("fenced:{admission}:user:u-big") == 0
    db = {"FENCED_DB_URL": f"sqlite:///{tmp_path / 'store.db'}"}
    big = subprocess.run([str(BIN / "fenced"), "submit", "-"], input="y" * 20_000, capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "FENCED_REDIS_URL": REDIS_URL, **db}, timeout=60)
    assert big.returncode == 2 and "the limit is 16000" in one_line_error(big)
    env = {**os.environ, "FENCED_REDIS_URL": REDIS_URL, **db}
    ok = subprocess.run([str(BIN / "fenced"), "submit", "-", "--user", "u-stdin"], input="buy [a] hat\n",
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr
    shown = fenced("status", ok.stdout.strip(), **db)
    assert "buy [a] hat" in shown.stdout


def test_the_dead_letter_case_file_is_consistent(mysql_store):
    """`dlq show` counted every delivery of the run beside "claimed 3 times", showed the delivery that
    dead-lettered as died, and a run replayed then cancelled stayed in `dlq list`."""
    from checkpoints import lifecycle, runs
    from checkpoints.db import in_txn
    from tasks.control import cancel_run, replay_dead_letter

    run_id = runs.new_run_id()
    in_txn(runs.create_run_txn, run_id, "u-dlq", "normal", "buy a lamp", "test")
    claims = [runs.claim(run_id, f"w/{i}") for i in range(4)]
    last = claims[-1]
    assert last is not None and last.deliveries == 4
    runs.dead_letter(last, "step 0 claimed 3 times without finishing", {})
    case = lifecycle.dead_letter(run_id)
    assert [a["outcome"] for a in case.attempts][-1] == "dead", "the dead-lettering delivery says so"
    assert sum(a["step"] == case.step for a in case.attempts) == 4
    assert [d.run_id for d in lifecycle.dead_letters_list()] == [run_id]
    replay_dead_letter(run_id, "ops")
    cancel_run(run_id, "ops")
    assert lifecycle.dead_letters_list() == [], "replayed then cancelled: no longer a dead letter"
    assert [d.run_id for d in lifecycle.dead_letters_list(include_revived=True)] == [run_id]


@pytest.mark.chaos
def test_flower_shows_the_delivery_that_failed_a_run_as_failure(workers, redis_client):
    """A run that failed showed as SUCCESS in Flower; the delivery that ends a run failed (or dead) is
    now a FAILURE there, and Celery does not retry it (the run row already says how it ended)."""
    import json as json_mod
    import socket
    import urllib.request

    from tasks import submit_run, wait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flower = subprocess.Popen([str(BIN / "fenced"), "flower", "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=ROOT, env={**os.environ}, start_new_session=True)
    try:
        def tasks_in(state: str) -> dict:
            url = f"http://127.0.0.1:{port}/api/tasks?state={state}"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json_mod.loads(resp.read())

        for _ in range(100):
            try:
                tasks_in("FAILURE")
                break
            except OSError:
                time.sleep(0.2)
        workers.start("a")
        failed = submit_run("u-flower", "buy a lamp [terminal]")
        fine = submit_run("u-flower", "buy a lamp")
        assert wait(failed, 60).state == "failed" and wait(fine, 60).state == "done"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            failures = [t for t in tasks_in("FAILURE").values() if failed in str(t.get("args"))]
            if failures:
                break
            time.sleep(0.3)
        assert len(failures) == 1 and "RunEnded" in str(failures[0].get("exception")), failures
        assert not [t for t in tasks_in("FAILURE").values() if fine in str(t.get("args"))]
        assert not [t for t in tasks_in("RETRY").values() if failed in str(t.get("args"))]
    finally:
        os.killpg(flower.pid, 9)
        flower.wait()


@pytest.mark.chaos
def test_the_ledger_names_workers_as_people_know_them(workers):
    """Actors as Celery node names with the pid; times say UTC; the resume point in words."""
    from tasks import submit_run, wait

    workers.start("a")
    run_id = submit_run("u-ledger", "buy headphones")
    assert wait(run_id, 60).state == "done"
    shown = fenced("ledger", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "at (UTC)" in shown.stdout
    assert f"a@{os.uname().nodename} pid {workers.workers[0].pid}" in shown.stdout, shown.stdout
    assert "after checkpoint B of step 0 (phase done): step 1 starts with its model call" in shown.stdout


@pytest.mark.chaos
def test_a_lost_model_call_and_the_rescued_epoch_are_in_the_ledger(workers):
    """A holder killed after the model answered but before checkpoint A: the takeover says that call was
    the platform's cost; the rescue names the epoch it rescued (not -1)."""
    import signal

    from checkpoints import ledger
    from fencing import faults
    from tasks import submit_run, wait

    workers.start("a", FENCED_FAST_TAKEOVER="0")
    workers.start("b", FENCED_FAST_TAKEOVER="0")
    faults.arm("before_checkpoint_a", action="hang")
    run_id = submit_run("u-lost", "buy headphones")
    hit = faults.next_hit(30)
    assert hit and hit[1] == run_id
    workers.by_pid(hit[2]).kill(signal.SIGKILL)
    assert wait(run_id, 60).state == "done"
    history = ledger.history(run_id)
    lost = [e for e in history if e.kind == "model_call_lost"]
    assert len(lost) == 1 and "platform's cost" in lost[0].reason and lost[0].detail["lost_epoch"] == 1
    rescues = [e for e in history if e.kind == "rescue"]
    assert rescues and all(e.epoch == 1 for e in rescues), [(e.epoch, e.reason) for e in rescues]
