"""The app-extension seam (tasks/service.py): an app registers its cards, the CLI and the HTTP API reach them
only through the service; the shopping example registers its own on import and uses only the public API."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from typer.testing import CliRunner

import examples.shopping
from checkpoints import runs
from fenced_cli import app as cli
from fenced_core.errors import InvalidRequest, RunNotFound
from fencing import epoch
from tasks import service, submit_run
from tests.test_api import Api, api  # noqa: F401  (the fixture)


@dataclass(frozen=True)
class Offer:
    card_id: str
    run_id: str
    user_id: str
    state: str = "offered"
    items: list[dict[str, Any]] = field(default_factory=lambda: [{"id": "t-1", "name": "tea", "qty": 2}])
    total_cents: int = 700
    expires_at_ms: int = 4_102_444_800_000
    note: str = "an app's own field"


@dataclass(frozen=True)
class Booking:
    order_id: str
    operation_id: str
    card_id: str
    user_id: str
    created_at_ms: int
    reused: bool = False


class Teashop:
    """A card provider defined here, as an app outside the package would: one card per run, confirm once."""

    def __init__(self) -> None:
        self.offers: dict[str, Offer] = {}
        self.bookings: dict[str, Booking] = {}

    def offer(self, run_id: str, user_id: str) -> Offer:
        card = Offer(f"card_tea{len(self.offers)}", run_id, user_id)
        self.offers[card.card_id] = card
        return card

    def cards_for(self, run_id: str) -> list[Offer]:
        return [c for c in self.offers.values() if c.run_id == run_id]

    def get_card(self, card_id: str) -> Offer:
        if card_id not in self.offers:
            raise InvalidRequest(f"no tea card {card_id!r}")
        return self.offers[card_id]

    def confirm_card(self, card_id: str, user_id: str) -> Booking:
        card = self.get_card(card_id)
        if card.user_id != user_id:
            raise InvalidRequest("not yours")
        if card.state == "withdrawn":
            raise InvalidRequest(f"card {card_id} was withdrawn")
        if card_id in self.bookings:
            return Booking(**{**self.bookings[card_id].__dict__, "reused": True})
        self.bookings[card_id] = Booking(f"bk_{card_id}", f"op_{card_id}", card_id, user_id, 1)
        return self.bookings[card_id]


@pytest.fixture
def teashop() -> Iterator[Teashop]:
    shop = Teashop()
    previous = service.register_cards(shop)
    try:
        yield shop
    finally:
        service.register_cards(previous)


@pytest.fixture
def no_cards() -> Iterator[None]:
    previous = service.register_cards(None)
    try:
        yield
    finally:
        service.register_cards(previous)


def _run(user_id: str) -> str:
    c = runs.claim(submit_run(user_id, "tea please"), "w/1")
    assert c is not None
    epoch.raise_epoch(c.run.run_id, c.epoch)
    return c.run.run_id


def test_the_shopping_example_registers_its_cards_on_import():
    assert service.card_provider() is examples.shopping.cards
    assert service.register_cards(examples.shopping.cards) is examples.shopping.cards  # idempotent


def test_the_service_dispatches_to_the_registered_provider_scoped_to_the_caller(mysql_store, teashop):
    run_id = _run("alice")
    card = teashop.offer(run_id, "alice")
    assert service.cards_for(run_id, "alice") == [card] == service.cards_for(run_id)
    with pytest.raises(RunNotFound):
        service.cards_for(run_id, "bob")  # another user's run: not found, exactly as a missing one
    assert service.get_card(card.card_id, "alice") is card
    for who, card_id in (("bob", card.card_id), ("alice", "card_nope")):
        with pytest.raises(service.CardNotFound, match="no"):
            service.get_card(card_id, who)
        with pytest.raises(service.CardNotFound):
            service.confirm_card(card_id, who)
    assert teashop.bookings == {}, "a refused confirm placed nothing"
    first = service.confirm_card(card.card_id, "alice")
    again = service.confirm_card(card.card_id, "alice")
    assert (first.order_id, first.reused) == (again.order_id, False) and again.reused
    teashop.offers["card_w"] = Offer("card_w", run_id, "alice", state="withdrawn")
    with pytest.raises(InvalidRequest, match="withdrawn") as refused:
        service.confirm_card("card_w", "alice")
    assert not isinstance(refused.value, service.CardNotFound)


def test_without_a_provider_a_run_has_no_cards_and_a_card_id_names_none(mysql_store, no_cards):
    run_id = _run("alice")
    assert service.cards_for(run_id, "alice") == []
    with pytest.raises(service.CardNotFound, match="no app in this process offers cards"):
        service.confirm_card("card_x", "alice")


def test_the_api_shows_and_confirms_an_apps_cards_through_the_service(api: Api, teashop):  # noqa: F811
    run_id = _run("alice")
    card = teashop.offer(run_id, "alice")
    shown = api.call("alice", "GET", f"/api/runs/{run_id}").json()["cards"]
    assert shown == [{"card_id": card.card_id, "state": "offered", "items": card.items, "total_cents": 700,
                      "expires_at_ms": card.expires_at_ms}]
    assert api.call("bob", "POST", f"/api/cards/{card.card_id}/confirm").status_code == 404
    orders = [api.call("alice", "POST", f"/api/cards/{card.card_id}/confirm").json() for _ in range(2)]
    assert orders[0]["order_id"] == orders[1]["order_id"] and [o["reused"] for o in orders] == [False, True]
    teashop.offers["card_w"] = Offer("card_w", run_id, "alice", state="withdrawn")
    assert api.call("alice", "POST", "/api/cards/card_w/confirm").status_code == 409


def test_the_api_without_a_provider_shows_no_cards_and_404s_a_confirm(api: Api, no_cards):  # noqa: F811
    run_id = _run("alice")
    assert api.call("alice", "GET", f"/api/runs/{run_id}").json()["cards"] == []
    assert api.call("alice", "POST", "/api/cards/card_0000000000000000/confirm").status_code == 404


def test_the_cli_lists_and_confirms_an_apps_cards_through_the_service(mysql_store, teashop):
    runner = CliRunner()
    run_id = _run("alice")
    card = teashop.offer(run_id, "alice")
    listed = runner.invoke(cli, ["cards", run_id, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [c["note"] for c in json.loads(listed.stdout)] == ["an app's own field"]
    assert card.card_id in runner.invoke(cli, ["status", run_id]).stdout
    done = [runner.invoke(cli, ["confirm", card.card_id, "--user", "alice"]) for _ in range(2)]
    assert [d.stdout.strip() for d in done] == [f"bk_{card.card_id}"] * 2
    refused = runner.invoke(cli, ["confirm", card.card_id, "--user", "bob"])
    assert refused.exit_code != 0 and "no" in refused.output
