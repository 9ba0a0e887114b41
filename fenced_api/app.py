"""The FastAPI application: `create_app()` mounts every router of the front door."""

from __future__ import annotations

import importlib
from typing import Any

from fastapi import FastAPI

from fenced_api import admin, dashboard, errors, live, metrics, runs

ROUTERS = (runs.router, live.router, dashboard.router, metrics.router, admin.router)
# An API process gives up on an unreachable database sooner than a worker (60 s): a client waits on it.
API_DB_RETRY_S = 5.0


def create_app() -> FastAPI:
    """A new API application (one per process; uvicorn calls it with --factory).

    It imports the modules the workers import (FENCED_IMPORTS), so a submit can refuse an agent no worker
    would know and record the agent's version; and it shortens this process's database retry window."""
    from checkpoints.db import set_retry_window
    from fenced_core.settings import get_settings

    for imported in (m.strip() for m in get_settings().imports.split(",")):
        if imported:
            importlib.import_module(imported)
    set_retry_window(API_DB_RETRY_S)
    app = FastAPI(title="fenced", version="0.1.0",
                  description="Durable, fenced, resumable agent runs: submit, watch, cancel, reply, confirm. "
                              "Every /api route needs `Authorization: Bearer KEY` (`fenced users add NAME`).")
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    _document_auth(app)
    return app


def _document_auth(app: FastAPI) -> None:
    """Declare the Bearer key in /openapi.json (the `caller` dependency reads it itself, so the WebSocket
    routes can use it too; FastAPI's HTTPBearer cannot)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer", "description": "An API key from `fenced users add`"}}
            for path, ops in schema.get("paths", {}).items():
                if path.startswith("/api/"):
                    for op in ops.values():
                        op["security"] = [{"bearer": []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
