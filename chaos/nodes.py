"""Test-setup nodes with pytest-celery's interface, backed by local processes instead of containers.

pytest-celery models a setup as a broker, a backend and worker nodes that can be killed, restarted
and have their logs awaited; its nodes are Docker containers, and these machines have no Docker
engine. These nodes keep that interface (`kill(signal)`, `restart()`, `logs()`, `wait_for_log()`)
over a local `celery -A tasks worker` process group, the local Redis and the local MariaDB.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from fencing.connection import client_for
from harness.workers import WorkerProcess


class WorkerNode:
    """A worker node: a real worker process group that chaos can kill, freeze and bring back."""

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path, pool: str = "threads",
                 concurrency: int = 4) -> None:
        self.name = name
        self.process = WorkerProcess(name, env=env, log_path=log_dir / f"{name}.log", pool=pool,
                                     concurrency=concurrency)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.alive

    def start(self) -> None:
        self.process.start()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the node's whole process group (SIGKILL waits until it is gone)."""
        self.process.kill(sig)

    def restart(self) -> None:
        """Bring the node back (after a kill, or a warm restart when it runs)."""
        if self.process.alive:
            self.process.stop()
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def logs(self, since: int = 0) -> str:
        """What every incarnation logged, from offset `since` (a `log_mark()`) on."""
        return self.process.logs()[since:]

    def log_mark(self) -> int:
        """Where the log ends now: `logs(since=mark)` then reads only what was logged after it."""
        return len(self.process.logs())

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        self.process.wait_for_log(text, timeout)

    def owns(self, pid: int) -> bool:
        """Is `pid` this node's worker or one of its pool children?"""
        import os

        if not self.alive or self.pid is None:
            return False
        try:
            return pid == self.pid or os.getpgid(pid) == self.pid
        except ProcessLookupError:
            return False


class RedisNode:
    """The broker and coordination store: chaos flushes it (Redis lost its data)."""

    def __init__(self, url: str) -> None:
        self.client = client_for(url)  # a plain, Sentinel or Cluster URL alike

    def flush(self) -> None:
        self.client.flushall()


class DatabaseNode:
    """The local MariaDB: chaos restarts it mid-flight (only where it runs on this machine)."""

    def available(self) -> bool:
        return shutil.which("mysqladmin") is not None and Path("/usr/sbin/mariadbd").exists()

    def restart(self, down_s: float = 3.0) -> float:
        """Stop the server, keep it down `down_s`, start it again; returns seconds until it answered."""
        subprocess.run(["mysqladmin", "-uroot", "-h127.0.0.1", "shutdown"], check=True, capture_output=True)
        time.sleep(down_s)
        started = time.monotonic()
        subprocess.run(["start-stop-daemon", "--start", "--oknodo", "--background", "--exec", "/usr/sbin/mariadbd"],
                       check=True, capture_output=True)
        while subprocess.run(["mysqladmin", "-uroot", "-h127.0.0.1", "ping"], capture_output=True).returncode:
            if time.monotonic() - started > 60:
                raise RuntimeError("MariaDB did not come back within 60 s")
            time.sleep(0.2)
        return time.monotonic() - started
