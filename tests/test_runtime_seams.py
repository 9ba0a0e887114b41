"""The runtime's seams: driver errors become StoreUnavailable once, at the boundary; one place ends a run;
one wake-up sender; Redis keys only inside fencing/, through one typed wrapper per Lua script."""

from __future__ import annotations

import ast
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from checkpoints import db, runs
from checkpoints.db import DatabaseUnavailable, in_txn, set_retry_window, transaction
from checkpoints.runs import Usage
from fenced_core.errors import StoreUnavailable, TerminalError
from fenced_core.settings import get_settings
from fencing import dead_letters, events, keys, reaper, scripts
from fencing.connection import RedisUnavailable, client_for
from fencing.lease import Lease, now_ms
from tasks import endings, hooks, queues, submit_run, wakeup
from tasks.celery_app import RUN_TASK
from tasks.delivery import deliver
from tasks.step import StepRunner

ROOT = Path(__file__).resolve().parents[1]
DEAD_MYSQL = "mysql+pymysql://root@127.0.0.1:3399/nowhere"


@pytest.fixture
def short_retries() -> Any:
    set_retry_window(0.3)
    yield
    db._retry_window_s = None


def claimed(query: str = "buy headphones") -> tuple[runs.Claim, Lease]:
    run_id = submit_run("u1", query)
    lease = Lease(run_id, get_settings().lease_ttl_ms)
    assert lease.acquire(None)
    c = runs.claim(run_id, lease.token)
    assert c is not None
    lease.epoch = c.epoch
    return c, lease


def slots(client: Any, user: str = "u1") -> list[str]:
    return list(client.zrange(keys.user_slots(user), 0, -1))


# -- StoreUnavailable at the boundary ----------------------------------------------------------------------
def test_a_database_outage_leaves_the_boundary_as_store_unavailable(mysql_store, short_retries):
    with pytest.raises(StoreUnavailable) as caught, transaction(DEAD_MYSQL) as conn:
        conn.execute(sa.text("SELECT 1"))
    assert isinstance(caught.value, DatabaseUnavailable) and isinstance(caught.value, sa.exc.OperationalError)
    assert isinstance(caught.value.__cause__, sa.exc.OperationalError), "the driver's error is kept as the cause"
    attempts: list[int] = []

    def txn(conn: Any) -> None:
        attempts.append(1)
        raise DatabaseUnavailable(sa.exc.OperationalError("SELECT 1", {}, Exception("gone")))

    with pytest.raises(StoreUnavailable):
        in_txn(txn)
    assert len(attempts) > 1, "db_retry still retries a store outage inside checkpoints"


def test_errors_that_waiting_cannot_fix_are_not_translated(tmp_path, mysql_store):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(sa.exc.OperationalError) as caught, transaction(url) as conn:
        conn.execute(sa.text("SELECT * FROM run_checkpoints"))  # no schema: `fenced migrate`, not a retry
    assert not isinstance(caught.value, StoreUnavailable)
    with pytest.raises(ZeroDivisionError), transaction() as conn:
        conn.execute(sa.text("SELECT 1"))
        raise ZeroDivisionError  # the caller's own error passes through untouched
    db.dispose_all()


def test_a_redis_outage_leaves_every_client_call_as_store_unavailable():
    dead = client_for("redis://127.0.0.1:6399/0", socket_connect_timeout=0.3)
    for call in (lambda: dead.get("x"), lambda: dead.pipeline().get("x").execute(),
                 lambda: scripts.scripts_for(dead)(scripts.raise_epoch("r", epoch=1))):
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert isinstance(caught.value, RedisUnavailable) and isinstance(caught.value, redis.ConnectionError)


def test_a_step_counts_a_store_outage_as_transient(mysql_store):
    c, lease = claimed()
    runner = StepRunner(c, lease)
    failures = [DatabaseUnavailable(sa.exc.OperationalError("x", {}, Exception("down"))), RedisUnavailable("down")]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    assert runner.with_retries("tool", flaky) == "ok" and failures == []
    with pytest.raises(TerminalError):
        runner.with_retries("tool", lambda: 1 / 0)


def test_a_delivery_that_meets_a_store_outage_lets_go_and_is_rescued(mysql_store, redis_client, monkeypatch):
    run_id = submit_run("u1", "buy headphones")

    def down(*_: Any, **__: Any) -> None:
        raise DatabaseUnavailable(sa.exc.OperationalError("claim", {}, Exception("server has gone away")))

    monkeypatch.setattr(runs, "claim_or_row", down)  # the delivery's claim
    assert deliver(run_id, 0, lambda *_: None) == "store_unavailable"
    assert not redis_client.exists(keys.lease(run_id)), "the lease is let go"
    entries = redis_client.zrange(keys.lease_index(run_id), 0, -1, withscores=True)
    assert [m for m, score in entries if keys.index_run_id(m) == run_id and score <= now_ms()], entries
    monkeypatch.undo()
    sent: list[str] = []
    assert reaper.reap(sent.append, get_settings().lease_ttl_ms) == [run_id] and sent == [run_id]


