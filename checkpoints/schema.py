"""The run store's tables (SQLAlchemy Core). Alembic migrations own the schema; this mirrors the head."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

metadata = MetaData()


def binary_collation(dialect: Dialect) -> str:
    """The MySQL/MariaDB collation under which identifiers compare byte for byte, trailing spaces included.

    The server default (utf8mb4_general_ci and the like) is case- and accent-insensitive, and even
    utf8mb4_bin pads with spaces, so `alice`, `Alice`, `alice ` and `alicé` would be one key. MariaDB
    has utf8mb4_nopad_bin (10.2+), MySQL utf8mb4_0900_bin (8.0.17+); older MySQL only has the padding
    utf8mb4_bin (trailing spaces then still compare equal). Migration 0003 applies the same choice."""
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin"
    version = dialect.server_version_info or ()
    return "utf8mb4_0900_bin" if tuple(version) >= (8, 0, 17) else "utf8mb4_bin"


class Ident(TypeDecorator[str]):
    """An identifier (user, run, card, request key, operation, order, tool call): compared byte for byte
    on every database. SQLite's default BINARY collation already does; MySQL/MariaDB get a binary,
    no-pad collation on the column (see binary_collation). Values stay `str` in Python."""

    impl = String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.VARCHAR(self.length, charset="utf8mb4",
                                                         collation=binary_collation(dialect)))
        return dialect.type_descriptor(String(self.length))

RUN_STATES = ("queued", "running", "waiting", "done", "failed", "cancelled", "dead")
TERMINAL_STATES = ("done", "failed", "cancelled", "dead")
LIVE_STATES = ("queued", "running")
PHASES = ("none", "decided", "done")

# MEDIUMBLOB on MySQL (16 MiB); plain BLOB elsewhere.
Blob = LargeBinary(length=16 * 1024 * 1024)

run_checkpoints = Table(
    "run_checkpoints",
    metadata,
    Column("run_id", Ident(64), primary_key=True),
    Column("user_id", Ident(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("query", Text, nullable=False),  # the run's input: a person's request, or a task's JSON arguments
    # The program that runs it (an agent or a FencedTask, by name) and the version of its tool set or
    # steps when it was submitted: a replay refuses a checkpoint the program can no longer honour.
    Column("agent", String(128), nullable=False, server_default="shopping"),
    Column("agent_version", String(32), nullable=False, server_default=""),
    Column("state", String(16), nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("owner", String(160)),  # lease token of the current holder; NULL between steps
    Column("step", Integer, nullable=False),
    Column("phase", String(16), nullable=False),  # none / decided / done: the last checkpoint written
    Column("checkpoint", Blob),  # compressed JSON, see checkpoints.codec
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("model_calls", Integer, nullable=False),
    Column("last_event_id", String(64), nullable=False),
    Column("deliveries", Integer, nullable=False),  # claims of the current step
    Column("total_deliveries", Integer, nullable=False),
    Column("answer", Text),
    Column("error_class", String(16)),
    Column("error", Text),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("updated_at_ms", BigInteger, nullable=False),  # last progress: the sweeper's clock
    Column("finished_at_ms", BigInteger),
    Index("ix_run_checkpoints_state_updated", "state", "updated_at_ms"),
    Index("ix_run_checkpoints_user", "user_id"),
)

run_steps = Table(
    "run_steps",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", Ident(64), nullable=False),
    Column("step", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("phase", String(16), nullable=False),
    Column("owner", String(160)),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("completion_tokens", BigInteger, nullable=False),
    Column("checkpoint", Blob),
    Column("at_ms", BigInteger, nullable=False),
    Index("ix_run_steps_run", "run_id", "step"),
)

# A run's history in sealed segments of checkpoints.history.SEGMENT entries, each written once in the
# fenced transaction of the checkpoint that completed it; the run row's blob keeps only the open tail.
run_history = Table(
    "run_history",
    metadata,
    Column("run_id", Ident(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("body", Blob, nullable=False),  # compressed JSON {"entries": [...]}, see checkpoints.codec
)

run_holds = Table(
    "run_holds",
    metadata,
    Column("run_id", Ident(64), primary_key=True),
    Column("user_id", Ident(128), nullable=False),
    Column("credits_held", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # held -> settled | released
    Column("credits_charged", Integer),  # of this hold: the usage since it was (re)opened
    # A dead letter replayed after its hold was settled reopens the hold (lifecycle.replay): what the
    # earlier closings charged stays on record here, and the tokens they covered are not charged again.
    Column("credits_charged_before", Integer, nullable=False, server_default="0"),
    Column("tokens_settled_before", BigInteger, nullable=False, server_default="0"),
    Column("created_at_ms", BigInteger, nullable=False),
    Column("expires_at_ms", BigInteger, nullable=False),
    Column("closed_at_ms", BigInteger),
    Index("ix_run_holds_state_expires", "state", "expires_at_ms"),
)

run_attempts = Table(
    "run_attempts",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", Ident(64), nullable=False),
    Column("step", Integer, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("worker", String(160), nullable=False),
    Column("started_at_ms", BigInteger, nullable=False),
    Column("ended_at_ms", BigInteger),
    Column("outcome", String(32)),  # NULL while running, or when the worker died
    Column("error", Text),
    Index("ix_run_attempts_run", "run_id", "epoch"),
)

run_ledger = Table(
    "run_ledger",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", Ident(64), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("actor", String(160), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("reason", Text, nullable=False),
    Column("detail", Text),  # JSON
    Index("ix_run_ledger_run", "run_id", "id"),
)

effects = Table(
    "effects",
    metadata,
    Column("request_key", Ident(255), primary_key=True),  # run_id:action:fingerprint
    Column("run_id", Ident(64), nullable=False),
    Column("action", String(64), nullable=False),
    Column("result", Text, nullable=False),  # JSON: what the first execution returned
    Column("epoch", Integer, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Index("ix_effects_run", "run_id"),
)

# The shopping example's cart_cards and orders tables are defined in examples/shopping/schema.py (on
# their own MetaData): they are the demo's, not the runtime's. Migrations 0001-0003 create and change
# them (history kept, so existing cards and orders stay); a new migration must not drop them.

run_inputs = Table(
    "run_inputs",
    metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("run_id", Ident(64), nullable=False),
    Column("turn", Integer, nullable=False),  # the step that asked
    Column("tool_call_id", Ident(64), nullable=False),  # ask_user's call id, or "fix:<step>:<epoch>"
    Column("kind", String(16), nullable=False),  # ask_user / fixable
    Column("question", Text, nullable=False),
    Column("reply", Text),
    Column("epoch", Integer, nullable=False),
    Column("asked_at_ms", BigInteger, nullable=False),
    Column("replied_at_ms", BigInteger),
    Column("replied_by", Ident(128)),
    UniqueConstraint("run_id", "tool_call_id", name="uq_run_inputs_call"),
)

user_accounts = Table(
    "user_accounts",
    metadata,
    Column("user_id", Ident(128), primary_key=True),
    Column("balance_credits", BigInteger, nullable=False),  # never negative
    Column("held_credits", BigInteger, nullable=False),  # sum of this user's open holds
    Column("updated_at_ms", BigInteger, nullable=False),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("run_id", Ident(64), primary_key=True),
    Column("step", Integer, nullable=False),
    Column("reason", Text, nullable=False),
    Column("attempts", Text, nullable=False),  # JSON: every attempt with its error
    Column("observations", Text),  # JSON: the last worker's view
    Column("at_ms", BigInteger, nullable=False),
    Column("replayed_at_ms", BigInteger),
    Column("replayed_by", Ident(128)),
    Column("replays", Integer, nullable=False, server_default="0"),
)
