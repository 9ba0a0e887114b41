"""The shopping demo's tables: cart confirmation cards and the orders placed from them (SQLAlchemy Core).

They are the demo's, not the run store's, so they sit on their own MetaData. Their history is in the
run store's migrations (checkpoints/migrations/versions/0001-0003 create and change them), so an
existing database keeps its cards and orders and `fenced migrate` keeps creating them; this mirrors the
head of that history."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, String, Table, Text

from fenced.store import Ident

metadata = MetaData()

cart_cards = Table(
    "cart_cards",
    metadata,
    Column("card_id", Ident(64), primary_key=True),
    Column("request_key", Ident(255), nullable=False, unique=True),
    Column("run_id", Ident(64), nullable=False),
    Column("user_id", Ident(128), nullable=False, server_default=""),
    Column("expires_at_ms", BigInteger, nullable=False, server_default="0"),
    Column("confirmed_at_ms", BigInteger),
    Column("operation_id", Ident(64), nullable=False, unique=True),
    Column("items", Text, nullable=False),  # JSON, sorted by item id
    Column("total_cents", BigInteger, nullable=False),  # qty <= cards.MAX_QTY per line, too
    Column("state", String(16), nullable=False),  # offered -> confirmed
    Column("epoch", Integer, nullable=False),
    Column("created_at_ms", BigInteger, nullable=False),
    Index("ix_cart_cards_run", "run_id"),
)

orders = Table(
    "orders",
    metadata,
    Column("order_id", Ident(64), primary_key=True),
    Column("operation_id", Ident(64), nullable=False, unique=True),
    Column("card_id", Ident(64), nullable=False),
    Column("user_id", Ident(128), nullable=False, server_default=""),
    Column("created_at_ms", BigInteger, nullable=False),
)
