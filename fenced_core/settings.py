"""One typed settings object, read from FENCED_* environment variables; defaults from DESIGN.md."""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import warnings
from collections.abc import Mapping
from typing import Literal, get_args

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fenced_core.errors import ConfigError

LogLevel = Literal["debug", "info", "warning", "error"]
LOG_LEVELS: tuple[str, ...] = get_args(LogLevel)
# The run stores fenced is tested on. PostgreSQL is not one of them (yet): refused, not half-supported.
DB_SCHEMES = ("mysql+pymysql://", "mysql+mysqldb://", "sqlite:///")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEME = "redis+cluster://"  # fenced's Redis on a Redis Cluster (fencing.cluster)
SENTINEL_SCHEME = "redis+sentinel://"  # fenced's Redis through Sentinel (fencing.sentinel)
# A delivery starts a next step inline (FENCED_INLINE_STEPS) only this long after it began, so one Celery
# task never outlives its hard time limit (celeryconfig: step timeout + this window + 30 s).
INLINE_WINDOW_S = 20
# FENCED_* is fenced's namespace. Besides Settings' fields these names are read (the rest is a typo that
# would be ignored silently, so it is warned about; tests/test_settings_names.py keeps this list true):
# the live stream's settings (fenced_api.live), the shopping example's (examples/shopping/settings.py),
# the container entrypoints (docker/), the worker's node name (tasks.app sets it), and the scripts' own.
OTHER_NAMES = frozenset({
    "FENCED_LIVE_PING_S", "FENCED_LIVE_SILENT_S", "FENCED_LIVE_QUEUE_BYTES", "FENCED_LIVE_BLOCK_MS",
    "FENCED_LIVE_CLOSE_WAIT_S",
    "FENCED_STUB_STEP_MS", "FENCED_STUB_TOKENS", "FENCED_STUB_COUNT_PAID", "FENCED_STUB_TOOL_MS", "FENCED_MODEL",
    "FENCED_OPENAI_BASE_URL", "FENCED_OPENAI_API_KEY", "FENCED_OPENAI_MODEL", "FENCED_CARD_TTL_S",
    "FENCED_ROLE", "FENCED_API_PORT", "FENCED_HTTP_PORT", "FENCED_WORKER_NAME", "FENCED_HEALTH_TIMEOUT_S",
    "FENCED_NODE_NAME",
    "FENCED_CLUSTER_NODE_TIMEOUT_MS", "FENCED_MUTATIONS", "FENCED_SCREENSHOTS",
})
OTHER_PREFIXES = ("FENCED_TEST_", "FENCED_BENCH_", "FENCED_SENTINEL_", "FENCED_REQUIRE_")