# -- one place ends a run ----------------------------------------------------------------------------------
class Recorder(hooks.Hooks):
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def on_dead_letter(self, run_id: str, epoch: int, step: int, reason: str) -> None:
        self.calls.append(("on_dead_letter", run_id, epoch))

    def on_finished(self, run_id: str, epoch: int, state: str, data: dict[str, Any]) -> None:
        self.calls.append((f"on_finished:{state}", run_id, epoch))


@pytest.fixture
def recorder() -> Any:
    r = hooks.add_hooks(Recorder())
    yield r
    hooks.remove_hooks(r)


def test_a_dead_letter_ends_the_run_once_everywhere(mysql_store, redis_client, recorder):
    c, _lease = claimed()
    run_id = c.run.run_id
    assert slots(redis_client) == [run_id]
    endings.dead_letter(c, "poison", {"note": "x"})
    assert runs.get_run(run_id).state == "dead"
    assert slots(redis_client) == [], "the slot went back"
    assert events.newest_eid(run_id) == "run:dead"
    assert dead_letters.newest(1)[0]["run_id"] == run_id
    assert recorder.calls == [("on_dead_letter", run_id, c.epoch)]


def test_a_lost_final_event_is_repaired_once_by_the_next_delivery(mysql_store, redis_client, recorder):
    c, _lease = claimed()
    run_id = c.run.run_id
    runs.finish(c, "done", {}, Usage(), "", answer="ok")  # the holder died here: no event, slot held
    assert slots(redis_client) == [run_id]
    for _ in range(2):
        assert deliver(run_id, None, lambda *_: None) == "skipped"
    finals = [e for e in events.read(run_id) if e.eid == "run:done"]
    assert len(finals) == 1 and finals[0].data == {"answer": "ok", "repaired": True}
    assert slots(redis_client) == []
    assert recorder.calls == [], "a repair does not call the hooks again"


def test_a_finish_and_a_cancel_call_on_finished_after_their_commit(mysql_store, redis_client, recorder):
    from tasks.control import cancel_run

    c, lease = claimed()
    StepRunner(c, lease).finish(None, "the answer")
    assert events.newest_eid(c.run.run_id) == "run:done" and slots(redis_client) == []
    other = submit_run("u1", "buy a lamp")
    result = cancel_run(other, "u1")
    cancel_run(other, "u1")  # a second click: follow-ups again, the hook not
    assert recorder.calls == [("on_finished:done", c.run.run_id, c.epoch),
                              ("on_finished:cancelled", other, result.epoch)]


# -- one wake-up sender --------------------------------------------------------------------------------------
def test_the_one_sender_picks_the_queue_by_reason(mysql_store, redis_client):
    wakeup.send("r-first", None, "submit", kind="large")
    wakeup.send("r-next", 3, "continuation")
    wakeup.rescue("r-lost")
    first = json.loads(redis_client.lindex(keys.broker_queue(queues.LARGE), 0))
    assert first["headers"]["id"] == "r-first", "a first wake-up's task id is the run id"
    bodies = [json.loads(m) for m in redis_client.lrange(keys.broker_queue(queues.CONTINUE), 0, -1)]
    assert sorted(b["headers"]["argsrepr"] for b in bodies) == ["('r-lost', None)", "('r-next', 3)"]
    with pytest.raises(ValueError, match="unknown wake-up reason"):
        wakeup.send("r", 0, "whim")  # type: ignore[arg-type]


def test_a_batch_sends_its_wake_ups_together_when_it_ends(mysql_store, redis_client):
    """wakeup.batch: nothing reaches the queue inside the block; every wake-up does when it ends (one
    broker round trip), each as the same message the one-by-one send builds."""
    queue = keys.broker_queue(queues.CONTINUE)
    with wakeup.batch():
        for i in range(300):
            wakeup.rescue(f"r-{i}")
        with wakeup.batch():  # nested: joins the outer block
            wakeup.send("r-next", 3, "continuation")
        assert redis_client.llen(queue) == 0, "a batched wake-up went out before its block ended"
    bodies = [json.loads(m) for m in redis_client.lrange(queue, 0, -1)]
    assert sorted(b["headers"]["argsrepr"] for b in bodies) == sorted(
        [f"('r-{i}', None)" for i in range(300)] + ["('r-next', 3)"])
    assert all(b["headers"]["task"] == RUN_TASK for b in bodies)


