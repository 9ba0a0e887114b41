"""A non-LLM multi-step job as a user writes it: @app.task(base=FencedTask) with three @step functions.

Every step execution is counted in Redis (fenced-test:steps:<run_id>, by step name) and every charge
performed (fenced-test:charges:<run_id>), so a test can tell a replayed step from a re-run one."""

from __future__ import annotations

import time

from fenced import FencedTask, once, step
from fencing.connection import get_redis
from tasks import app, context


def _count(kind: str, field: str) -> None:
    ctx = context.active()
    if ctx is not None:  # outside a run (a unit test calling a step) there is nothing to count
        get_redis().hincrby(f"fenced-test:{kind}:{ctx.run_id}", field, 1)


@step
def fetch_order(order_id: str) -> dict:
    _count("steps", "fetch_order")
    return {"order_id": order_id, "cents": 100 * len(order_id)}


@step
def charge(order: dict) -> dict:
    _count("steps", "charge")
    if order["order_id"].startswith("slow"):
        time.sleep(1.0)

    def perform(key: str) -> dict:
        _count("charges", "performed")  # the outside world: a payment provider would get `key`
        return {"charge_id": f"ch_{key[-12:]}", "cents": order["cents"]}

    return once("charge", order, perform)


@step
def receipt(order: dict, paid: dict) -> str:
    _count("steps", "receipt")
    return f"order {order['order_id']} paid {paid['cents']} cents ({paid['charge_id']})"


@app.task(base=FencedTask)
def checkout(order_id: str) -> dict:
    order = fetch_order(order_id)
    paid = charge(order)
    return {"receipt": receipt(order, paid), "charge_id": paid["charge_id"]}
