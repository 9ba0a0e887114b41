"""The chaos suite: kill, freeze and wipe real workers and stores, then judge every run (`fenced chaos`)."""

from chaos import redis_failover as _redis_failover  # noqa: F401  (registers `redis-failover` in SCENARIOS)
