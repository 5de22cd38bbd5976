"""The hub's own WebSocket, ``/ws``, served past Starlette's router and middleware.

An ASGI app's layers stay on the stack for as long as a WebSocket lives: every middleware,
the router, the route, the exception wrappers are one suspended coroutine frame each, per
connection, for hours. Measured with tracemalloc at 2,000 idle subscribers, those layers
held about 6 KiB of each connection's 28 KiB (docs/benchmarks.md, issue 28). So
:class:`SocketLane`, the app's first middleware, serves ``/ws`` itself: the same Host check
(:class:`~.handshake.HostCheck`), the same connection limit (:mod:`.admission`), the
transport kept (:func:`~.handshake.keep_transport`), then the endpoint, in one frame.
Every other request goes down the usual stack.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from .admission import Admission, refuse_websocket, route_path
from .config import HubConfig
from .handshake import HostCheck, keep_transport

__all__ = ["SocketLane"]


class SocketLane:
    """ASGI middleware: a WebSocket to ``path`` is served by the hub directly, unless
    ``turned_away`` refuses it (the endpoint's own checks: Origin, drain, outage)."""

    def __init__(
        self,
        app: ASGIApp,
        config: HubConfig,
        turned_away: Callable[[WebSocket], Awaitable[bool]],
        path: str = "/ws",
    ) -> None:
        self.app = app
        self.host = HostCheck(app, config)
        self.turned_away = turned_away
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hub = getattr(scope["app"].state, "hub", None) if "app" in scope else None
        if scope["type"] != "websocket" or hub is None or route_path(scope) != self.path:
            await self.app(scope, receive, send)
            return
        if await self.host.refused(scope, receive, send):
            return
        admission: Admission = hub.admission
        if admission.full:
            admission.refused_websocket += 1
            await refuse_websocket(receive, send)
            return
        keep_transport(scope, send)
        admission.open += 1
        try:
            websocket = WebSocket(scope, receive, send)
            if not await self.turned_away(websocket):
                await hub.serve(websocket)
        finally:
            admission.open -= 1
