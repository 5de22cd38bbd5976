"""The hub's ASGI application.

This module serves the engine over HTTP; the WebSocket endpoint (``/ws``) and the
inspector (``/``) build on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .manager import SessionManager
from .store.base import Store
from .store.sqlite import SqliteStore

__all__ = ["create_app"]


def create_app(*, db: str | Path = "sessionhub.db", store: Store | None = None) -> Starlette:
    """A Starlette app serving one store. Pass an open ``store`` to share one you own
    (it is not closed on shutdown), or a ``db`` path to have the app open and close it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned = store is None
        opened = await SqliteStore.open(db) if store is None else store
        app.state.store = opened
        app.state.manager = SessionManager(opened)
        try:
            yield
        finally:
            if owned:
                await opened.close()

    async def healthz(request: Request) -> JSONResponse:
        manager: SessionManager = request.app.state.manager
        # A real read, so a broken database shows up here and not on the first user.
        await manager.store.get_session("")
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[Route("/healthz", healthz)], lifespan=lifespan)
