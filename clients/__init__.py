"""Python client of the sessionhub WebSocket hub: :class:`HubClient`.

Clients depend on :mod:`protocol` only, never on the engine (:mod:`hub`). The package, by
concept: :mod:`clients.client` (requests, subscriptions, renewing the token),
:mod:`clients.link` (the socket under it: the reader, reconnects, failover),
:mod:`clients.api` (the engine's API over it), :mod:`clients.streaming` (streamed
messages), :mod:`clients.errors` (the exceptions and error decoding).
"""

from protocol.markers import ParentArg

from .api import LATEST, RemoteSession, RemoteSessions, RemoteTool
from .client import HubClient
from .errors import ConnectionLost, HubError, TokenExpired
from .streaming import LiveMessages, MessageStream
from .turns import Turn

__all__ = [
    "LATEST",
    "ConnectionLost",
    "HubClient",
    "HubError",
    "LiveMessages",
    "MessageStream",
    "ParentArg",
    "RemoteSession",
    "RemoteSessions",
    "RemoteTool",
    "TokenExpired",
    "Turn",
]
