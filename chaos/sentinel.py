"""Chaos through Redis Sentinel: the local deployment of scripts/redis-sentinel.sh, and pointing this
process (and the workers it starts, which inherit its environment) at it.

`use_local_sentinel()` must run before anything reads the settings or builds the Celery app (`fenced
chaos --sentinel` calls it first): fenced's Redis becomes `redis+sentinel://…` and the broker kombu's
`sentinel://…;…` with FENCED_BROKER_MASTER_NAME, both on the same monitored master.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

import redis

from fenced_core.errors import ConfigError
from fenced_core.settings import SENTINEL_SCHEME, get_settings
from fencing.sentinel import BROKER_SCHEME, SentinelTarget, master_address, parse_url
from harness.workers import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "redis-sentinel.sh"


def local_urls() -> dict[str, str]:
    """The FENCED_* variables that point at the local deployment (`redis-sentinel.sh urls`)."""
    out = subprocess.run(["bash", str(SCRIPT), "urls"], check=True, capture_output=True, text=True).stdout
    env = {}
    for line in out.splitlines():
        name, _, value = line.partition("=")
        env[name] = value.strip("'")
    return env


def start_local() -> str:
    """Start the local deployment (or leave it running); returns the script's last line."""
    done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise RuntimeError(f"scripts/redis-sentinel.sh start failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def use_local_sentinel() -> dict[str, str]:
    """Start the local deployment and point this process's settings (and its future workers) at it."""
    start_local()
    env = local_urls()
    os.environ.update(env)
    get_settings.cache_clear()
    from fencing import connection

    connection.reset()
    return env


def through_sentinel() -> bool:
    """Do fenced's Redis and the broker both go through Sentinel in this process's settings?"""
    s = get_settings()
    return s.redis_url.startswith(SENTINEL_SCHEME) and s.effective_broker_url.startswith(BROKER_SCHEME)


@dataclass
class Failover:
    """One SIGKILL of the master and what the sentinels did about it."""

    old: tuple[str, int]
    pid: int
    killed_ms: float
    new: tuple[str, int] | None = None
    promoted_ms: float | None = None  # when a sentinel first reported the new master answering as one

    @property
    def happened(self) -> bool:
        return self.new is not None and self.new != self.old


class SentinelNode:
    """The Sentinel-managed Redis fenced's settings name: who is master, kill it, bring it back."""

    def __init__(self, target: SentinelTarget | None = None) -> None:
        url = get_settings().redis_url
        if target is None and not url.startswith(SENTINEL_SCHEME):
            raise ConfigError(f"fenced's Redis is not behind Sentinel (FENCED_REDIS_URL={url!r}): run `fenced chaos "
                              f"--sentinel`, or point FENCED_REDIS_URL at {SENTINEL_SCHEME}HOST:PORT,…/MASTER/DB")
        self.target = target or parse_url(url)

    def master(self) -> tuple[str, int] | None:
        return master_address(self.target)

    def kill_master(self) -> Failover:
        """SIGKILL the master's process (it must run on this machine: its pid from INFO server)."""
        old = self.master()
        if old is None:
            raise RuntimeError("no sentinel names a master")
        with redis.Redis(*old, socket_timeout=2, decode_responses=True) as client:
            pid = int(client.info("server")["process_id"])
        killed_ms = time.time() * 1000
        os.kill(pid, signal.SIGKILL)
        return Failover(old, pid, killed_ms)

    def wait_promoted(self, failover: Failover, timeout_s: float = 30) -> Failover:
        """Wait until a sentinel names another master that answers with role:master."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            addr = self.master()
            if addr is not None and addr != failover.old and _is_master(addr):
                failover.new, failover.promoted_ms = addr, time.time() * 1000
                return failover
            time.sleep(0.05)
        return failover

    def restore(self) -> str | None:
        """Bring the killed server back as a replica (the local deployment only); what the script said,
        or None when this is not the local deployment."""
        local = parse_url(local_urls()["FENCED_REDIS_URL"])
        if set(local.sentinels) != set(self.target.sentinels):
            return None
        return start_local()


def _is_master(addr: tuple[str, int]) -> bool:
    try:
        with redis.Redis(*addr, socket_timeout=1, socket_connect_timeout=1, decode_responses=True) as client:
            return client.info("replication").get("role") == "master"
    except (redis.ConnectionError, redis.TimeoutError):
        return False


def pid_alive(pid: int, settle_s: float = 5.0) -> bool:
    """Is `pid` still running? A killed daemon lingers as a zombie until its adoptive parent reaps it: a
    zombie is dead. Waits up to `settle_s` for a process being killed to go."""
    deadline = time.monotonic() + settle_s
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
        if state in ("Z", "X"):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)
