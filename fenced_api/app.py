"""The FastAPI application: `create_app()` mounts every router of the front door."""

from __future__ import annotations

import importlib

from fastapi import FastAPI

# Each module defines `router` (an APIRouter); a module not written yet is skipped, so the pieces land
# one by one. Order matters only for overlapping paths (there are none).
ROUTERS = ("fenced_api.runs", "fenced_api.live", "fenced_api.dashboard", "fenced_api.metrics", "fenced_api.admin")


def create_app() -> FastAPI:
    """A new API application (one per process; uvicorn calls it with --factory)."""
    app = FastAPI(title="fenced", version="0.1.0",
                  description="Durable, fenced, resumable agent runs: submit, watch, cancel, reply, confirm.")
    for name in ROUTERS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        app.include_router(module.router)
    return app
