"""Checkpoint size per step of the demo agent: what checkpoints A and B store, compressed and as JSON.

One demo run ("buy headphones", the demo's query: plan, search, compare, add to cart, summary) is driven
through real deliveries in this process; then every checkpoint row it wrote is read back.
"""

from __future__ import annotations

import json
from typing import Any

DEMO_QUERY = "buy headphones"


def measure() -> dict[str, Any]:
    import sqlalchemy as sa

    from bench.breakdown import drive
    from checkpoints import codec
    from checkpoints.db import transaction
    from checkpoints.schema import run_steps
    from tasks import submit_run

    run_id = submit_run("checkpoint-size", DEMO_QUERY)
    drive(run_id, lambda *_: None)
    with transaction(readonly=True) as conn:
        rows = conn.execute(sa.select(run_steps.c.step, run_steps.c.phase, run_steps.c.checkpoint)
                            .where(run_steps.c.run_id == run_id).order_by(run_steps.c.id)).all()
    out = [{"step": r.step, "phase": r.phase, "stored_bytes": len(r.checkpoint),
            "json_bytes": len(json.dumps(codec.decode(r.checkpoint), separators=(",", ":")))} for r in rows]
    return {"query": DEMO_QUERY, "rows": out}
