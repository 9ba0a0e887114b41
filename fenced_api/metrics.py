"""GET /metrics: the cluster's gauges in Prometheus text format (runs by state, dead letters, queue depth, ...).

Read from the stores at scrape time (tasks.metrics.ClusterCollector), so every replica answers alike and a
replica that restarts loses nothing. Aggregate counts only, no run data: unauthenticated like any
scrape target; keep the API's port on your network. A worker's own counters are on the worker
(FENCED_METRICS_PORT): docs/operators.md.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client.exposition import choose_encoder

from tasks.metrics import cluster_registry

router = APIRouter()
_registry = cluster_registry()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """The exposition in the format the scraper asks for (Prometheus text 0.0.4, or OpenMetrics); a store that
    is down shows as fenced_store_up 0 with its gauges left out (still 200: the scrape itself worked)."""
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await run_in_threadpool(encode, _registry)
    return Response(body, headers={"Content-Type": content_type})
