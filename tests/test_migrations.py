"""Upgrading a database that has live data (MariaDB and SQLite): built at 0001 with Alembic, filled, then
brought to head. Cards from before 0002 must be confirmable by their owner, open holds must be on the
new accounts, and ids that differ only in case must stay apart."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

import checkpoints.db
from checkpoints import accounts, ledger, runs
from checkpoints.api_keys import metadata as api_keys_metadata
from checkpoints.db import dispose_all, get_engine, transaction
from checkpoints.runs import Usage
from checkpoints.schema import metadata
from examples.shopping import cards
from examples.shopping.schema import metadata as shopping_metadata
from examples.shopping.schema import orders
from examples.shopping.settings import get_shopping_settings
from fenced_core.settings import get_settings
from tests.conftest import MYSQL_URL, use_db


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(checkpoints.db.__file__).with_name("migrations")))
    return cfg


def upgrade(url: str, revision: str) -> None:
    with get_engine(url).connect() as conn:
        cfg = _config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()


@pytest.fixture(params=["mysql", "sqlite"])
def empty_db(request: pytest.FixtureRequest, tmp_path: Path, redis_client: object) -> Iterator[str]:
    """A database with no tables at all (not even alembic_version); MariaDB is back at head afterwards."""
    url = MYSQL_URL if request.param == "mysql" else f"sqlite:///{tmp_path / 'old.db'}"
    os.environ["FENCED_DB_URL"] = url
    get_settings.cache_clear()
    dispose_all()
    with get_engine(url).begin() as conn:
        metadata.drop_all(conn)
        shopping_metadata.drop_all(conn)
        api_keys_metadata.drop_all(conn)
        conn.execute(sa.text("DROP TABLE IF EXISTS alembic_version"))
    yield url
    if request.param == "mysql":
        with get_engine(url).begin() as conn:
            metadata.drop_all(conn)
            shopping_metadata.drop_all(conn)
            api_keys_metadata.drop_all(conn)
            conn.execute(sa.text("DROP TABLE IF EXISTS alembic_version"))
    use_db(MYSQL_URL)


NOW = runs.now_ms()


def _insert_0001_data(url: str) -> None:
    """What a 0001 database held: a running run between steps with its open hold and two cards (one
    confirmed into an order), and a large run of a user whose id differs only in case."""
    rows = {
        "run_checkpoints": [
            {"run_id": "run-old", "user_id": "olga", "kind": "normal", "epoch": 1},
            {"run_id": "run-big", "user_id": "Olga", "kind": "large", "epoch": 0},
        ],
        "run_holds": [
            {"run_id": "run-old", "user_id": "olga", "credits_held": 20, "state": "held", "credits_charged": None,
             "created_at_ms": NOW, "expires_at_ms": NOW + 900_000, "closed_at_ms": None},
            {"run_id": "run-big", "user_id": "Olga", "credits_held": 60, "state": "held", "credits_charged": None,
             "created_at_ms": NOW, "expires_at_ms": NOW + 900_000, "closed_at_ms": None},
        ],
        "cart_cards": [
            {"card_id": "card_old", "request_key": "run-old:add_to_cart:aaa", "run_id": "run-old",
             "operation_id": "op_old", "items": json.dumps([{"id": "sku-001", "name": "a", "price_cents": 100,
                                                             "qty": 1}]),
             "total_cents": 100, "state": "offered", "epoch": 1, "created_at_ms": NOW - 1000},
            {"card_id": "card_done", "request_key": "run-old:add_to_cart:bbb", "run_id": "run-old",
             "operation_id": "op_done", "items": "[]", "total_cents": 0, "state": "confirmed", "epoch": 1,
             "created_at_ms": NOW - 2000},
        ],
        "orders": [{"order_id": "ord_old", "operation_id": "op_done", "card_id": "card_done", "created_at_ms": NOW}],
    }
    for run in rows["run_checkpoints"]:
        run.update(query="buy a lamp", state="running" if run["epoch"] else "queued", owner=None, step=1,
                   phase="done", checkpoint=None, prompt_tokens=600, completion_tokens=200, model_calls=1,
                   last_event_id="", deliveries=0, total_deliveries=run["epoch"], answer=None, error_class=None,
                   error=None, created_at_ms=NOW, updated_at_ms=NOW, finished_at_ms=None)
    with get_engine(url).begin() as conn:
        for table, values in rows.items():
            names = list(values[0])
            conn.execute(sa.text(f"INSERT INTO {table} ({', '.join(names)}) "
                                 f"VALUES ({', '.join(':' + n for n in names)})"), values)


def test_an_upgrade_from_0001_keeps_cards_confirmable_and_holds_on_the_accounts(empty_db):
    url = empty_db
    upgrade(url, "0001")
    _insert_0001_data(url)
    upgrade(url, "head")

    card = cards.get_card("card_old")
    assert card.user_id == "olga"
    assert card.expires_at_ms == NOW - 1000 + get_shopping_settings().card_ttl_s * 1000
    order = cards.confirm_card("card_old", "olga")
    assert not order.reused and order.user_id == "olga"
    with transaction(readonly=True) as conn:
        assert conn.execute(sa.select(orders.c.user_id).where(orders.c.order_id == "ord_old")).scalar() == "olga"

    assert (accounts.get_account("olga").balance_credits, accounts.get_account("olga").held_credits) == (1000, 20)
    assert (accounts.get_account("Olga").balance_credits, accounts.get_account("Olga").held_credits) == (1000, 60)
    # The open hold settles against the account that now carries it: no mismatch, charged once.
    run = runs.get_run("run-old")
    assert run is not None
    claim = runs.claim(run, "w/1")
    assert claim is not None
    assert runs.finish(claim, "done", {}, Usage(2400, 800, 2), "", answer="ok") == 16
    assert (accounts.get_account("olga").balance_credits, accounts.get_account("olga").held_credits) == (984, 0)
    assert "account_mismatch" not in [e.kind for e in ledger.history("run-old")]


def test_an_upgrade_recomputes_held_credits_of_existing_accounts(empty_db):
    """A database already at 0002 whose account missed a hold opened before 0002 (held 0, one hold open)."""
    url = empty_db
    upgrade(url, "0001")
    _insert_0001_data(url)
    upgrade(url, "0002")
    with get_engine(url).begin() as conn:
        conn.execute(sa.text("INSERT INTO user_accounts (user_id, balance_credits, held_credits, updated_at_ms) "
                             "VALUES ('olga', 500, 0, 0)"))
    upgrade(url, "head")
    assert (accounts.get_account("olga").balance_credits, accounts.get_account("olga").held_credits) == (500, 20)
    assert (accounts.get_account("Olga").balance_credits, accounts.get_account("Olga").held_credits) == (1000, 60)


def test_downgrade_to_0002_and_back(empty_db):
    url = empty_db
    upgrade(url, "head")
    with get_engine(url).connect() as conn:
        cfg = _config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
        conn.commit()
    upgrade(url, "head")
    with transaction(readonly=True) as conn:
        head = ScriptDirectory.from_config(_config()).get_current_head()
        assert head is not None and int(head) >= 6  # 0006: run_history
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == head


def test_head_revision_names_the_newest_migration():
    """`migrate` skips Alembic when the database is at HEAD_REVISION: a migration added without moving
    it would never run on a database at the previous head."""
    assert checkpoints.db.HEAD_REVISION == ScriptDirectory.from_config(_config()).get_current_head()


def test_a_database_at_head_is_not_handed_to_alembic_and_one_behind_is(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'start.db'}"
    upgrade(url, "0005")
    upgrades: list[str] = []
    real_upgrade = command.upgrade
    monkeypatch.setattr(command, "upgrade", lambda cfg, rev: (upgrades.append(rev), real_upgrade(cfg, rev)))
    checkpoints.db.migrate(url)
    assert upgrades == ["head"]
    assert checkpoints.db.schema_revision(get_engine(url)) == checkpoints.db.HEAD_REVISION
    checkpoints.db.migrate(url)  # a worker start on a database at head: one SELECT, no Alembic
    assert upgrades == ["head"]
    assert checkpoints.db.schema_revision(get_engine(f"sqlite:///{tmp_path / 'empty.db'}")) is None
