"""The hub: the engine served over a WebSocket (``/ws``), plus ``/healthz``, ``/metrics``
and the chat endpoints (``/api/chat``).

One connection runs a reader (frames in, judged by the sans-I/O
:class:`protocol.serverconn.ServerConnection`, whose decisions the shell in
:mod:`.socket_shell` performs), one task per request, one task per subscription that is
catching up, and a drainer that empties a bounded outgoing queue into the socket while frames wait.
Nothing ever waits on a slow peer but that peer's own tasks: a subscriber whose queue stays
full past ``send_timeout`` is closed (code 4008) and resumes from its last seq elsewhere.

Subscriptions are served from the event log. Each followed stream has one *tail*: a task
that reads each new event once from the store (woken by the store's bus) and keeps the
newest ones in memory, so 1,000 subscribers of one session cost one read per change, and a
subscriber that fell behind the tail reads the rest from the log. Positions the log cannot
serve (pruned, another epoch, the future) get a ``reset`` frame, never a silent skip.

The package, one concept a module (docs/architecture.md): :mod:`.config` (the limits),
:mod:`.wire` (engine values as frames), :mod:`.outbox` and :mod:`.tails` (what is held
for peers), :mod:`.connection` (one socket), :mod:`.ops` (what each request runs),
:mod:`.hub` (the registry of connections), :mod:`.turndispatch` (chat turns),
:mod:`.handshake` and :mod:`.app` (HTTP; ``create_app`` mounts the protocol adapters of
:mod:`hub.adapters`: ``/api/chat``, ``/mcp``), :mod:`.ports` (what the parts need of each
other).
"""

from __future__ import annotations

from .app import create_app
from .config import HubConfig
from .hub import Hub
from .socket_shell import CLOSE_GOING_AWAY, CLOSE_SLOW_CONSUMER, CLOSE_TOKEN_EXPIRED, Connection

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_SLOW_CONSUMER",
    "CLOSE_TOKEN_EXPIRED",
    "Connection",
    "Hub",
    "HubConfig",
    "create_app",
]
