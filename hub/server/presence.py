"""Who is on each session: this node's connections, and the other nodes' through the relay.

A connection is on a session while it subscribes to it, has announced it with ``hello``,
or streams into it; its entry says which messages it is streaming there. Every join, leave
and change of an entry goes to this node's connections watching the session's presence
(``subscribe`` with ``presence: true``) and, with a cross-node bus, to the other nodes
(:mod:`hub.server.relay`), which tell theirs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from protocol import PresenceEntry
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
        #: (session id, connection id) -> the messages that connection streams there.
        self.streaming: dict[tuple[str, str], list[str]] = {}
        #: With a cross-node bus: where joins and leaves go out, and the other nodes' table.
        self.relay: Relay | None = None
        #: The connections that have asked to watch some session's presence, until they
        #: close: a join or leave is offered to these, not looked for among every
        #: connection (a scan per join made N subscribers cost O(N^2) to connect).
        self.watchers: set[Peer] = set()

    def get(self, session_id: str) -> dict[str, Peer] | None:
        """This node's connections on the session, by connection id (None: nobody)."""
        return self.sessions.get(session_id)

    def entry(self, peer: Peer, session_id: str) -> PresenceEntry:
        """The connection's entry on one session (what it streams differs by session)."""
        who = peer.entry()
        return PresenceEntry(
            connection_id=peer.connection_id,
            name=who.get("name"),
            role=who.get("role"),
            streaming=list(self.streaming.get((session_id, peer.connection_id), ())),
        )

    def table(self) -> dict[str, list[PresenceEntry]]:
        """This node's table as entries (what the relay's snapshots carry)."""
        return {sid: [self.entry(c, sid) for c in present.values()] for sid, present in self.sessions.items()}

    def present_on(self, peer: Peer) -> list[str]:
        return [sid for sid, present in self.sessions.items() if peer.connection_id in present]

    def _tell(self, session_id: str, action: Literal["join", "leave"], peer: Peer) -> None:
        frame = f.PresenceFrame(session_id=session_id, action=action, entry=self.entry(peer, session_id))
        self.tell_watchers(frame)
        if self.relay is not None:
            self.relay.send(frame)

    def tell_watchers(self, frame: f.PresenceFrame) -> None:
        """Send a join or leave to this node's connections watching the session's presence."""
        watchers = [c for c in self.watchers if frame.session_id in c.presence_watch and not c.closed]
        if not watchers:
            return
        data = encode(frame).decode()
        for other in watchers:
            other.offer(data)

    def watch(self, peer: Peer) -> None:
        """``peer`` watches some session's presence now (``subscribe`` with ``presence``)."""
        self.watchers.add(peer)

    def unwatch(self, peer: Peer) -> None:
        """``peer`` closed."""
        self.watchers.discard(peer)

    def present(self, session_id: str) -> list[PresenceEntry]:
        """Who is on the session: this node's connections, then the other nodes'."""
        entries = [self.entry(c, session_id) for c in self.sessions.get(session_id, {}).values()]
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

    def streams(self, peer: Peer, session_id: str, message_ids: list[str]) -> None:
        """The connection now streams these messages into the session (none: it stopped).
        A stream puts its writer on the session; the writer stays on it once its streams
        end only while it subscribes or announced it (:mod:`.streams` has it leave)."""
        key = (session_id, peer.connection_id)
        if message_ids:
            self.streaming[key] = list(message_ids)
        elif self.streaming.pop(key, None) is None:
            return
        present = self.sessions.get(session_id, {})
        if peer.connection_id not in present:
            if message_ids:
                self.join(peer, session_id)
        elif not peer.closed:  # a closed one leaves next, with its entry as it stands
            self.announce(peer, session_id)

    def leave(self, peer: Peer, session_id: str, *, streams_done: bool = False) -> None:
        """The connection leaves the session, unless it still streams into it (an unsubscribe
        mid-stream): then it leaves when its streams are done (``streams_done``: they are).
        A closed connection leaves at once."""
        key = (session_id, peer.connection_id)
        if self.streaming.get(key) and not (peer.closed or streams_done):
            return
        self.streaming.pop(key, None)
        present = self.sessions.get(session_id)
        if present is not None and present.pop(peer.connection_id, None) is not None:
            if not present:
                del self.sessions[session_id]
            self._tell(session_id, "leave", peer)
