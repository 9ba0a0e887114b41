"""Property-based: schemathesis generates valid and malformed requests for every JSON API operation from
/openapi.json and sends them to the app in process (its ASGI transport), on real Redis and MariaDB. No
answer is a 5xx, and a refused request (4xx) writes nothing: no row, no hold, no ledger entry, no
admission slot, no event, no wake-up. CI-sized: a bounded number of examples per operation."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

import checkpoints.db
from fenced_api.app import create_app
from tests.test_api import _running, _waiting, footprint, reset_keys

# The JSON API's operations (the live view, dashboard and metrics have their own tests).
OPERATIONS = [
    ("POST", "/api/runs"),
    ("GET", "/api/runs"),
    ("GET", "/api/runs/{run_id}"),
    ("POST", "/api/runs/{run_id}/cancel"),
    ("POST", "/api/runs/{run_id}/reply"),
    ("POST", "/api/cards/{card_id}/confirm"),
    ("GET", "/api/admin/dead-letters"),
    ("GET", "/api/admin/dead-letters/{run_id}"),
    ("POST", "/api/admin/dead-letters/{run_id}/replay"),
]
EXAMPLES = 12  # per operation, mode and target: ~9 x 2 x 2 x 12 requests, well under a minute


@pytest.fixture
def loaded(mysql_store: str) -> Iterator[tuple[Any, dict[str, str]]]:
    keys = reset_keys()
    try:
        yield schemathesis.openapi.from_asgi("/openapi.json", create_app()), keys
    finally:
        checkpoints.db._retry_window_s = None


CASES = [(m, p, target) for m, p in OPERATIONS for target in ("generated-ids", "real-ids")
         if target == "generated-ids" or "{" in p]


@pytest.mark.parametrize("mode", [GenerationMode.NEGATIVE, GenerationMode.POSITIVE], ids=["malformed", "valid"])
@pytest.mark.parametrize(("method", "path", "target"), CASES, ids=[f"{m} {p} {t}" for m, p, t in CASES])
def test_no_5xx_and_a_refused_request_writes_nothing(loaded, redis_client, method, path, mode, target):
    schema, keys = loaded
    operation = schema[path][method]
    who = "ops" if "/admin/" in path else "alice"
    fixed: dict[str, str] = {}
    if target == "real-ids":
        # Ids that exist (the caller's waiting run and its card; for an admin, a dead letter), so the
        # generated bodies reach the service.
        from checkpoints import runs
        from examples.shopping import cards

        c = _running("alice")
        card = cards.create_cart_card(c, [{"id": "sku-001", "name": "lamp", "price_cents": 100}])
        if who == "ops":
            runs.dead_letter(c, "poison", {})
        else:
            _waiting("alice", c=c)
        names = {p.name for p in operation.path_parameters}
        fixed = {k: v for k, v in {"run_id": c.run.run_id, "card_id": card.card_id}.items() if k in names}
    strategy = operation.as_strategy(mode, path_parameters=fixed or None)
    seen: dict[int, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case: Any) -> None:
        before = footprint(redis_client)
        response = case.call(headers={"Authorization": f"Bearer {keys[who]}"})
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:500])
        if response.status_code >= 400:
            assert footprint(redis_client) == before, (case.as_curl_command(), response.status_code, response.text)
            body = response.json()
            assert body["detail"] and body["code"], response.text

    check()
    assert seen, "no request was sent"
    if mode is GenerationMode.NEGATIVE and target == "generated-ids":
        assert any(400 <= s < 500 for s in seen), seen
