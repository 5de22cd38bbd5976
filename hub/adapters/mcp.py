"""The hub's Model Context Protocol adapter: streamable HTTP at ``/mcp``, built on the
official ``mcp`` SDK (an optional extra: ``pip install "sessionhub[mcp]"``).

This module is the door: the origin, the token, the bounded body, the SDK's session
manager run in the app's lifespan. What the server offers (tools, resources) is
:mod:`.mcp_tools`. Everything runs through the hub's own :class:`~hub.SessionManager`, so a
write made here is an event for every WebSocket subscriber. With an auth secret, the bearer
token of each HTTP request is verified as the WebSocket's is, and each call needs the scope
that the equivalent WebSocket operation needs (:data:`hub.auth.OP_LEVELS`).

``/mcp`` speaks both revisions ``mcp`` 2.3 serves: 2026-07-28 (no ``initialize``, each
request self-contained, ``subscriptions/listen`` to follow resources) and 2025-11-25,
stateless (a fresh MCP transport per HTTP request, so any node behind a load balancer
answers). ``/mcp/stateful`` is 2025-11-25 with MCP sessions (``Mcp-Session-Id``, a GET
stream), which ``resources/subscribe`` needs; such a session lives on the node that made
it, is bound to the token's subject, and ends on DELETE or after
:data:`SESSION_IDLE_TIMEOUT`. Every request is authorized on its own token either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from protocol import Forbidden

from .body import BodyError, parse_body, read_body
from .caller import caller, origin_allowed
from .mcp_feed import McpFeed
from .mcp_listen import Listening
from .mcp_resources import CALLER_KEY, URI_PREFIX
from .mcp_tools import McpServer
from .port import Adapter

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.responses import Response
    from starlette.types import Message as AsgiMessage
    from starlette.types import Receive, Scope, Send

    from .port import Served

__all__ = ["MAX_LISTENERS", "MAX_SESSIONS", "SESSION_IDLE_TIMEOUT", "URI_PREFIX", "McpEndpoint", "adapter"]

log = logging.getLogger("sessionhub.mcp")

#: Clients following resources at once (listen streams plus subscribed MCP sessions).
MAX_LISTENERS = 1000
#: Stateful MCP sessions open at once on one node (``/mcp/stateful``).
MAX_SESSIONS = 1000
#: How often the door looks whether the hub has begun to drain (the port has no signal).
_CLOSING_POLL = 0.2
#: Seconds a stateful MCP session with no request in flight and no GET stream is kept.
SESSION_IDLE_TIMEOUT = 600.0


def adapter() -> Adapter | None:
    """MCP at ``/mcp``, or None (with one log line) when the ``mcp`` package is missing."""
    try:
        import mcp.server.lowlevel  # noqa: F401
    except ImportError:
        log.warning('no /mcp endpoint: the mcp package is not installed (pip install "sessionhub[mcp]")')
        return None
    from starlette.routing import BaseRoute, Route

    endpoint = McpEndpoint()
    # Objects, not methods: Starlette then hands them the raw ASGI call, every method.
    routes: list[BaseRoute] = [
        Route("/mcp", endpoint=endpoint.stateless, name="mcp"),
        Route("/mcp/stateful", endpoint=endpoint.stateful, name="mcp_stateful"),
    ]
    return Adapter("mcp", routes, lifespan=endpoint.run)


#: JSON-RPC's codes for a body that is not JSON, and for one refused as a request.
_PARSE_ERROR, _INVALID_REQUEST = -32700, -32600


async def _bounded(scope: Scope, receive: Receive, limit: int) -> Receive:
    """Read the body within ``limit`` (:mod:`.body`), parse it by the socket's rules
    (the SDK's own parser would meet what the socket refuses), and hand the SDK a
    ``receive`` that replays it."""
    from starlette.datastructures import Headers

    # A content type required: the SDK would refuse its absence in plain text.
    data = await read_body(receive, Headers(scope=scope), limit, type_required=True)
    parse_body(data)
    replayed = False

    async def replay() -> AsgiMessage:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": data, "more_body": False}

    return replay


def _rpc_error(exc: BodyError) -> Response:
    """A refused request in JSON-RPC's form, the hub's code in ``data``."""
    from starlette.responses import JSONResponse

    rpc = _PARSE_ERROR if exc.status == 400 else _INVALID_REQUEST
    error = {"code": rpc, "message": str(exc), "data": {"code": exc.code}}
    headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, exc.status, headers=headers)


class McpEndpoint:
    """The MCP door of one hub app: :attr:`stateless` (``/mcp``) and :attr:`stateful`
    (``/mcp/stateful``) are its ASGI apps, :meth:`run` its lifespan (the SDK's session
    managers run once per lifespan, beside the feed its listeners share)."""

    def __init__(self) -> None:
        self.hub: Served | None = None
        self.feed: McpFeed | None = None
        self.tools = McpServer()
        self.stateless = _Door(self, stateful=False)
        self.stateful = _Door(self, stateful=True)

    @contextlib.asynccontextmanager
    async def run(self, hub: Served) -> AsyncIterator[None]:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        limit = hub.config.max_body_bytes
        stateless = StreamableHTTPSessionManager(
            app=self.tools.server, stateless=True, json_response=True, max_request_body_size=limit
        )
        stateful = StreamableHTTPSessionManager(
            app=self.tools.stateful_server,
            json_response=True,
            max_request_body_size=limit,
            session_idle_timeout=SESSION_IDLE_TIMEOUT,
            max_sessions=MAX_SESSIONS,
        )
        feed = McpFeed(hub, MAX_LISTENERS)
        listening = Listening(feed)
        async with stateless.run(), stateful.run():
            self.hub, self.feed = hub, feed
            self.tools.hub, self.tools.listening = hub, listening
            self.stateless.manager, self.stateful.manager = stateless, stateful
            ending = asyncio.get_running_loop().create_task(_end_when_closing(hub, feed, listening))
            try:
                yield
            finally:
                ending.cancel()
                listening.close()
                await feed.close()
                self.hub = self.feed = self.tools.hub = self.tools.listening = None
                self.stateless.manager = self.stateful.manager = None


async def _end_when_closing(hub: Served, feed: McpFeed, listening: Listening) -> None:
    """Once the hub drains, end the listeners: an open listen stream would otherwise hold
    the server's shutdown until its grace period ran out (and then be cut, not closed)."""
    while not hub.closing:  # noqa: ASYNC110 (the port says only whether it is closing)
        await asyncio.sleep(_CLOSING_POLL)
    feed.end_all()
    listening.close()


class _Door:
    """One route of the MCP door, over one SDK session manager."""

    def __init__(self, endpoint: McpEndpoint, *, stateful: bool) -> None:
        self.endpoint = endpoint
        self.is_stateful = stateful
        self.manager: StreamableHTTPSessionManager | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.datastructures import Headers
        from starlette.responses import PlainTextResponse

        hub, manager = self.endpoint.hub, self.manager
        if hub is None or manager is None or hub.closing:
            await PlainTextResponse("server shutting down", status_code=503)(scope, receive, send)
            return
        headers = Headers(scope=scope)
        # A browser page from elsewhere must not drive the hub (the WebSocket's rule).
        if not origin_allowed(headers, hub.config):
            await PlainTextResponse("origin not allowed", status_code=403)(scope, receive, send)
            return
        try:
            # A missing or bad token is refused before its body is read (the MCP
            # authorization spec's 401); a good one is checked per call (.mcp_tools).
            try:
                who = caller(headers, hub.config)
            except Forbidden:
                raise BodyError(
                    401, "unauthorized", "this hub needs a token: Authorization: Bearer <token>"
                ) from None
            if scope.get("method") == "POST":
                receive = await _bounded(scope, receive, hub.config.max_body_bytes)
        except BodyError as exc:
            await _rpc_error(exc)(scope, receive, send)
            return
        # The handlers read the caller from the request they serve (a stateful session's
        # requests run in a task its first request started, with that request's context).
        scope = {**scope, CALLER_KEY: who}
        if self.is_stateful and who.grant is not None:
            # The SDK binds a stateful session to the principal that opened it: another
            # token's subject gets the 404 of a session that does not exist.
            from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
            from mcp.server.auth.provider import AccessToken

            grant = who.grant
            token = AccessToken(token="", client_id=grant.subject, scopes=[], subject=grant.subject)
            scope["user"] = AuthenticatedUser(token)
        await manager.handle_request(scope, receive, send)
