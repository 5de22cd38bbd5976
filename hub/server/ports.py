"""What the server's parts need of each other, as small Protocols.

Streams, presence, the relay, the worker summarizer and turns each take the narrow view
below instead of the whole :class:`~hub.server.hub.Hub`, so none of them imports the hub or
the connection module, and the package has no import cycle (not even behind
``TYPE_CHECKING``; ``scripts/check_cycles.py`` counts those). The hub and its connections
satisfy these structurally; nothing here subclasses them. The protocol adapters beside the
server (``/api/chat``, ``/mcp``) have their own port, :mod:`hub.adapters.port`, which
builds on :class:`Sessions`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from protocol import PresenceEntry
from protocol import frames as f

from ..auth import Grant
from ..manager import SessionManager
from ..session import Session
from ..store.base import Store
from .config import HubConfig
from .turnframes import TurnOffer, TurnStatus

__all__ = [
    "ConnectionRegistry",
    "Peer",
    "PresenceBoard",
    "PresenceTable",
    "ReplyWriter",
    "Responder",
    "Sessions",
    "StreamHost",
    "StreamMirror",
    "TurnHost",
    "TurnRelay",
    "TurnStreams",
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
    """Joining and leaving a session (a stream puts its writer on the session, and its
    entry says what it streams)."""

    def join(self, peer: Peer, session_id: str) -> None: ...
    def leave(self, peer: Peer, session_id: str, *, streams_done: bool = False) -> None: ...
    def streams(self, peer: Peer, session_id: str, message_ids: list[str]) -> None: ...


class PresenceTable(Protocol):
    """This node's presence as the relay sees it: its table, and telling watchers here."""

    def table(self) -> dict[str, list[PresenceEntry]]:
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


class StreamHost(ConnectionRegistry, Sessions, Protocol):
    """What running streams need: the subscribers to send to, the engine to write through,
    the store (silent saves, the bus's relay) and presence (a writer is on its session)."""

    @property
    def store(self) -> Store: ...
    @property
    def presence(self) -> PresenceBoard: ...


# -- turns and the chat endpoints --------------------------------------------------------------


class Responder(Protocol):
    """A connection that answers turns (``take_turns``), as :mod:`.turndispatch` sees it: who it
    is, whether its grant lets it write the session, and sending it the ``turn`` frame
    (``send`` raises :class:`~hub.server.outbox.Evicted` when it cannot take it)."""

    @property
    def connection_id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def grant(self) -> Grant | None: ...
    async def send(self, frame: Any) -> None: ...


class ReplyWriter(Peer, Responder, Protocol):
    """A connection starting a stream, which may be a turn's reply: a peer to the
    streams, the turn's responder to the turn it claims."""


class TurnStreams(Protocol):
    """The streams as turns use them: a turn's reply is a stream it watches, and a
    ``stream_start`` naming a turn starts it once the turn is claimed."""

    @property
    def watchers(self) -> dict[str, list[Callable[[f.StreamFrame], None]]]:
        """Session id -> callbacks given every stream frame of the session."""
        ...

    async def start(self, connection: Peer, request: f.StreamStart) -> dict[str, Any]: ...
    async def stop(self, session_id: str, message_id: str) -> bool:
        """End the stream as it stands (``stopped``) if it runs on this node."""
        ...

    def current(self, session_id: str, message_id: str) -> tuple[dict[str, Any], int] | None:
        """The message so far and its index, on this node or mirrored; None: not streaming."""
        ...

    async def write(self, session_id: str, message_id: str, delta: dict[str, Any]) -> bool:
        """One delta into a stream running on this node, written by the hub (False: none)."""
        ...


class TurnHost(Sessions, Protocol):
    """What turns need of the hub: the auth secret and the node ttl, the store (a turn's
    history, its logged start and end, and the bus that reaches the other nodes' responders)
    and the streams."""

    @property
    def config(self) -> HubConfig: ...
    @property
    def store(self) -> Store: ...
    @property
    def streams(self) -> TurnStreams: ...


class TurnRelay(Protocol):
    """Where turn messages relayed by other nodes go, and what to say on each heartbeat."""

    def heartbeat(self) -> None:
        """Tell the other nodes again how many responders this node has."""
        ...

    def relayed(self, node: str, message: TurnOffer | TurnStatus) -> None: ...
