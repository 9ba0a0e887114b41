"""The chaos suite's nodes are pytest-celery's own node classes, backed by local processes and servers.

pytest-celery (1.3) models a test setup (`CeleryTestSetup`) as a broker cluster, a backend cluster and
a worker cluster of nodes (`CeleryTestBroker`, `CeleryTestBackend`, `CeleryTestWorker`, all
`CeleryTestNode`s). A node does its work through the *container* it wraps: `kill()` is
`container.kill(signal=...)` then `container.reload()`, `restart()` is `container.restart(timeout=...)`,
`logs()`/`wait_for_log()`/`assert_log_exists()` read `container.logs()`, `ready()` is
`container.ready()`, `hostname()` is `container.id[:12]`; the worker's `worker_name`, `worker_queue`,
`version` and `log_level` come from the container too. Its containers are Docker containers
(pytest-docker-tools over the docker SDK), and these machines have no Docker engine.

So the nodes here ARE pytest-celery's classes (`WorkerNode` is a `CeleryTestWorker`, `RedisNode` a
`CeleryTestBroker`; `local_setup()` builds a real `CeleryTestSetup`) and each wraps the thinnest
adapter that answers the container calls above for a local thing instead of a container:
`LocalWorkerContainer` for a `celery -A tasks worker` process group (harness.workers.WorkerProcess),
`LocalRedisContainer` for a Redis server reached by URL. Every node method the chaos scenarios call
runs pytest-celery's own code through the adapter, except the few additions a process needs (`start`,
`stop`, `pid`, `alive`, `owns`, `log_mark`, `logs(since=...)`).

What cannot run here: pytest-celery's container classes themselves (`CeleryWorkerContainer`,
`RedisContainer`, built and started by pytest-docker-tools fixtures), the `exec_run`-based node calls
(`get_running_processes_info`), and `CeleryTestSetup.ready(ping=True)` (its ping task is pytest-celery's
own, which fenced's workers do not import). docs/operations.md, "pytest-celery", says how the same
setup would run on containers built from docker/ on a machine with a Docker engine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_celery import (
    CeleryBrokerCluster,
    CeleryTestBroker,
    CeleryTestSetup,
    CeleryTestWorker,
    CeleryWorkerCluster,
)

from fencing.connection import client_for
from harness.workers import ALL_QUEUES, READY_TEXT, WorkerProcess

READY_TIMEOUT_S = 30.0


def _signal_number(sig: str | int) -> int:
    """pytest-celery passes signals by name ("SIGKILL"), the chaos scenarios by number."""
    return int(signal.Signals[sig]) if isinstance(sig, str) else int(sig)


class NodeName(str):
    """A node's name: a string (the chaos scenarios key dicts by it) that can also be called, as
    pytest-celery's `CeleryTestNode.name()` is."""

    __slots__ = ()

    def __call__(self) -> str:
        return str(self)


class LocalWorkerContainer:
    """What a `CeleryTestWorker` asks of its container, answered by a local worker process group."""

    def __init__(self, process: WorkerProcess, concurrency: int, pool: str) -> None:
        self.process = process
        self.concurrency = concurrency
        self.pool = pool

    # -- the container attributes pytest-celery's nodes read ---------------------------------------------
    @property
    def name(self) -> str:
        return self.process.name

    @property
    def id(self) -> str:
        """The host name: a local worker's node is `name@<hostname>`, as `-n name@%h` makes it."""
        return socket.gethostname()

    @property
    def status(self) -> str:
        return "running" if self.process.alive else ("exited" if self.process.pid else "created")

    @property
    def celeryconfig(self) -> dict[str, Any]:
        return {"name": self.name, "queues": list(ALL_QUEUES), "pool": self.pool, "concurrency": self.concurrency}

    def ready(self) -> bool:
        """Like a container's ready prompt: the current incarnation logged Celery's `ready.`."""
        self.process.wait_for_log(READY_TEXT, READY_TIMEOUT_S)
        return True

    def logs(self) -> str:
        return self.process.logs()

    def kill(self, signal: str | int = "SIGKILL") -> None:
        """The signal to the whole process group; SIGKILL returns once the group is gone."""
        self.process.kill(_signal_number(signal))

    def reload(self) -> None:
        """Nothing to refresh: `status` is read from the process each time."""

    def restart(self, timeout: float = READY_TIMEOUT_S) -> None:
        """A warm stop if it runs (SIGTERM: the step in flight drains), then a new incarnation."""
        self.process.restart(timeout=timeout)

    def teardown(self) -> None:
        self.process.stop()

    # -- what CeleryTestWorker reads from a CeleryWorkerContainer ------------------------------------------
    def version(self) -> str:
        from importlib.metadata import version

        return version("celery")

    def log_level(self) -> str:
        return "INFO"

    def worker_name(self) -> str:
        return self.process.name

    def worker_queue(self) -> str:
        return ",".join(ALL_QUEUES)


