"""The upgrade's pieces for :mod:`.wsprotocol`: the ASGI scope of a WebSocket handshake,
the HTTP response that denies one (``websocket.http.response.*``), and the permessage-deflate
offer. Each is what uvicorn's ``websockets-sansio`` protocol builds, so that the hub's
protocol and uvicorn's give an app the same scope and a client the same answers.
"""

from __future__ import annotations

import asyncio
import email.utils
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from uvicorn.config import Config
from uvicorn.protocols.utils import get_local_addr, get_remote_addr
from websockets.datastructures import Headers
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.http11 import Request, Response
from websockets.version import version as websockets_version

__all__ = ["asgi_scope", "deflate", "denial_response"]


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return ""


#: One table of status phrases for every connection (uvicorn builds the same).
_PHRASES = {code: _phrase(code) for code in range(100, 600)}

#: websockets 17 documents ISO-8859-1 for header values; earlier versions used surrogate
#: escapes (the same choice uvicorn makes).
_HEADER_ERRORS: tuple[str, str] = (
    ("latin-1", "strict") if websockets_version >= "17.0" else ("ascii", "surrogateescape")
)


def asgi_scope(
    request: Request, transport: asyncio.Transport, config: Config, app_state: dict[str, Any]
) -> dict[str, Any]:
    """The ASGI ``websocket`` scope of a handshake (spec 2.4, with the denial extension)."""
    encoding, errors = _HEADER_ERRORS
    headers = [
        (key.encode("ascii"), value.encode(encoding, errors)) for key, value in request.headers.raw_items()
    ]
    raw_path, _, query_string = request.path.partition("?")
    subprotocols: list[str] = []
    for header in request.headers.get_all("Sec-WebSocket-Protocol"):
        subprotocols.extend(token.strip() for token in header.split(","))
    root_path = config.root_path
    return {
        "type": "websocket",
        "asgi": {"version": config.asgi_version, "spec_version": "2.4"},
        "http_version": "1.1",
        # The config says, once for all (the transport's get_extra_info("sslcontext") cost
        # 2.4% of a connect's server CPU on uvloop, py-spy; issue 28).
        "scheme": "wss" if config.is_ssl else "ws",
        "server": get_local_addr(transport),
        "client": get_remote_addr(transport),
        "root_path": root_path,
        "path": root_path + unquote(raw_path),
        "raw_path": root_path.encode("ascii") + raw_path.encode("ascii"),
        "query_string": query_string.encode("ascii"),
        "headers": headers,
        "subprotocols": subprotocols,
        "state": app_state.copy(),
        "extensions": {"websocket.http.response": {}},
    }


def denial_response(status: int, headers: list[tuple[str, str]], body: bytes) -> Response:
    """The app's HTTP answer instead of an upgrade, with the headers it left out."""
    response_headers = Headers(headers)
    response_headers.setdefault("Date", email.utils.formatdate(usegmt=True))
    response_headers.setdefault("Connection", "close")
    response_headers.setdefault("Content-Length", str(len(body)))
    response_headers.setdefault("Content-Type", "text/plain; charset=utf-8")
    return Response(status, _PHRASES[status], response_headers, body)


def deflate() -> list[ServerPerMessageDeflateFactory]:
    """uvicorn's permessage-deflate offer: windows of 4 KiB and a small memLevel keep
    zlib's state per connection small."""
    return [
        ServerPerMessageDeflateFactory(
            server_max_window_bits=12, client_max_window_bits=12, compress_settings={"memLevel": 5}
        )
    ]
