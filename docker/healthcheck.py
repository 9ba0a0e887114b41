"""The container health check of every role (FENCED_ROLE): exit 0 healthy, 1 not, with one line why.

- worker: the worker answers a Celery ping addressed to its own node (`FENCED_WORKER_NAME@<hostname>`,
  the `-n worker@%h` the image starts it with): its process is alive *and* consuming its control queue
  on the broker;
- api: `GET /openapi.json` on FENCED_API_PORT (8000): the process serves HTTP (no store is read, so a
  database outage does not restart every replica);
- flower: Flower's `GET /healthcheck` on FLOWER_PORT (5555);
- migrate: a one-shot job; healthy by definition while it runs (compose waits for it to exit 0).

Run by the image's HEALTHCHECK and by docker/compose.yml; tests/test_docker.py runs it against real
local processes."""

from __future__ import annotations

import os
import socket
import sys
import urllib.request


def _http(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 - a fixed local URL
            return reply.status == 200, f"{url}: HTTP {reply.status}"
    except OSError as exc:
        return False, f"{url}: {exc}"


def _worker() -> tuple[bool, str]:
    from tasks import app

    node = f"{os.environ.get('FENCED_WORKER_NAME', 'worker')}@{socket.gethostname()}"
    replies = app.control.ping(destination=[node], timeout=float(os.environ.get("FENCED_HEALTH_TIMEOUT_S", "5")))
    ok = any(node in reply for reply in replies)
    return ok, f"worker {node}: {'pong' if ok else 'no reply to a ping'}"


def check(role: str) -> tuple[bool, str]:
    if role == "worker":
        return _worker()
    if role == "api":
        return _http(f"http://127.0.0.1:{os.environ.get('FENCED_API_PORT', '8000')}/openapi.json")
    if role == "flower":
        return _http(f"http://127.0.0.1:{os.environ.get('FLOWER_PORT', '5555')}/healthcheck")
    if role == "migrate":
        return True, "migrate: a one-shot job"
    return False, f"FENCED_ROLE={role!r}: expected worker, api, flower or migrate"


def main() -> int:
    ok, why = check(os.environ.get("FENCED_ROLE", "worker"))
    print(why)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
