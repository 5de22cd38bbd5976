"""Python client of the sessionhub WebSocket hub: :class:`HubClient` (see :mod:`clients.hub`).

Clients depend on :mod:`protocol` only, never on the engine (:mod:`hub`).
"""

from .hub import (
    LATEST,
    ConnectionLost,
    HubClient,
    HubError,
    LiveMessages,
    MessageStream,
    ParentArg,
    RemoteSession,
    RemoteSessions,
    RemoteTool,
    Turn,
)

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
    "Turn",
]
