"""Typed JSON answers for the API's paths asked with a method they do not serve, and for
API paths that do not exist: without these, the static files mounted at ``/`` would take
them and answer a plain-text 404, the one answer of the HTTP doors that is not JSON."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

__all__ = ["unrouted"]

_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _refuse(status: int, code: str, what: str) -> Callable[[Request], Awaitable[JSONResponse]]:
    async def endpoint(request: Request) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {what}"
        return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)

    return endpoint


def unrouted(paths: list[str]) -> list[BaseRoute]:
    """Routes to list after the real ones (a full match here only wins where no real route
    took the method): 405 on each of ``paths``, 404 on any other ``/api/`` path."""
    wrong_method = _refuse(405, "invalid", "this method is not served here")
    routes: list[BaseRoute] = [Route(path, wrong_method, methods=_METHODS) for path in paths]
    routes.append(Route("/api/{rest:path}", _refuse(404, "not_found", "no such endpoint"), methods=_METHODS))
    # A WebSocket on any other path: a 404 saying where the hub is, not the 403 a socket
    # refused by the static files would get (which a client reads as "needs a token").
    routes.append(WebSocketRoute("/{rest:path}", _no_hub_here))
    return routes


async def _no_hub_here(websocket: WebSocket) -> None:
    message = f"no hub endpoint at {websocket.url.path}: the hub's WebSocket is /ws"
    body = JSONResponse({"error": {"code": "not_found", "message": message}}, status_code=404)
    try:
        await websocket.send_denial_response(body)
    except RuntimeError:  # a server without the denial extension: a plain refusal
        await websocket.close()