class Settings(BaseSettings):
    """Every knob of the runtime. Units are in the names; each default is documented here only."""

    model_config = SettingsConfigDict(env_prefix="FENCED_", extra="ignore")

    # Stores. Empty means "embedded": the demo starts a private redis-server and uses SQLite.
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Leases, epoch mirror, events, broker")
    broker_url: str = Field("", description="Celery broker; empty = same as redis_url")
    broker_master_name: str = Field("", description="The master a sentinel:// broker's sentinels monitor "
                                    "(kombu's master_name); required with a sentinel:// broker_url")
    db_url: str = Field("sqlite:///fenced.db", description="The run store (MySQL/MariaDB or SQLite)")
    sqlite_busy_timeout_ms: int = Field(
        5_000, gt=0, description="SQLite: how long one write waits for the database-wide write lock before it "
        "fails as transient (and is retried); bounds what a writer frozen mid-transaction costs each wait")
    db_retry_s: float = Field(60, ge=0, description="How long a transaction is retried through a database outage "
                              "(workers ride out a restart; the CLI sets 5 s unless this is set)")
    db_idle_txn_timeout_s: int = Field(
        5, ge=0, description="MariaDB rolls back a transaction idle this long (a frozen worker's row locks); 0 = off")
    db_pool_size: int = Field(
        20, gt=0, description="MySQL/MariaDB connections a process keeps open once it needed them (per process)")
    db_max_overflow: int = Field(
        0, ge=0, description="Connections a process may open beyond db_pool_size in a burst, each closed when "
        "returned (0: a thread that finds every connection in use waits for one; an opened-and-closed "
        "connection costs a handshake's CPU, which under load makes transactions slower and more overflow)")

    redis_max_connections: int = Field(
        10_000, gt=0, description="Redis connections one process may open to fenced's Redis (each node of a "
        "cluster), and per kombu channel to the broker; opened on demand and kept. redis-py 8 caps a pool at "
        "100 and kombu at 10, and both fail the command past it, which a worker with hundreds of threads reaches")

    # Leases and liveness.
    lease_ttl_ms: int = Field(30_000, gt=0, description="Lease lifetime without renewal")
    heartbeat_ms: int = Field(10_000, gt=0, description="Watchdog renewal period")
    reaper_tick_ms: int = Field(1_000, gt=0, description="How often each worker looks for expired leases")
    fast_takeover: bool = Field(True, description="Act on dead processes (connections gone, pool child died)")
    liveness_tick_ms: int = Field(250, gt=0, description="How often one worker compares lease holders with clients")
    sweeper_interval_ms: int = Field(30_000, gt=0, description="How often one worker sweeps the database")
    sweeper_grace_ms: int = Field(60_000, gt=0, description="No lease and no progress for this long => rescue")
    max_deliveries: int = Field(3, gt=0, description="Claims of one step without finishing before dead-letter")
    dead_letter_keep: int = Field(1_000, gt=0, description="Entries kept in the dead-letter stream")
    events_keep: int = Field(10_000, gt=0, description="Entries kept per run event stream")

    epoch_check_runs: int = Field(
        10_000, ge=0, description="Start-up check: how many in-flight runs (most recently updated first) must not "
        "have a database epoch behind their Redis epoch mirror; 0 = off (tasks.epoch_check)")

    # Steps and retries.
    step_timeout_s: int = Field(300, gt=0, description="Hard bound on one step")
    drain_s: int = Field(330, gt=0, description="Graceful drain on SIGTERM")
    retry_base_ms: int = Field(200, gt=0, description="Transient retry backoff base")
    retry_cap_ms: int = Field(5_000, gt=0, description="Transient retry backoff cap")
    retry_budget: int = Field(5, ge=0, description="Transient retries per step")
    concurrency: int | None = Field(None, gt=0, description="Worker concurrency; unset: 64 for the threads pool, "
                                    "Celery's default (one process per CPU) for prefork (fenced_core.pools)")
    inline_steps: int = Field(8, ge=0, description="Steps a delivery may run after its own, in the same worker "
                              "slot, when the next one is ready at once (threads and gevent workers; 0 = every "
                              "step goes through the broker; tasks.delivery)")
    log_level: LogLevel = Field(
        "info", description="The lowest level of fenced's own log lines (structlog: a worker's step_done, "
        "running, delivery_done at info, three lines a step); Celery's own lines follow `celery worker -l`")
    task_events: bool = Field(True, description="Workers send Celery task events and senders task-sent events "
                              "(Flower's live task view); off saves about four broker publishes per step")

    # Operators: a worker's Prometheus endpoint (tasks.metrics; docs/operators.md).
    metrics_port: int = Field(0, ge=0, le=65535, description="Port of a worker's /metrics endpoint; 0 = off")
    metrics_addr: str = Field("127.0.0.1", min_length=1, description="Interface a worker's /metrics binds "
                              "(0.0.0.0 for a Prometheus on another host)")

    # Routing (routing/, docs/routing.md): `shared` queues (the default, as before) or `reach`: each
    # wake-up goes to the qualifying worker with the best score, on that worker's own queue.
    routing: Literal["shared", "reach"] = Field("shared", description="shared = the shared queues; reach = "
                                                 "route each wake-up to the best-scoring live worker")
    routing_heartbeat_ms: int = Field(5_000, gt=0, description="A worker's registry heartbeat period")
    routing_scan_ms: int = Field(1_000, gt=0, description="How often one worker scans the registry")
    routing_skew_ms: int = Field(500, ge=0, description="Clock skew allowed: offline = no beat for 3 x period + this")
    routing_threshold: float = Field(0.3, ge=0, le=1, description="Workers scoring under this get no runs")
    routing_w_fresh: float = Field(0.3, ge=0, description="Score weight: heartbeat freshness")
    routing_w_speed: float = Field(0.2, ge=0, description="Score weight: 1/(1 + average step seconds)")
    routing_w_load: float = Field(0.3, ge=0, description="Score weight: 1/(1 + runs in flight)")
    routing_w_success: float = Field(0.2, ge=0, description="Score weight: step success rate")
    routing_prefer_margin: float = Field(0.05, ge=0, description="A continuation stays on its worker while "
                                         "that worker scores within this of the best")
    routing_load_per_slot: bool = Field(False, description="Count runs in flight per worker slot (÷ concurrency) "
                                         "in the load factor instead of in total")
    routing_window: int = Field(50, gt=0, description="Steps the average step time and success rate cover")
    routing_queue_warn: int = Field(200, gt=0, description="Queue length past which a warning goes to the feed")
    worker_labels: str = Field("", description="Comma-separated labels a worker registers with (shown only)")

    max_query_chars: int = Field(16_000, gt=0, description="Longest query a submit accepts (characters)")

    # Billing.
    hold_normal_credits: int = Field(20, gt=0)
    hold_large_credits: int = Field(60, gt=0)
    hold_expiry_s: int = Field(900, gt=0, description="A hold nobody ran is released after this")
    credits_per_1k_tokens: float = Field(5.0, ge=0, description="Price of model usage")

    # Admission and accounts.
    max_queued_runs: int = Field(1_000, gt=0, description="Global limit: undelivered + admitted-not-sent runs")
    max_runs_per_user: int = Field(10, gt=0, description="Concurrent (admitted, unfinished) runs per user")
    admission_ttl_s: int = Field(3_600, gt=0, description="A slot no sweep confirmed live this long is pruned")
    default_balance_credits: int = Field(1_000, ge=0, description="Starting balance of a user never seen before")
    large_promote_every_ms: int = Field(500, gt=0, description="Move the oldest large run ahead this often")

    # What a worker runs: the modules that define its agents and FencedTasks (Celery's `imports`).
    imports: str = Field("examples.shopping", description="Comma-separated modules every worker imports at "
                         "start: the agents and FencedTasks it can run (the demo's shopping agent by default)")

    default_agent: str = Field("shopping", min_length=1, max_length=128,
                               description="The agent a submit runs when it names none")

    # The shopping demo's settings (stub model, FENCED_MODEL, card TTL) are its own: examples/shopping/settings.py.

    # Tests and chaos only: named fault-injection points are checked only when this is on.
    faults_enabled: bool = Field(False, description="Arm-able fault points and the stub model's test markers "
                                 "([poison], [terminal], ...): tests and chaos only")

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, level: object) -> object:
        # Only a known level is lowered: anything else reaches the Literal as written, and its refusal
        # quotes the value the user gave.
        if isinstance(level, str) and level.strip().lower() in LOG_LEVELS:
            return level.strip().lower()
        return level

    @field_validator("db_url")
    @classmethod
    def _check_db_url(cls, url: str) -> str:
        if url.startswith(("postgres://", "postgresql")):
            raise ValueError("PostgreSQL is not a supported run store; use mysql+pymysql://USER@HOST:PORT/DB "
                             "(MySQL/MariaDB) or sqlite:///PATH")
        if url.startswith("mysql://") or (url.startswith("mysql+") and
                                          not url.startswith(("mysql+pymysql://", "mysql+mysqldb://"))):
            raise ValueError("MySQL/MariaDB URLs must name the driver: mysql+pymysql://USER@HOST:PORT/DB (PyMySQL, "
                             "the default) or mysql+mysqldb://USER@HOST:PORT/DB (mysqlclient, optional C driver)")
        if not url.startswith(DB_SCHEMES):
            raise ValueError("accepted: mysql+pymysql://USER@HOST:PORT/DB (MySQL/MariaDB; mysql+mysqldb:// for "
                             "mysqlclient) or sqlite:///PATH")
        return url

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, url: str) -> str:
        if not url.startswith((*REDIS_SCHEMES, CLUSTER_SCHEME, SENTINEL_SCHEME)):
            raise ValueError("accepted: redis://HOST:PORT/DB, rediss://… (TLS), unix:///PATH, "
                             "redis+cluster://HOST:PORT[,HOST:PORT…] (Redis Cluster) or "
                             "redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER_NAME/DB (Sentinel)")
        return url

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, url: str) -> str:
        if url.startswith(CLUSTER_SCHEME):
            raise ValueError("the Celery broker cannot be a Redis Cluster (kombu's Redis transport has no "
                             "Cluster support): point FENCED_BROKER_URL at a plain Redis or at Sentinel "
                             "(sentinel://HOST:PORT;sentinel://HOST:PORT…)")
        if url and not url.startswith((*REDIS_SCHEMES, "sentinel://")):
            raise ValueError("accepted: redis://HOST:PORT/DB, rediss://… (TLS), unix:///PATH or "
                             "sentinel://HOST:PORT[;sentinel://HOST:PORT…] (Sentinel; name the master in "
                             "FENCED_BROKER_MASTER_NAME)")
        return url

    @model_validator(mode="after")
    def _check_broker_is_named(self) -> Settings:
        if not self.broker_url and self.redis_url.startswith((CLUSTER_SCHEME, SENTINEL_SCHEME)):
            raise ValueError("broker_url: FENCED_REDIS_URL names a Redis Cluster or Sentinel, which the Celery "
                             "broker cannot share by URL: set FENCED_BROKER_URL (a plain redis:// or sentinel://)")
        return self

    @model_validator(mode="after")
    def _check_sentinel_broker_is_named(self) -> Settings:
        if self.broker_url.startswith("sentinel://") and not self.broker_master_name:
            raise ValueError("broker_master_name: FENCED_BROKER_URL is sentinel://…: name the master its sentinels "
                             "monitor in FENCED_BROKER_MASTER_NAME")
        return self

    @model_validator(mode="after")
    def _check_ratio(self) -> Settings:
        if self.lease_ttl_ms < 3 * self.heartbeat_ms:
            warnings.warn(
                f"lease_ttl_ms={self.lease_ttl_ms} is under 3 x heartbeat_ms={self.heartbeat_ms}: "
                "one slow renewal can lose a healthy lease",
                stacklevel=2,
            )
        return self

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def is_mysql(self) -> bool:
        return self.db_url.startswith("mysql")


