"""Start, kill and restart local `celery -A tasks worker` process groups (demo, tests, chaos)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fenced_core.pools import pool_option, split_pool

REPO_ROOT = Path(__file__).resolve().parents[1]
# tasks.queues.ALL, in consumption order; importing `tasks` here would build the Celery app (and read
# the settings) before callers had a chance to set the environment.
ALL_QUEUES = ("agents.continue", "agents", "agents.large")
READY_TEXT = "ready."  # celery logs "<name>@<host> ready." once it consumes


def worker_argv(name: str, concurrency: int, queues: Sequence[str] = ALL_QUEUES, extra: Sequence[str] = (),
                pool: str = "threads", app: str = "tasks") -> list[str]:
    """The command line of one worker with the project's defaults (every queue in order).

    A pool given in `extra` (`--pool prefork`, `-P solo`) replaces `pool`."""
    extra_pool, extra = split_pool(extra)
    return [
        sys.executable, "-m", "celery", "-A", app, "worker",
        *pool_option(extra_pool or pool), "-c", str(concurrency),
        # Gossip, mingle and broker heartbeats only add chatter and start-up delay for our workers.
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "-n", f"{name}@%h", "-l", "info", "-Q", ",".join(queues),
        *extra,
    ]


class WorkerProcess:
    """One local worker in its own session, so `kill()` takes down the whole process group.

    With the threads pool the Popen pid is the worker itself: it is the pid in lease owner tokens
    (`host:pid:nonce/...`); with prefork the owners are its children, in the same process group.
    Output of every incarnation is appended to one log file.
    """

    def __init__(self, name: str, *, env: Mapping[str, str] | None = None, log_path: str | Path | None = None,
                 concurrency: int = 4, pool: str = "threads", queues: Sequence[str] = ALL_QUEUES,
                 extra_args: Sequence[str] = (), cwd: str | Path = REPO_ROOT, app: str = "tasks") -> None:
        self.name = name
        self.env = dict(env or {})
        if log_path is None:
            fd, tmp = tempfile.mkstemp(prefix=f"fenced-{name}-", suffix=".log")
            os.close(fd)
            log_path = tmp
        self.log_path = Path(log_path)
        self.argv = worker_argv(name, concurrency, queues, extra_args, pool, app)
        self.cwd = Path(cwd)
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []  # every incarnation, oldest first
        self._log_offset = 0  # where the current incarnation's output starts

    # -- state -----------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """The current incarnation's pid (None before the first start)."""
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self) -> str:
        """Everything every incarnation wrote so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # -- control ---------------------------------------------------------------------------------
    def start(self, wait_ready: bool = True, timeout: float = 30.0) -> WorkerProcess:
        """Start the worker; with `wait_ready`, return once it consumes (raises if it dies or stalls)."""
        if self.alive:
            raise RuntimeError(f"worker {self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pids.append(self.proc.pid)
        if wait_ready:
            self.wait_for_log(READY_TEXT, timeout)
        return self

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
        """Send `sig` to the whole process group; for SIGKILL, wait until the worker is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGKILL:
            self.proc.wait(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM: finish the current steps), then SIGKILL the group after `timeout`."""
        if not self.alive:
            return
        self.kill(signal.SIGTERM)
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        # Also takes down anything the worker started that outlived it in the group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(5)

    def restart(self, wait_ready: bool = True, timeout: float = 30.0) -> WorkerProcess:
        """Stop the worker if it runs, then start a new incarnation with the same name and log."""
        self.stop()
        return self.start(wait_ready=wait_ready, timeout=timeout)

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait until the current incarnation logs `text`; raises if it exits first or on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if text in self._current_logs():
                return
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited with {self.proc.returncode} before logging "
                                   f"{text!r}:\n{self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.name} did not log {text!r} within {timeout} s:\n{self._tail()}")
            time.sleep(0.05)

    def _current_logs(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _tail(self, lines: int = 30) -> str:
        return "\n".join(self._current_logs().splitlines()[-lines:])

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"WorkerProcess({self.name!r}, pid={self.pid}, alive={self.alive})"
