"""What hub nodes tell each other besides doorbells: the in-memory state that has no log.

A cross-node bus relays encoded frames (``RemoteBus.relay``). Three kinds travel: stream
frames (:class:`~hub.server.streams.Streams` mirrors them), turn offers and statuses
(:class:`~hub.server.turndispatch.Turns` places turns on nodes with responders), and presence,
kept here. Each keeper is handed in as a port (:mod:`.ports`). Presence is
a per-node table: each node relays every join and leave as it happens and a full snapshot
of its table every ``heartbeat`` seconds; a node not heard from for ``ttl`` seconds is
taken for dead and its connections leave. A node starting up asks the others for their
snapshots, so it knows who is where at once, not a heartbeat later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec

from protocol import PresenceEntry
from protocol import frames as f
from protocol.codec import encode

from ..bus import RemoteBus
from .ports import PresenceTable, StreamMirror, TurnRelay
from .turnframes import TurnOffer, TurnStatus

__all__ = ["NodePresence", "Relay", "Snapshot"]

log = logging.getLogger("sessionhub.relay")


class Snapshot(msgspec.Struct, tag="presence_snapshot", tag_field="frame"):
    """A node's whole presence table: session id -> entries. ``ask``: reply with yours."""

    sessions: dict[str, list[PresenceEntry]]
    ask: bool = False


_decode = msgspec.json.Decoder(f.StreamFrame | f.PresenceFrame | Snapshot | TurnOffer | TurnStatus).decode


class NodePresence:
    """Who is on each session through the *other* nodes."""

    def __init__(
        self,
        local: PresenceTable,
        streams: StreamMirror,
        turns: TurnRelay,
        bus: RemoteBus,
        heartbeat: float = 10.0,
        ttl: float = 30.0,
    ) -> None:
        self.local = local
        self.streams = streams
        self.turns = turns
        self.bus = bus
        self.heartbeat = heartbeat
        self.ttl = ttl
        #: node id -> (last heard, session id -> connection id -> entry)
        self.nodes: dict[str, tuple[float, dict[str, dict[str, PresenceEntry]]]] = {}

    def entries(self, session_id: str) -> list[PresenceEntry]:
        return [e for _, table in self.nodes.values() for e in table.get(session_id, {}).values()]

    def snapshot(self, ask: bool = False) -> Snapshot:
        return Snapshot(sessions=self.local.table(), ask=ask)

    def send_snapshot(self, ask: bool = False) -> None:
        self.bus.relay(encode(self.snapshot(ask)).decode())

    def _table(self, node: str) -> dict[str, dict[str, PresenceEntry]]:
        seen = self.nodes.get(node)
        table = {} if seen is None else seen[1]
        self.nodes[node] = (time.monotonic(), table)
        return table

    def on_frame(self, node: str, frame: f.PresenceFrame) -> None:
        table = self._table(node)
        cid = frame.entry.connection_id
        if frame.action == "join":
            table.setdefault(frame.session_id, {})[cid] = frame.entry
        else:
            present = table.get(frame.session_id, {})
            present.pop(cid, None)
            if not present:
                table.pop(frame.session_id, None)
        self.local.tell_watchers(frame)

    def on_snapshot(self, node: str, snapshot: Snapshot) -> None:
        old = self._table(node)
        new = {sid: {e.connection_id: e for e in entries} for sid, entries in snapshot.sessions.items()}
        self.nodes[node] = (time.monotonic(), new)
        self._announce_changes(old, new)
        if snapshot.ask:
            self.send_snapshot()

    def _announce_changes(
        self, old: dict[str, dict[str, PresenceEntry]], new: dict[str, dict[str, PresenceEntry]]
    ) -> None:
        for sid in old.keys() | new.keys():
            before, after = old.get(sid, {}), new.get(sid, {})
            for cid in before.keys() - after.keys():
                self.local.tell_watchers(f.PresenceFrame(session_id=sid, action="leave", entry=before[cid]))
            # A changed entry (a frame lost on the bus: a stream that started or ended) is a
            # join too, as on the node that has the connection.
            for cid in after:
                if before.get(cid) != after[cid]:
                    self.local.tell_watchers(f.PresenceFrame(session_id=sid, action="join", entry=after[cid]))

    def expire(self) -> None:
        now = time.monotonic()
        for node, (seen, table) in list(self.nodes.items()):
            if now - seen > self.ttl:
                del self.nodes[node]
                self._announce_changes(table, {})

    async def run(self) -> None:
        self.send_snapshot(ask=True)
        while True:
            await asyncio.sleep(self.heartbeat)
            self.send_snapshot()
            self.expire()
            self.streams.expire_mirrors()
            self.turns.heartbeat()


class Relay:
    """Receives what other nodes relay and hands each kind to its keeper."""

    def __init__(
        self,
        local: PresenceTable,
        streams: StreamMirror,
        turns: TurnRelay,
        bus: RemoteBus,
        heartbeat: float = 10.0,
        ttl: float = 30.0,
    ) -> None:
        self.streams = streams
        self.turns = turns
        self.bus = bus
        self.presence = NodePresence(local, streams, turns, bus, heartbeat, ttl)
        self._task: asyncio.Task[None] | None = None
        bus.on_relay = self.received

    def start(self) -> None:
        self.turns.heartbeat()  # before the first heartbeat: who answers turns here
        self._task = asyncio.get_running_loop().create_task(self.presence.run(), name="presence heartbeat")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # An empty table: the other nodes drop this node's connections now, not at the ttl.
        self.bus.relay(encode(Snapshot(sessions={})).decode())

    def send(self, frame: f.PresenceFrame) -> None:
        self.bus.relay(encode(frame).decode())

    def received(self, node: str, data: str) -> None:
        try:
            frame = _decode(data)
        except msgspec.DecodeError:  # ValidationError included
            log.warning("ignoring a malformed relayed frame")
            return
        match frame:
            case f.StreamFrame():
                self.streams.relayed(frame, data)
            case f.PresenceFrame():
                self.presence.on_frame(node, frame)
            case Snapshot():
                self.presence.on_snapshot(node, frame)
            case TurnOffer() | TurnStatus():
                self.turns.relayed(node, frame)