def unknown_names(environ: Mapping[str, str]) -> list[str]:
    """One line per FENCED_* variable in `environ` that nothing reads (a misspelt setting), with the
    nearest known name when there is one."""
    known = {"FENCED_" + name.upper() for name in Settings.model_fields} | OTHER_NAMES
    lines = []
    for name in sorted(environ):
        if not name.startswith("FENCED_") or name in known or name.startswith(OTHER_PREFIXES):
            continue
        near = difflib.get_close_matches(name.removeprefix("FENCED_"), [k.removeprefix("FENCED_") for k in known],
                                         n=1, cutoff=0.6)
        hint = f" (did you mean FENCED_{near[0]}?)" if near else ""
        lines.append(f"{name} is not a fenced setting and is ignored{hint}")
    return lines


@functools.cache
def warn_unknown_names() -> None:
    """Print `warning: …` once per process for each misspelt FENCED_* variable (the CLI and every process
    that loads celeryconfig call this)."""
    for line in unknown_names(os.environ):
        print(f"warning: {line}", file=sys.stderr)


_CREDENTIALS = re.compile(r"(//[^/@:;,]*)(:[^/@;,]*)?@")  # `//user:password@` in a URL of several hosts


def safe_url(url: str) -> str:
    """A store URL (database or Redis) as it may be shown: without its password. A URL of several hosts
    (a Redis Cluster's or Sentinel's, which SQLAlchemy does not parse) has each `//user:password@` masked;
    one with an `@` left over after that is not shown at all."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        if "@" in _CREDENTIALS.sub("//", url):
            return "(unparsable url)"
        return _CREDENTIALS.sub(lambda m: m.group(1) + (":***@" if m.group(2) is not None else "@"), url)


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment. Raises ConfigError with one line per
    bad variable (its name, the value given, what is accepted)."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """A settings ValidationError as lines a user can act on: `FENCED_X='value': what is accepted`."""
    lines = []
    for err in exc.errors():
        msg = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a check across settings: its message names the settings it is about
            lines.append(msg)
            continue
        name = "FENCED_" + "_".join(str(part) for part in err["loc"][:1]).upper()
        lines.append(f"{name}={err.get('input')!r}: {msg}")
    return "; ".join(lines)
