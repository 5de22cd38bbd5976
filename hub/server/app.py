"""The hub as a Starlette app: its lifespan and routes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket

from ..adapters import adapters
from ..apps.backends import open_backend
from ..bus import Bus
from ..manager import SessionManager
from ..store.base import Store
from .admission import AdmissionGate
from .config import HubConfig
from .handshake import HostCheck, KeepTransport, origin_allowed
from .health import health
from .hub import Hub
from .logfilter import install_log_filters
from .outage import CLOSE_TRY_AGAIN_LATER, OUTAGE_REASON
from .socket_shell import CLOSE_GOING_AWAY
from .socketlane import SocketLane
from .static import WEB_DIR, InspectorFiles
from .unrouted import unrouted
from .workers import WorkerSummarizer


def create_app(
    *,
    db: str | Path = "sessionhub.db",
    bus: str | Bus | None = None,
    store: Store | None = None,
    manager: SessionManager | None = None,
    config: HubConfig | None = None,
    worker_summarizer: WorkerSummarizer | None = None,
    configure_manager: Callable[[SessionManager], object] | None = None,
) -> Starlette:
    """The hub as a Starlette app, mountable in your own.

    Pass ``manager`` (configured with context templates, compaction...) or ``store`` to
    share ones you own (they are not closed on shutdown), or ``db`` (a SQLite path or a
    ``postgresql://`` DSN) and ``bus`` (``memory``, ``postgres``, a ``redis://`` URL or a
    :class:`~hub.bus.Bus`; see :mod:`hub.apps.backends`) to have the app open and close them.
    ``configure_manager(manager)`` is called on the manager the app builds over those,
    before it serves (compaction, context...: what ``sessionhub serve`` sets from its
    options). ``app.state.hub`` is the running :class:`Hub`.
    """
    if manager is not None and configure_manager is not None:
        raise ValueError("pass manager or configure_manager, not both: configure your manager yourself")
    settings = config or HubConfig()
    # The protocol adapters (hub/adapters/: the AI SDK chat, MCP when its package is
    # installed), mounted beside /ws; each sees the hub through hub/adapters/port.py.
    mounted = adapters()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if manager is not None:
                active = manager
            else:
                opened = (
                    store if store is not None else await stack.enter_async_context(open_backend(db, bus))
                )
                active = SessionManager(opened)
                if configure_manager is not None:
                    configure_manager(active)
            hub = Hub(active.store, active, settings, worker_summarizer)
            app.state.hub = hub
            for adapter in mounted:
                if adapter.lifespan is not None:
                    await stack.enter_async_context(adapter.lifespan(hub))
            try:
                yield
            finally:
                await hub.drain()

    async def healthz(request: HttpRequest) -> JSONResponse:
        return await health(request.app.state.hub, ready=False)

    async def readyz(request: HttpRequest) -> JSONResponse:
        return await health(request.app.state.hub, ready=True)

    async def metrics(request: HttpRequest) -> Response:
        hub: Hub = request.app.state.hub
        await hub.retention.observe()
        return Response(generate_latest(hub.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def turned_away(websocket: WebSocket) -> bool:
        """Refuse a socket the hub will not serve now (its Origin, a drain, an outage)."""
        hub: Hub = websocket.app.state.hub
        if not origin_allowed(websocket, hub.config):
            await websocket.close(1008, "origin not allowed")  # before accept: HTTP 403
            return True
        if hub.closing:
            # Accept, then close with 1001: a close before accepting is an HTTP 403, which a
            # client must read as "refused", not as "try again elsewhere".
            await websocket.accept()
            await websocket.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
            return True
        if hub.store_watch.down:
            await websocket.accept()
            await websocket.close(CLOSE_TRY_AGAIN_LATER, OUTAGE_REASON)
            return True
        return False

    async def ws(websocket: WebSocket) -> None:
        # The checks' frame ends before the socket is served: it is not held per connection.
        if not await turned_away(websocket):
            await websocket.app.state.hub.serve(websocket)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        WebSocketRoute("/ws", ws),
    ]
    for adapter in mounted:
        routes += adapter.routes
    # Typed JSON for a wrong method or a missing API path (hub/server/unrouted.py).
    routes += unrouted(["/healthz", "/readyz", "/metrics", *(p for a in mounted for p in a.paths)])
    # The browser inspector and the JS client (web/, see docs/inspector.md): static files,
    # no build step, mounted last so that every other route wins.
    # Only the files the inspector needs (hub/server/static.py), not web/test/; in a wheel
    # they are hub/server/web/.
    if WEB_DIR.is_dir():
        routes.append(Mount("/", app=InspectorFiles(WEB_DIR), name="web"))
    # uvicorn's traceback per invalid UTF-8 frame becomes one rate-limited line.
    install_log_filters()
    # The Host check first, so a rebound name is refused before anything else runs.
    # /ws first, past the router and the rest (hub/server/socketlane.py: each layer would be
    # a frame held per connection), with the same checks. Then the Host check, the
    # connection limit (hub/server/admission.py), the transport kept.
    middleware = [
        Middleware(SocketLane, config=settings, turned_away=turned_away),
        Middleware(HostCheck, config=settings),
        Middleware(AdmissionGate),
        Middleware(KeepTransport),
    ]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
