"""What the server's parts need of each other, as small Protocols.

Streams, presence, the relay, the worker summarizer and the MCP endpoint each take the
narrow view below instead of the whole :class:`~hub.server.hub.Hub`, so none of them
imports the hub or the connection module, and the package has no import cycle (not even
behind ``TYPE_CHECKING``; ``scripts/check_cycles.py`` counts those). The hub and its
connections satisfy these structurally; nothing here subclasses them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from protocol import frames as f

from ..manager import SessionManager
from ..session import Session
from ..store.base import Store
from .config import HubConfig

__all__ = [
    "ConnectionRegistry",
    "Peer",
    "PresenceBoard",
    "PresenceTable",
    "Served",
    "Sessions",
    "StreamHost",
    "StreamMirror",
]


class Peer(Protocol):
    """A connected client as the parts outside the connection module see it."""

    @property
    def connection_id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def announced(self) -> frozenset[str]:
        """Sessions declared with ``hello``."""
        ...

    @property
    def summarizer(self) -> bool:
        """Declared with ``hello``: this peer writes summaries."""
        ...

    @property
    def presence_watch(self) -> frozenset[str]:
        """Sessions whose joins and leaves this peer subscribed to."""
        ...

    def entry(self) -> dict[str, Any]:
        """Its presence entry: connection id, name, role."""
        ...

    def follows(self, key: str | None) -> bool: ...
    def offer(self, data: str) -> None:
        """Queue an encoded frame without waiting (fan-out); a peer too far behind is evicted."""
        ...

    async def send(self, frame: Any) -> None: ...
    def may_summarize(self, session_id: str | None) -> bool: ...


class ConnectionRegistry(Protocol):
    """The open connections of this node."""

    @property
    def connections(self) -> Collection[Peer]: ...


class PresenceBoard(Protocol):
    """Joining and leaving a session (streams join their writer to the session)."""

    def join(self, peer: Peer, session_id: str) -> None: ...
    def leave(self, peer: Peer, session_id: str) -> None: ...


class PresenceTable(Protocol):
    """This node's presence as the relay sees it: its table, and telling watchers here."""

    def table(self) -> dict[str, list[dict[str, Any]]]:
        """Session id -> the entries of this node's connections on it."""
        ...

    def tell_watchers(self, frame: f.PresenceFrame) -> None: ...


class StreamMirror(Protocol):
    """Where stream frames relayed by other nodes go."""

    def relayed(self, frame: f.StreamFrame, data: str) -> None: ...
    def expire_mirrors(self) -> None: ...


class Sessions(Protocol):
    """The engine behind the hub: its manager, and a session that must exist."""

    @property
    def manager(self) -> SessionManager: ...
    async def session(self, session_id: str) -> Session:
        """The session, or :class:`~protocol.SessionNotFound`."""
        ...


class Served(Sessions, Protocol):
    """A running hub as an endpoint beside ``/ws`` (MCP) sees it."""

    @property
    def config(self) -> HubConfig: ...
    @property
    def closing(self) -> bool: ...


class StreamHost(ConnectionRegistry, Sessions, Protocol):
    """What running streams need: the subscribers to send to, the engine to write through,
    the store (silent saves, the bus's relay) and presence (a writer is on its session)."""

    @property
    def store(self) -> Store: ...
    @property
    def presence(self) -> PresenceBoard: ...
