"""The keys the hub's middleware keeps in an ASGI scope (``handshake.KeepTransport``).

A module of its own, importing nothing: the connection (which cuts an evicted peer), the
handshake (which keeps them) and the protocol adapters' SSE feeds (which cut a reader that
stopped reading, :mod:`hub.adapters.sse`) all read them, and the adapters may import no
module of the server that holds connections.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["RAW_SEND", "TRANSPORT", "WRITE_FRAME", "Cuttable"]

#: Where the ASGI server's transport is kept in a WebSocket's scope (see ``KeepTransport``).
TRANSPORT = "sessionhub.transport"
#: Where the ASGI server's own ``send`` is kept (``KeepTransport``): frames go straight to
#: it, not through starlette's WebSocket and exception middleware, two coroutine layers
#: that do nothing for a text frame (docs/benchmarks.md).
RAW_SEND = "sessionhub.send"
#: Where the hub's own WebSocket protocol keeps its ``write_frame`` (hub/server/wsprotocol.py):
#: a live event framed once is written to every subscriber's transport as the same bytes,
#: with no outbox, coroutine or ASGI message per subscriber. Absent under uvicorn's protocols.
WRITE_FRAME = "sessionhub.write_frame"


@runtime_checkable
class Cuttable(Protocol):
    """What the hub needs of a server's transport to cut a peer off: asyncio's and uvloop's
    (whose transports are no ``asyncio.WriteTransport``) both have it."""

    def abort(self) -> None: ...
    def is_closing(self) -> bool: ...
    def get_write_buffer_size(self) -> int: ...
