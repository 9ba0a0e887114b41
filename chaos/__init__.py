"""The chaos suite: kill, freeze and wipe real workers and stores, then judge every run (`fenced chaos`)."""

from chaos import redis_cluster as _redis_cluster  # noqa: F401  (registers `cluster-master-kill` in SCENARIOS)
from chaos import redis_failover as _redis_failover  # noqa: F401  (registers `redis-failover` in SCENARIOS)
