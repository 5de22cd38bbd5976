"""Streamed messages: a worker writes a reply piece by piece; subscribers watch it grow.

A stream starts by storing the message with no parts (a logged ``message.appended``), then
each delta is applied in memory (in amortized O(1): :class:`~protocol.deltas.GrowingParts`)
and sent to the session's subscribers as a ``stream`` frame with a running ``index``; deltas
are not logged one by one. The message is saved (silently) at most every ``save_every``
seconds while deltas arrive (every ``save_every`` per MiB it holds, past 1 MiB: each save
writes the whole message, so a fixed period would make a big stream quadratic again), so a
crash of the hub loses at most that much of an unfinished stream, and saved for good — with
a logged ``message.updated`` and ``stream.ended`` in one transaction — when the writer
finishes or aborts, when its connection dies (``interrupted``), or when it would grow past
``max_bytes`` (``too_large``: the delta that would cross the limit is refused, not applied,
and what came before is kept). A subscriber that catches up while a stream runs gets its
``state`` (the message so far and its index), then the following deltas. A ``file`` part
follows the file rules of every write, checked for its writer before it applies (an inline
``data:`` file stored and referenced, a reference to a file the writer may not read refused);
the deltas after it wait for that check, so the stream keeps the writer's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from protocol import Conflict, InvalidInput, Message, SessionHubError, StoreError
from protocol import frames as f
from protocol.codec import encode
from protocol.deltas import GrowingParts
from protocol.message import check_json

from ..bus import RemoteBus
from ..store.attachments import attach_files
from ..store.base import LATEST, LogEntry
from .ports import Peer, StreamHost

__all__ = ["LiveStream", "StreamTooLarge", "Streams"]

log = logging.getLogger("sessionhub.streams")

#: A save of a running stream is put off by ``save_every`` per this many bytes it holds.
_SAVE_SCALE = 1 << 20


class StreamTooLarge(SessionHubError):
    """A delta would take its stream past the hub's ``max_stream_bytes``: the stream was
    ended ``too_large`` with what it had, and stored."""

    code = "too_large"


@dataclass
class Mirror:
    """Another node's running stream, rebuilt here from its relayed frames so that a
    subscriber catching up on this node gets its ``state`` too."""

    message: dict[str, Any]  # without its parts
    parts: GrowingParts
    index: int
    seen: float

    def current(self) -> dict[str, Any]:
        return dict(self.message, parts=[dict(p) for p in self.parts.parts()])


@dataclass
class LiveStream:
    session_id: str
    message: Message  # its parts are in ``parts``
    owner: Peer
    parts: GrowingParts = field(default_factory=GrowingParts)
    index: int = 0
    dirty: bool = False
    saver: asyncio.TimerHandle | None = None
    outbox: list[dict[str, Any]] = field(default_factory=list)  # deltas not yet broadcast
    sender: asyncio.TimerHandle | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Connections refused a write into this stream (each is logged once).
    refused: set[str] = field(default_factory=set)
    #: Set while a delta waits on the store (a file part's check): the deltas after it wait
    #: their turn, so the stream keeps the writer's order.
    checking: asyncio.Future[None] | None = None

    def apply(self, request: f.StreamDelta) -> None:
        self.parts.apply(request.kind, request.text, request.part)
        self.index += 1

    def snapshot(self) -> Message:
        return Message(
            id=self.message.id,
            role=self.message.role,
            parts=[dict(p) for p in self.parts.parts()],
            metadata=self.message.metadata,
        )


class Streams:
    """The hub's running streams, and (with a cross-node bus) the other nodes' ones.

    Frames go to this node's subscribers and, through the bus's relay, to the other
    nodes', which deliver them to theirs. A relayed frame lost (a bus outage) leaves a
    subscriber elsewhere with a gap in ``index``; the stream's logged end still brings the
    whole message everywhere.
    """

    #: A mirrored stream with no frame for this long is forgotten (its node died).
    mirror_ttl = 600.0

    def __init__(
        self, hub: StreamHost, save_every: float = 0.1, coalesce: float = 0.005, max_bytes: int = 16 << 20
    ) -> None:
        self.hub = hub
        self.save_every = save_every
        #: The largest message a stream may grow to (UTF-8 text and encoded tool parts).
        self.max_bytes = max_bytes
        self.coalesce = coalesce
        self.active: dict[tuple[str, str], LiveStream] = {}
        self.mirrors: dict[tuple[str, str], Mirror] = {}
        #: session id -> callbacks given every stream frame of the session, this node's and
        #: relayed ones (:mod:`.turndispatch`: the chat endpoints). Local deltas come one by one, at
        #: once, not coalesced: a chat reply's first token is not held back for subscribers.
        self.watchers: dict[str, list[Callable[[f.StreamFrame], None]]] = {}
        bus = hub.store.bus
        self._relay = bus.relay if isinstance(bus, RemoteBus) else None

    def _watch(self, frame: f.StreamFrame) -> None:
        for watcher in self.watchers.get(frame.session_id, ()):
            watcher(frame)

    def _broadcast(self, session_id: str, frame: f.StreamFrame) -> None:
        if frame.action != "delta":  # watchers had each delta already
            self._watch(frame)
        data = encode(frame).decode()  # once, for every subscriber
        self._deliver(session_id, data)
        if self._relay is not None:
            self._relay(data)

    def _deliver(self, session_id: str, data: str) -> None:
        for connection in self.hub.connections:
            if connection.follows(session_id) and not connection.closed:
                connection.offer(data)

    def relayed(self, frame: f.StreamFrame, data: str) -> None:
        """A stream frame from another node: keep its mirror, hand it to our subscribers."""
        key = (frame.session_id, frame.message_id)
        now = time.monotonic()
        if frame.action == "start" and frame.message is not None:
            self.mirrors[key] = Mirror(
                {k: v for k, v in frame.message.items() if k != "parts"}, GrowingParts(), 0, now
            )
        elif frame.action == "delta" and key in self.mirrors:
            mirror = self.mirrors[key]
            mirror.seen = now
            for delta in frame.deltas or ():
                if delta.get("index") == mirror.index + 1:
                    with contextlib.suppress(InvalidInput):
                        mirror.parts.apply(delta.get("kind", ""), delta.get("text"), delta.get("part"))
                    mirror.index += 1
        elif frame.action == "end":
            self.mirrors.pop(key, None)
        self._watch(frame)
        self._deliver(frame.session_id, data)

    def expire_mirrors(self) -> None:
        """Forget mirrored streams silent for :attr:`mirror_ttl` (called on the presence
        heartbeat, not per frame)."""
        now = time.monotonic()
        for stale in [k for k, m in self.mirrors.items() if now - m.seen > self.mirror_ttl]:
            del self.mirrors[stale]

    def _get(self, connection: Peer, session_id: str, message_id: str) -> LiveStream:
        stream = self.active.get((session_id, message_id))
        if stream is None:
            raise InvalidInput(f"no stream {message_id!r} is running in this session")
        if stream.owner is not connection:
            if connection.connection_id not in stream.refused:
                # One line per intruder and stream, not one per delta of a flood.
                stream.refused.add(connection.connection_id)
                log.warning(
                    "refused a write into stream %s of session %s from %s: it belongs to %s",
                    message_id,
                    session_id,
                    connection.name or connection.connection_id,
                    stream.owner.name or stream.owner.connection_id,
                )
            raise Conflict(f"stream {message_id!r} belongs to another connection")
        return stream

    async def start(self, connection: Peer, request: f.StreamStart) -> dict[str, Any]:
        session = await self.hub.session(request.session_id)
        key = (request.session_id, request.message_id)
        if key in self.active or await session.get_message(request.message_id) is not None:
            raise InvalidInput(f"message {request.message_id!r} already exists; stream a new id")
        message = Message(id=request.message_id, role=request.role, parts=[], metadata=request.metadata)
        parent = LATEST if request.parent_id is msgspec.UNSET else request.parent_id
        stream = LiveStream(request.session_id, message, connection)
        self.active[key] = stream
        try:
            await self.hub.manager.append(request.session_id, message, parent)
        except BaseException:
            self.active.pop(key, None)
            raise
        # The writer is on the session while it streams (an inspector lists it under presence,
        # with what it streams), even when it neither subscribed nor announced the session.
        self.hub.presence.streams(connection, request.session_id, self._ids(connection, request.session_id))
        self._broadcast(
            request.session_id,
            f.StreamFrame(
                session_id=request.session_id,
                message_id=message.id,
                action="start",
                index=0,
                message=message.to_dict(),
            ),
        )
        return {"index": 0}

    async def delta(self, connection: Peer, request: f.StreamDelta) -> int:
        stream = self._get(connection, request.session_id, request.message_id)
        if request.part is not None:
            # The rules of an appended message's parts (a part is at level 3): a part the
            # engine would refuse must not reach the store through a stream.
            check_json(request.part, "part", 3)
        if stream.checking is not None or (request.part is not None and request.part.get("type") == "file"):
            request = await self._in_turn(stream, request)
            stream = self._get(connection, request.session_id, request.message_id)  # ended meanwhile?
        size = stream.parts.size_after(request.kind, request.text, request.part)
        if size > self.max_bytes:
            log.warning(
                "stream %s of session %s ended too_large: a delta would take it to %d bytes (limit %d)",
                request.message_id,
                request.session_id,
                size,
                self.max_bytes,
            )
            await self.end(None, stream, "too_large")
            raise StreamTooLarge(
                f"the message would be {size} bytes, over the {self.max_bytes}-byte limit of a streamed"
                f" message: the stream was ended too_large, and what it had ({stream.parts.bytes} bytes)"
                " is stored"
            )
        stream.apply(request)
        entry: dict[str, Any] = {"index": stream.index, "kind": request.kind}
        if request.text is not None:
            entry["text"] = request.text
        if request.part is not None:
            entry["part"] = request.part
        stream.outbox.append(entry)
        if request.session_id in self.watchers:
            self._watch(
                f.StreamFrame(
                    session_id=request.session_id,
                    message_id=request.message_id,
                    action="delta",
                    index=stream.index,
                    deltas=[entry],
                )
            )
        if stream.sender is None:
            stream.sender = asyncio.get_running_loop().call_later(self.coalesce, self._flush, stream)
        if not stream.dirty:
            stream.dirty = True
            loop = asyncio.get_running_loop()
            later = self.save_every * max(1.0, stream.parts.bytes / _SAVE_SCALE)
            stream.saver = loop.call_later(later, lambda: loop.create_task(self._save(stream)))
        return stream.index

    async def _in_turn(self, stream: LiveStream, request: f.StreamDelta) -> f.StreamDelta:
        """``request`` once the deltas before it have applied, its file part (if any) put
        through the file rules of every write for its writer (hub/store/attachments.py): an
        inline file stored, a reference the writer may not read refused (``forbidden``, the
        delta not applied), as the message's final save would refuse it."""
        before, mine = stream.checking, asyncio.get_running_loop().create_future()
        stream.checking = mine
        try:
            if before is not None:
                await before
            part = request.part
            if part is None or part.get("type") != "file":
                return request
            shell = Message(id=stream.message.id, role=stream.message.role, parts=[part])
            checked = await attach_files(self.hub.store, [shell])
            return msgspec.structs.replace(request, part=checked[0].parts[0]) if checked else request
        finally:
            mine.set_result(None)
            if stream.checking is mine:
                stream.checking = None

    def _flush(self, stream: LiveStream) -> None:
        """Broadcast the deltas gathered since the last frame, as one frame."""
        stream.sender = None
        if not stream.outbox:
            return
        deltas, stream.outbox = stream.outbox, []
        self._broadcast(
            stream.session_id,
            f.StreamFrame(
                session_id=stream.session_id,
                message_id=stream.message.id,
                action="delta",
                index=deltas[-1]["index"],
                deltas=deltas,
            ),
        )

    async def _save(self, stream: LiveStream) -> None:
        async with stream.lock:
            if not stream.dirty or self.active.get((stream.session_id, stream.message.id)) is not stream:
                return
            stream.dirty = False
            stream.saver = None
            try:
                await self.hub.store.update_message(stream.session_id, stream.snapshot(), emit=False)
            except StoreError as exc:  # the database out of reach: one line, the store logs the outage
                log.warning("saving stream %s failed (%s); the next delta retries", stream.message.id, exc)
                stream.dirty = False
            except Exception:
                log.exception("saving stream %s failed; the next delta retries", stream.message.id)
                stream.dirty = False

    async def end(self, connection: Peer | None, request: f.StreamEnd | LiveStream, status: str) -> None:
        if isinstance(request, LiveStream):
            stream = request
        else:
            assert connection is not None
            stream = self._get(connection, request.session_id, request.message_id)
        if stream.saver is not None:
            stream.saver.cancel()
        if stream.sender is not None:
            stream.sender.cancel()
        self._flush(stream)  # every delta goes out before the end
        async with stream.lock:
            self.active.pop((stream.session_id, stream.message.id), None)
            final = stream.snapshot()
            ended = LogEntry(
                session_id=stream.session_id,
                type="stream.ended",
                data={"message_id": final.id, "status": status, "deltas": stream.index},
            )
            await self.hub.store.update_message(stream.session_id, final, also=[ended])
        self._left(stream)
        self._broadcast(
            stream.session_id,
            f.StreamFrame(
                session_id=stream.session_id,
                message_id=final.id,
                action="end",
                index=stream.index,
                message=final.to_dict(),
                status=status,
            ),
        )

    def _ids(self, owner: Peer, session_id: str) -> list[str]:
        """The messages ``owner`` streams into the session, oldest first."""
        return [s.message.id for s in self.active.values() if s.owner is owner and s.session_id == session_id]

    def _left(self, stream: LiveStream) -> None:
        """Presence drops the ended stream from its writer's entry; a writer that was on the
        session only for its streams leaves it with the last one (a closed connection leaves
        everything by itself, right after)."""
        owner, sid = stream.owner, stream.session_id
        remaining = self._ids(owner, sid)
        if remaining or owner.closed or owner.follows(sid) or sid in owner.announced:
            self.hub.presence.streams(owner, sid, remaining)
        else:
            self.hub.presence.leave(owner, sid, streams_done=True)

    async def stop(self, session_id: str, message_id: str) -> bool:
        """End a stream running on this node as it stands, with status ``stopped`` (its
        turn was stopped); False when it does not run here."""
        stream = self.active.get((session_id, message_id))
        if stream is None:
            return False
        await self.end(None, stream, "stopped")
        return True

    async def owner_lost(self, connection: Peer) -> None:
        """The writer's connection died: its streams end as ``interrupted``, with what they had."""
        for stream in [s for s in self.active.values() if s.owner is connection]:
            with contextlib.suppress(Exception):
                await self.end(None, stream, "interrupted")

    def current(self, session_id: str, message_id: str) -> tuple[dict[str, Any], int] | None:
        """The message as it stands and its index, this node's stream or another node's
        mirrored here; None when it is not streaming."""
        key = (session_id, message_id)
        live = self.active.get(key)
        if live is not None:
            return live.snapshot().to_dict(), live.index
        mirror = self.mirrors.get(key)
        if mirror is not None:
            return mirror.current(), mirror.index
        return None

    async def write(self, session_id: str, message_id: str, delta: dict[str, Any]) -> bool:
        """One delta written by the hub itself (a user's answer to a tool, a steering
        message), checked and numbered like the writer's own; False when the stream does
        not run on this node."""
        stream = self.active.get((session_id, message_id))
        if stream is None:
            return False
        await self.delta(
            stream.owner, f.StreamDelta(id=0, session_id=session_id, message_id=message_id, **delta)
        )
        return True

    def awaiting(self, session_id: str, message_id: str) -> bool:
        """Whether the stream's last delta was ``await`` (its writer waits for the user)."""
        key = (session_id, message_id)
        live = self.active.get(key)
        if live is not None:
            return live.parts.awaiting
        mirror = self.mirrors.get(key)
        return mirror is not None and mirror.parts.awaiting

    def states(self, session_id: str) -> list[str]:
        """``state`` frames of the session's running streams, this node's and mirrored ones."""
        running = [
            (s.message.id, s.index, s.snapshot().to_dict())
            for (sid, _), s in self.active.items()
            if sid == session_id
        ]
        running += [
            (mid, m.index, m.current()) for (sid, mid), m in self.mirrors.items() if sid == session_id
        ]
        return [
            encode(
                f.StreamFrame(
                    session_id=session_id, message_id=mid, action="state", index=index, message=message
                )
            ).decode()
            for mid, index, message in running
        ]
