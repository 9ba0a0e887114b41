"""PyMySQL's opportunistic TLS, with one SSL context per process instead of one per connection.

PyMySQL 1.2 connects in "preferred" TLS mode when the URL gives no TLS option: it builds an
`ssl.create_default_context()` for every connection (loading the system's CA certificates: ~36 ms of
CPU on this project's 2-core box, idle, and more under load), then uses it only if the server offers
TLS, without verifying anything (CERT_NONE, no host check). Every such context is the same, so the
first is kept and handed to every later connection: same mode, same context settings, the work done
once. A restarted worker opening its 20 pooled connections under load spent over a second there
(py-spy, issue 17), a second that delayed its first takeover claim; every CLI command paid it once.

Only that no-options case is shared: a URL with TLS options (`ssl_ca`, `ssl_cert`, ...) builds its own
context as before. Installed by checkpoints.db when it makes a `mysql+pymysql://` engine.
"""

from __future__ import annotations

import threading
from typing import Any

_PATCHED = "_fenced_shared_preferred_tls"


def install() -> None:
    """Patch PyMySQL's context factory once per process."""
    from pymysql.connections import Connection

    if getattr(Connection, _PATCHED, False) or not hasattr(Connection, "_create_ssl_ctx"):
        return  # patched already, or a PyMySQL without this factory (tests/test_pools.py would say so)
    original = Connection._create_ssl_ctx
    shared: list[Any] = []
    lock = threading.Lock()

    def _create_ssl_ctx(self: Any, sslp: Any) -> Any:
        if isinstance(sslp, dict) and not sslp:  # preferred mode: the URL named no TLS option
            with lock:
                if not shared:
                    shared.append(original(self, sslp))
            return shared[0]
        return original(self, sslp)

    Connection._create_ssl_ctx = _create_ssl_ctx
    setattr(Connection, _PATCHED, True)