def _taken_in_order(redis_client, queue: str) -> list[str]:
    """The argsrepr of every message in `queue`, in the order kombu's consumer (BRPOP) takes them."""
    taken = []
    while (raw := redis_client.rpop(queue)) is not None:
        taken.append(json.loads(raw)["headers"]["argsrepr"])
    return taken


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batched"])
def test_a_rescue_is_taken_before_the_wake_ups_already_waiting(mysql_store, redis_client, batched):
    """tasks/kombu_front_of_queue.py: a rescued run's wake-up goes to the consuming end of the
    continuation list (a dead holder's runs do not wait behind every handover); the rest keep their
    order, and the rescue is the same message as any other wake-up but for its header."""
    from tasks.kombu_front_of_queue import HEADER

    queue = keys.broker_queue(queues.CONTINUE)
    with wakeup.batch() if batched else contextlib.nullcontext():
        wakeup.send("r-a", 3, "continuation")
        wakeup.send("r-b", 5, "continuation")
        wakeup.rescue("r-lost")
        wakeup.send("r-c", 2, "reply")
        wakeup.rescue("r-lost-too")
    raw = {json.loads(m)["headers"]["argsrepr"]: json.loads(m) for m in redis_client.lrange(queue, 0, -1)}
    assert raw["('r-lost', None)"]["headers"][HEADER] is True
    assert HEADER not in raw["('r-a', 3)"]["headers"]
    assert raw["('r-lost', None)"]["headers"]["task"] == raw["('r-a', 3)"]["headers"]["task"] == RUN_TASK
    assert _taken_in_order(redis_client, queue) == [
        "('r-lost-too', None)", "('r-lost', None)", "('r-a', 3)", "('r-b', 5)", "('r-c', 2)"]


def test_a_batch_left_by_an_exception_sends_nothing_of_it(mysql_store, redis_client):
    with pytest.raises(RuntimeError), wakeup.batch():
        wakeup.rescue("r-buffered")
        raise RuntimeError("the tick failed before its end")
    assert redis_client.llen(keys.broker_queue(queues.CONTINUE)) == 0
    wakeup.rescue("r-after")  # the thread's next send is not caught in the dead batch
    assert redis_client.llen(keys.broker_queue(queues.CONTINUE)) == 1


def test_a_liveness_tick_sends_its_rescues_in_one_batch(mysql_store, redis_client):
    """The bootstep's tick wrapper: a tick's wake-ups go out when it ends, and a failed tick is logged."""
    from tasks.bootsteps import _guarded

    queue = keys.broker_queue(queues.CONTINUE)
    seen: list[int] = []

    def tick() -> None:
        for i in range(5):
            wakeup.rescue(f"t-{i}")
        seen.append(redis_client.llen(queue))

    _guarded("reaper", tick)()
    assert seen == [0] and redis_client.llen(queue) == 5

    def failing() -> None:
        wakeup.rescue("t-lost")
        raise RuntimeError("boom")

    _guarded("reaper", failing)()  # logged, not raised
    assert redis_client.llen(queue) == 5


# -- Redis keys only inside fencing/, one typed wrapper per script ------------------------------------------
def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_tasks_and_routing_never_touch_redis_keys_or_the_client():
    paths = sorted((ROOT / "tasks").glob("*.py")) + sorted((ROOT / "routing").glob("*.py"))
    for path in paths:
        # tasks/kombu_*.py patch kombu's Redis transport (the broker's client, not fenced's keys)
        patch = path.name.startswith("kombu_")
        banned = ("fencing.keys", "fencing.connection.get_redis") + (() if patch else ("redis",))
        found = {n for n in _imports(path) if n in banned}
        where = f"{path.parent.name}/{path.name}"
        assert not found, f"{where} reaches into Redis itself ({found}): add a function to fencing/"


def test_every_script_has_one_typed_wrapper_and_no_call_site_names_argv():
    for name in scripts.Scripts.NAMES:
        assert callable(getattr(scripts, name, None)), f"fencing/{name}.lua has no wrapper in fencing.scripts"
    for path in sorted((ROOT / "fencing").glob("*.py")):
        if path.name == "scripts.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value in scripts.Scripts.NAMES:
                raise AssertionError(f"{path.name}:{node.lineno} runs a script by name with raw KEYS/ARGV")


def test_an_expired_run_is_ended_through_the_same_place(mysql_store, redis_client, settings_env, recorder):
    from checkpoints.schema import run_holds
    from fencing import sweeper

    settings_env(hold_expiry_s=1)
    run_id = submit_run("u1", "buy a mug")
    with transaction() as conn:
        conn.execute(run_holds.update().where(run_holds.c.run_id == run_id).values(expires_at_ms=1))
    sweeper.sweep(lambda _r: None, force=True, expired=endings.expired)
    assert runs.get_run(run_id).error_class == "expired"
    assert events.newest_eid(run_id) == "run:failed" and slots(redis_client) == []
    assert recorder.calls == [("on_finished:failed", run_id, 0)]
