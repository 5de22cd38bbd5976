"""The hub's Model Context Protocol adapter: streamable HTTP at ``/mcp``, built on the
official ``mcp`` SDK (an optional extra: ``pip install "sessionhub[mcp]"``).

This module is the door: the origin, the token, the bounded body, the SDK's session
manager run in the app's lifespan. What the server offers (tools, resources) is
:mod:`.mcp_tools`. Everything runs through the hub's own :class:`~hub.SessionManager`, so a
write made here is an event for every WebSocket subscriber. With an auth secret, the bearer
token of each HTTP request is verified as the WebSocket's is, and each call needs the scope
that the equivalent WebSocket operation needs (:data:`hub.auth.OP_LEVELS`).

The server is stateless (a fresh MCP transport per HTTP request): every request is
authorized on its own token, and no per-client state outlives a request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from protocol import Forbidden

from .body import BodyError, parse_body, read_body
from .caller import caller, origin_allowed
from .mcp_tools import CALLER, URI_PREFIX, McpServer
from .port import Adapter

if TYPE_CHECKING:
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.responses import Response
    from starlette.types import Message as AsgiMessage
    from starlette.types import Receive, Scope, Send

    from .port import Served

__all__ = ["URI_PREFIX", "McpEndpoint", "adapter"]

log = logging.getLogger("sessionhub.mcp")


def adapter() -> Adapter | None:
    """MCP at ``/mcp``, or None (with one log line) when the ``mcp`` package is missing."""
    try:
        import mcp.server.lowlevel  # noqa: F401
    except ImportError:
        log.warning('no /mcp endpoint: the mcp package is not installed (pip install "sessionhub[mcp]")')
        return None
    from starlette.routing import Route

    endpoint = McpEndpoint()
    # An object, not a method: Starlette then hands it the raw ASGI call, every method.
    return Adapter("mcp", [Route("/mcp", endpoint=endpoint, name="mcp")], lifespan=endpoint.run)


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
    """The MCP door of one hub app, an ASGI app mounted at ``/mcp``: :meth:`run` is its
    lifespan (the SDK's session manager runs once per lifespan)."""

    def __init__(self) -> None:
        self._hub: Served | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._tools = McpServer()

    @contextlib.asynccontextmanager
    async def run(self, hub: Served) -> AsyncIterator[None]:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        manager = StreamableHTTPSessionManager(
            app=self._tools.server,
            stateless=True,
            json_response=True,
            max_request_body_size=hub.config.max_body_bytes,
        )
        async with manager.run():
            self._hub, self._manager = hub, manager
            self._tools.hub = hub
            try:
                yield
            finally:
                self._hub = self._manager = self._tools.hub = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.datastructures import Headers
        from starlette.responses import PlainTextResponse

        hub, manager = self._hub, self._manager
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
        # The SDK serves the request in tasks started from here, which inherit this context.
        reset = CALLER.set(who)
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            CALLER.reset(reset)
