"""Property-based: schemathesis generates valid and malformed requests for every JSON API operation from
/openapi.json and sends them to the app in process (its ASGI transport), on real Redis and MariaDB. No
answer is a 5xx, and a refused request (4xx) writes nothing: no row, no hold, no ledger entry, no
admission slot, no event, no wake-up. CI-sized: a bounded number of examples per operation.

The operations are the served spec's, every one of them: an operation added to the API is sent requests
without a change here (an event stream is cut after its first event, so a live run's never-ending
stream is read up to its snapshot). An operation whose path parameter this file cannot fill with a real
id fails test_every_served_operation_is_covered."""

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

# Every operation of the served spec (the WebSocket routes, the page and /metrics are not in it: they
# have their own tests).
SPEC = create_app().openapi()
OPERATIONS = sorted((method.upper(), path) for path, ops in SPEC["paths"].items() for method in ops)
# The real ids a path parameter can be given (test_no_5xx_...'s real-ids target).
REAL_IDS = ("run_id", "card_id")
EXAMPLES = 12  # per operation, mode and target: ~11 x 2 x 2 x 12 requests, about a minute


@pytest.fixture
def loaded(mysql_store: str) -> Iterator[tuple[Any, dict[str, str]]]:
    keys = reset_keys()
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", create_app())
        schema.config.max_stream_events = 1  # an event stream is read up to its first event (the opening)
        yield schema, keys
    finally:
        checkpoints.db._retry_window_s = None


CASES = [(m, p, target) for m, p in OPERATIONS for target in ("generated-ids", "real-ids")
         if target == "generated-ids" or "{" in p]


def test_every_served_operation_is_covered(loaded):
    """The operations the app serves in /openapi.json are the ones sent requests below, with real ids
    for each path parameter (a path parameter the real-ids setup cannot fill fails here)."""
    schema, _keys = loaded
    served = sorted((op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations()))
    assert len(served) >= 11, served
    covered = {(m, p) for m, p, _target in CASES}
    assert [op for op in served if op not in covered] == [], "operations no test_no_5xx_... case sends"
    real = {(m, p) for m, p, target in CASES if target == "real-ids"}
    for op in served:
        params = [part[1:-1] for part in op[1].split("/") if part.startswith("{")]
        assert not params or op in real, f"{op}: no real-ids case"
        assert set(params) <= set(REAL_IDS), f"{op}: no real id for {set(params) - set(REAL_IDS)}"


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
        response = case.call(headers={"Authorization": f"Bearer {keys[who]}"}, timeout=20)
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
