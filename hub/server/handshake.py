"""Before a socket is served: the bearer token, the Origin and Host checks
(docs/security.md), and the transport kept so that an evicted peer can be cut off."""

from __future__ import annotations

import functools
import ipaddress
import logging
import time
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from .asgiscope import RAW_SEND, TRANSPORT, WRITE_FRAME
from .config import HubConfig

log = logging.getLogger("sessionhub.server")


class KeepTransport:
    """ASGI middleware: keep the server's transport in a WebSocket's (or HTTP request's)
    scope, so that an evicted peer that reads nothing, not even its close frame, can be cut off. uvicorn
    passes its protocol's bound ``send``, whose ``transport`` this is; under another
    server nothing is kept and eviction ends the app instead."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("websocket", "http"):
            # HTTP too: a chat SSE reader that stops reading is cut off the same way.
            keep_transport(scope, send)
        await self.app(scope, receive, send)


def release_handshake(scope: Scope) -> None:
    """Let the handshake's request and response go once the socket is accepted, and the
    scope's headers, read by then (the token, Origin and Host: :func:`token_of`,
    :func:`origin_allowed`): about 0.9 KiB per connection of tuples of bytes (issue 28).
    Emptied in place: starlette's ``WebSocket.headers`` caches this very list.

    uvicorn's ``websockets-sansio`` protocol keeps both (their headers: about 4 KiB per
    connection, measured with tracemalloc) for the socket's whole life, though it reads them
    only until it has accepted. A hub of idle subscribers holds tens of thousands of them.
    Only that protocol's two attributes, only once its handshake is complete; any other
    server (or a version without them) is left alone."""
    headers = scope.get("headers")
    if isinstance(headers, list):
        headers.clear()
    protocol = getattr(scope.get(RAW_SEND), "__self__", None)
    if (
        protocol is not None
        and type(protocol).__name__ == "WebSocketsSansIOProtocol"
        and getattr(protocol, "handshake_complete", False)
        and hasattr(protocol, "request")
        and hasattr(protocol, "response")
    ):
        protocol.request = None
        protocol.response = None


def keep_transport(scope: Scope, send: Send) -> None:
    """What :class:`KeepTransport` keeps in a scope."""
    server_protocol = getattr(send, "__self__", None)
    if scope["type"] == "websocket":
        scope[RAW_SEND] = send
        write_frame = getattr(server_protocol, "write_frame", None)
        if write_frame is not None:
            scope[WRITE_FRAME] = write_frame
    transport = getattr(server_protocol, "transport", None)
    if transport is not None and _cuttable(type(transport)):
        scope[TRANSPORT] = transport


#: Transport classes seen, and whether they can be cut off (asgiscope.Cuttable's methods).
_CUTTABLE: dict[type, bool] = {}


def _cuttable(kind: type) -> bool:
    # Per transport class, not per connection: isinstance against a runtime-checkable
    # Protocol walks its members each time (~0.1 ms per connection, profiled).
    known = _CUTTABLE.get(kind)
    if known is None:
        needed = ("abort", "is_closing", "get_write_buffer_size")
        known = _CUTTABLE[kind] = all(callable(getattr(kind, name, None)) for name in needed)
    return known


def token_of(websocket: WebSocket) -> tuple[str | None, str | None]:
    """The bearer token, from ``Authorization: Bearer <token>`` or, for browsers (which
    cannot set headers on a WebSocket), from the subprotocols ``sessionhub, bearer.<token>``.
    Never from the URL: URLs end up in access logs. Returns the subprotocol to accept."""
    header = websocket.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    for item in offered:
        if item.startswith("bearer.") and token is None:
            token = item[len("bearer.") :]
    return token, ("sessionhub" if "sessionhub" in offered else None)


# -- Origin and Host (docs/security.md) -----------------------------------------------------

_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}


def _hostname(netloc: str) -> str | None:
    """The lowercased host of ``host[:port]`` (brackets of an IPv6 literal dropped), or
    None when it is not a well-formed authority."""
    try:
        parts = urlsplit("//" + netloc)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None or parts.path:
        return None
    return parts.hostname or None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    address = _ip(host)
    return host == "localhost" if address is None else address.is_loopback


def _bind_host(config: HubConfig) -> str | None:
    host = config.bind_host
    if host is None:
        return None
    host = host.strip().strip("[]").lower()
    return None if host in _WILDCARD_HOSTS else host


def _is_hub_name(host: str, config: HubConfig) -> bool:
    """Whether ``host`` (from a Host header) names this hub: a loopback name or address,
    the bind host, an allowed origin's host, or, on a wildcard bind (``0.0.0.0``), any IP
    address (a rebinding page always sends its own DNS name, never an address)."""
    if _is_loopback(host) or host == _bind_host(config):
        return True
    wildcard = config.bind_host is not None and config.bind_host.strip().strip("[]") in _WILDCARD_HOSTS
    if wildcard and _ip(host) is not None:
        return True
    return any(_origin_host(o) == host for o in config.allowed_origins if o != "*")


def _origin_host(origin: str) -> str | None:
    scheme, _, rest = origin.rstrip("/").partition("://")
    if scheme.lower() not in ("http", "https") or not rest:
        return None
    return _hostname(rest)


def host_allowed(host: str | None, config: HubConfig) -> bool:
    """The Host rule: with a secret the token is what counts (a proxy may use any name);
    without one, a Host that is not one of the hub's names is a page that rebound its DNS
    name to this address."""
    if config.auth_secret is not None or "*" in config.allowed_origins or host is None:
        return True
    return _named(host, config)


@functools.lru_cache(maxsize=256)
def _named(host: str, config: HubConfig) -> bool:
    # Cached: parsing the name and its addresses took ~0.2 ms per connection (profiled at
    # 3,000 connects), and a hub hears the same few Host values over and over. The bound
    # keeps a stream of made-up names from growing it.
    name = _hostname(host)
    return name is not None and _is_hub_name(name, config)


def origin_allowed(websocket: WebSocket, config: HubConfig) -> bool:
    """Non-browser clients send no Origin and are judged by their token alone. A browser's
    Origin must be one of ``allowed_origins`` (``*``: any), or have a loopback host (any
    port) or the bind host. Its match with the Host header counts only for an IP address
    (the hub reached by address on a wildcard bind) or with a secret set (behind a proxy;
    a page without a token gets nothing)."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    allowed = {o.rstrip("/").lower() for o in config.allowed_origins}
    if origin.lower() in allowed or "*" in allowed:
        return True
    host = _origin_host(origin)
    if host is None:  # "null" (a sandboxed frame, a file), or not a web origin
        return False
    if _is_loopback(host) or host == _bind_host(config):
        return True
    same = origin.split("://", 1)[-1].lower() == websocket.headers.get("host", "").lower()
    return same and (_ip(host) is not None or config.auth_secret is not None)


class HostCheck:
    """ASGI middleware: requests (HTTP and WebSocket) whose Host is not one of the hub's
    names get 421 and a one-line body, before any route runs (see :func:`host_allowed`)."""

    BODY = "misdirected request: this hub does not answer to that Host name (see docs/security.md)\n"

    def __init__(self, app: ASGIApp, config: HubConfig) -> None:
        self.app = app
        self.config = config
        self.logged = -60.0  # when a refusal was last logged: one line a minute at most

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and await self.refused(scope, receive, send):
            return
        await self.app(scope, receive, send)

    async def refused(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer a request whose Host is not one of the hub's names; whether it was one."""
        host = Headers(scope=scope).get("host")
        if host_allowed(host, self.config):
            return False
        if time.monotonic() - self.logged >= 60:
            self.logged = time.monotonic()
            log.warning(
                "421 for Host %.100r: not one of this hub's names (pass --allowed-origin to add one; "
                "more refusals in the next minute are not logged)",
                host,
            )
        response = PlainTextResponse(self.BODY, status_code=421)
        if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
            await response(scope, receive, send)
        else:  # no denial responses: a close before accepting is an HTTP 403
            await send({"type": "websocket.close", "code": 1008, "reason": "misdirected request"})
        return True
