"""Who is on each session: this node's connections, and the other nodes' through the relay.

A connection is on a session while it subscribes to it, has announced it with ``hello``,
or streams into it. Every join and leave goes to this node's connections watching the
session's presence (``subscribe`` with ``presence: true``) and, with a cross-node bus,
to the other nodes (:mod:`hub.server.relay`), which tell theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from protocol import frames as f
from protocol.codec import encode

from .ports import ConnectionRegistry, Peer

if TYPE_CHECKING:
    from .relay import Relay

__all__ = ["Presence"]


class Presence:
    """The presence table of one node: session id -> connection id -> connection."""

    def __init__(self, peers: ConnectionRegistry) -> None:
        self.peers = peers
        self.sessions: dict[str, dict[str, Peer]] = {}
        #: With a cross-node bus: where joins and leaves go out, and the other nodes' table.
        self.relay: Relay | None = None

    def get(self, session_id: str) -> dict[str, Peer] | None:
        """This node's connections on the session, by connection id (None: nobody)."""
        return self.sessions.get(session_id)

    def table(self) -> dict[str, list[dict[str, Any]]]:
        """This node's table as entries (what the relay's snapshots carry)."""
        return {sid: [c.entry() for c in present.values()] for sid, present in self.sessions.items()}

    def present_on(self, peer: Peer) -> list[str]:
        return [sid for sid, present in self.sessions.items() if peer.connection_id in present]

    def _tell(self, session_id: str, action: Literal["join", "leave"], peer: Peer) -> None:
        frame = f.PresenceFrame(session_id=session_id, action=action, entry=peer.entry())
        self.tell_watchers(frame)
        if self.relay is not None:
            self.relay.send(frame)

    def tell_watchers(self, frame: f.PresenceFrame) -> None:
        """Send a join or leave to this node's connections watching the session's presence."""
        watchers = [
            c for c in self.peers.connections if frame.session_id in c.presence_watch and not c.closed
        ]
        if not watchers:
            return
        data = encode(frame).decode()
        for other in watchers:
            other.offer(data)

    def present(self, session_id: str) -> list[dict[str, Any]]:
        """Who is on the session: this node's connections, then the other nodes'."""
        entries = [c.entry() for c in self.sessions.get(session_id, {}).values()]
        if self.relay is not None:
            entries += self.relay.presence.entries(session_id)
        return entries

    def join(self, peer: Peer, session_id: str) -> None:
        present = self.sessions.setdefault(session_id, {})
        if peer.connection_id not in present:
            present[peer.connection_id] = peer
            self._tell(session_id, "join", peer)

    def announce(self, peer: Peer, session_id: str) -> None:
        """Tell the session's subscribers the connection's new name or role."""
        self._tell(session_id, "join", peer)

    def leave(self, peer: Peer, session_id: str) -> None:
        present = self.sessions.get(session_id)
        if present is not None and present.pop(peer.connection_id, None) is not None:
            if not present:
                del self.sessions[session_id]
            self._tell(session_id, "leave", peer)