class WorkerNode(CeleryTestWorker):  # pytest-celery ships no type information (Any to mypy)
    """A worker node: a real `celery -A tasks worker` process group that chaos kills, freezes and restarts."""

    def __init__(self, name: str, env: Mapping[str, str], log_dir: Path, pool: str = "threads",
                 concurrency: int = 4, app: Any = None) -> None:
        self.process = WorkerProcess(name, env=env, log_path=log_dir / f"{name}.log", pool=pool,
                                     concurrency=concurrency)
        super().__init__(LocalWorkerContainer(self.process, concurrency, pool), app)

    # pytest-celery's nodes define __eq__ (same container and app) and so lose their hash; a node's
    # container is its own, so identity is the same equality, and nodes stay usable in sets and as keys.
    __hash__ = object.__hash__

    @property
    def name(self) -> NodeName:  # a str, callable like the base method
        return NodeName(self.process.name)

    def hostname(self) -> str:
        """The worker's node name, `name@<host>` (the base truncates a container id to 12 characters)."""
        return f"{self.worker_name}@{self.container.id}"

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.alive

    def start(self) -> None:
        """Start the first incarnation and wait until it consumes."""
        self.process.start()

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL to the group after a bound."""
        self.process.stop()

    def logs(self, since: int = 0) -> str:
        """What every incarnation logged, from offset `since` (a `log_mark()`) on."""
        return str(super().logs())[since:]

    def log_mark(self) -> int:
        """Where the log ends now: `logs(since=mark)` then reads only what was logged after it."""
        return len(self.process.logs())

    def owns(self, pid: int) -> bool:
        """Is `pid` this node's worker or one of its pool children?"""
        if not self.alive or self.pid is None:
            return False
        try:
            return pid == self.pid or os.getpgid(pid) == self.pid
        except ProcessLookupError:
            return False


class LocalRedisContainer:
    """What a `CeleryTestBroker` asks of its container, answered by a Redis server reached by URL (plain,
    Sentinel or Cluster). The server is shared with the deployment under test, so chaos never kills or
    restarts it through the node: the `wipe` scenario flushes it, and the Sentinel and Cluster scenarios
    kill servers they started themselves."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = client_for(url)

    @property
    def name(self) -> str:
        from fenced_core.settings import safe_url

        return str(safe_url(self.url))

    @property
    def id(self) -> str:
        return self.name

    @property
    def status(self) -> str:
        try:
            self.client.ping()
        except Exception:
            return "exited"
        return "running"

    @property
    def celeryconfig(self) -> dict[str, str]:
        return {"url": self.url, "host_url": self.url}

    def ready(self) -> bool:
        return self.status == "running"

    def logs(self) -> str:
        return ""  # a server's log is its own file; nothing of it is needed by the scenarios

    def kill(self, signal: str | int = "SIGKILL") -> None:
        raise NotImplementedError("the shared local Redis is not killed through its node (see LocalRedisContainer)")

    def reload(self) -> None:
        """Nothing to refresh."""

    def restart(self, timeout: float = READY_TIMEOUT_S) -> None:
        raise NotImplementedError("the shared local Redis is not restarted through its node")

    def teardown(self) -> None:
        """Not ours to stop."""


class RedisNode(CeleryTestBroker):  # pytest-celery ships no type information (Any to mypy)
    """The broker and coordination store: chaos flushes it (Redis lost its data)."""

    def __init__(self, url: str, app: Any = None) -> None:
        super().__init__(LocalRedisContainer(url), app)

    @property
    def client(self) -> Any:
        return self.container.client

    def flush(self) -> None:
        self.client.flushall()


def local_setup(workers: Sequence[WorkerNode], broker_url: str, app: Any) -> CeleryTestSetup:
    """pytest-celery's `CeleryTestSetup` over local nodes: the workers, one broker node, no result
    backend (fenced keeps no Celery results: a run's outcome is its row). `setup.ready(control=True)`
    pings the real workers through `app`; `setup.ready(docker=True)` asks each node's adapter."""
    return CeleryTestSetup(worker_cluster=CeleryWorkerCluster(*workers),
                           broker_cluster=CeleryBrokerCluster(RedisNode(broker_url)),
                           backend_cluster=None, app=app)


class DatabaseNode:
    """The local MariaDB: chaos restarts it mid-flight (only where it runs on this machine).

    Not a pytest-celery node: the run store is no Celery result backend (pytest-celery's backend nodes
    are), and nothing in a `CeleryTestSetup` would use it."""

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
