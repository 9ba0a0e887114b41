"""Named fault-injection points for tests and chaos runs; inert unless FENCED_FAULTS_ENABLED is set.

A test arms a point in Redis (`arm("after_model_call", action=...)`); the next worker to pass it records
the hit and then hangs (`hang`, the default: the test SIGKILLs the process group), kills its own
process group (`kill`), or freezes its own process group (`stop`: a zombie in the making; the test
sends SIGCONT after someone else took over).
"""

from __future__ import annotations

import os
import signal
import time

import structlog

from fenced_core.settings import get_settings
from fencing import keys, scripts
from fencing.connection import get_redis
from fencing.scripts import scripts_for

POINTS = (
    "after_model_call",  # the model answered, checkpoint A not written
    "before_checkpoint_a",  # the decision's event is out, checkpoint A not written: the DB fence is next
    "in_tool",  # a tool call's tool_started event is out, the tool runs next (chaos kills "tools" here)
    "after_tools",  # every tool returned and the lease-lost check passed, checkpoint B not written
    "before_ending",  # the terminal transaction committed; slot, lease and final event not given back yet
    "after_terminal_write",  # the terminal transaction committed, its ending sent, the message not acked
    "before_effect",  # a holder is about to perform an effect (add-to-cart): its fenced transaction is next
    "in_confirm",  # a confirm inserted its order; the card update and the commit are next (run_id: the card's)
)
log = structlog.get_logger("fencing.faults")


def point(name: str, run_id: str) -> None:
    """Pass fault point `name`; fires only if armed and faults are enabled in this process."""
    if not get_settings().faults_enabled:
        return
    client = get_redis()
    fired = scripts_for(client)(scripts.fault_hit(point=name, hit=f"{name} {run_id} {os.getpid()}"))
    if not fired:
        return
    action = client.hget(keys.FAULTS, f"{name}:action") or "hang"
    log.warning("fault_point_fired", point=name, run_id=run_id, pid=os.getpid(), action=action)
    if action == "kill":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    elif action == "stop":
        _stop_group_then_self()
        return  # here after SIGCONT, and goes on writing
    # hang: this thread alone stops (a tool or HTTP call with no timeout); the process stays alive.
    time.sleep(float(client.hget(keys.FAULTS, f"{name}:hang_s") or 3600))


def _stop_group_then_self() -> None:
    """Freeze this process group (a prefork parent and its children too), this thread last.

    The others first, then this thread by a signal sent to itself, which stops it before the call returns.
    Two earlier orders failed: a stop sent to the group reached this thread only some ms later (it
    committed the very write the point stands before), and the group's stop followed by one to this
    thread stopped the process twice when the first landed between the two: the test's SIGCONT then
    woke it only into the second stop."""
    me, group = os.getpid(), os.getpgid(0)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getpgid(int(entry)) == group:
                    os.kill(int(entry), signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                pass
    # raise(3): to the calling OS thread, as pthread_kill(pthread_self()) would be. Not threading.get_ident(),
    # which a gevent worker's patching turns into a greenlet's id (that stop hit no thread: the step ran on).
    signal.raise_signal(signal.SIGSTOP)


def next_hit(timeout_s: float) -> tuple[str, str, int] | None:
    """Wait for the next fired point: (point, run_id, pid), or None. Polls: the shared client has a
    5 s socket timeout, shorter than the waits tests need."""
    client = get_redis()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        hit = client.lpop(keys.FAULT_HITS)
        if hit:
            point, run_id, pid = str(hit).split()
            return point, run_id, int(pid)
        time.sleep(0.02)
    return None


def arm(name: str, times: int = 1, action: str = "hang", hang_s: float = 3600) -> None:
    """Make the next `times` passes of point `name` fire `action` (hang, kill or stop); a hang lasts
    `hang_s` seconds, then the thread goes on (and finds itself fenced out if it was taken over)."""
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {', '.join(POINTS)}")
    if action not in ("hang", "kill", "stop"):
        raise ValueError(f"unknown fault action {action!r}")
    get_redis().hset(keys.FAULTS, mapping={name: times, f"{name}:action": action, f"{name}:hang_s": hang_s})
