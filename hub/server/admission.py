"""The connection limit: past ``max_connections`` the hub refuses new connections with a
defined answer instead of degrading every open one (docs/operations.md, "At the limit").

Counted: every WebSocket open on any route (``/ws``, the chat doors) and every HTTP request
being answered (an SSE stream holds its socket as long as a WebSocket does). Not counted,
and always answered: the probes ``/healthz``, ``/readyz`` and ``/metrics``, so a balancer
and a scraper still see a full node.

At the limit a WebSocket is accepted and closed at once with **1013** (try again later)
and :data:`FULL_REASON`: a browser's WebSocket shows a close code and reason, never an HTTP
status, so the answer is one both clients can name. An HTTP request gets **503** with the
hub's JSON error (code ``unavailable``) and ``Retry-After``. Each refusal counts in
``sessionhub_connections_refused_total{kind}``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from .outage import CLOSE_TRY_AGAIN_LATER

__all__ = [
    "CLOSE_FULL",
    "FULL_REASON",
    "PROBES",
    "Admission",
    "AdmissionGate",
    "refuse_websocket",
    "route_path",
]

#: The close code of a WebSocket refused at the limit (RFC 6455's "try again later").
CLOSE_FULL = CLOSE_TRY_AGAIN_LATER
#: Its reason (under the 123 bytes a close frame allows); the clients show it as is.
FULL_REASON = "the hub is at its connection limit; reconnect later or to another node"
#: Answered however full the hub is, and not counted.
PROBES = frozenset({"/healthz", "/readyz", "/metrics"})
#: Seconds a refused HTTP client is told to wait.
RETRY_AFTER = 1


def route_path(scope: Scope) -> str:
    """The path below the mount point, as Starlette's router matches it."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class Admission:
    """The connections being served, against the limit (None: no limit)."""

    __slots__ = ("limit", "open", "refused_http", "refused_websocket")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.open = 0
        self.refused_websocket = 0
        self.refused_http = 0

    @property
    def full(self) -> bool:
        return self.limit is not None and self.open >= self.limit


class AdmissionGate:
    """ASGI middleware applying the hub's :class:`Admission` (``app.state.hub.admission``).
    It wraps a connection once, not its messages: an admitted socket costs nothing more."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        hub = getattr(scope["app"].state, "hub", None) if "app" in scope else None
        if kind not in ("http", "websocket") or hub is None or route_path(scope) in PROBES:
            await self.app(scope, receive, send)
            return
        admission: Admission = hub.admission
        if admission.full:
            if kind == "websocket":
                admission.refused_websocket += 1
                await refuse_websocket(receive, send)
            else:
                admission.refused_http += 1
                await _refuse_http(send, admission.limit)
            return
        admission.open += 1
        try:
            await self.app(scope, receive, send)
        finally:
            admission.open -= 1


async def refuse_websocket(receive: Receive, send: Send) -> None:
    """Accept the socket and close it with 1013 and :data:`FULL_REASON`."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    # Accepted, then closed: a close before accepting is an HTTP 403, which a client must
    # read as "refused for good"; 1013 says "try again", and a browser can read it.
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": CLOSE_FULL, "reason": FULL_REASON})


async def _refuse_http(send: Send, limit: int | None) -> None:
    body: dict[str, Any] = {
        "error": {"code": "unavailable", "message": FULL_REASON, "detail": {"max_connections": limit}}
    }
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
                (b"retry-after", str(RETRY_AFTER).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})
