"""The rooms of Cloudflare's agent chat (:mod:`.cf_agents`): the sockets of one session on
this node, the replies streaming to them, and what the session's other nodes do.

A tab connected to another hub node must see this one's messages, replies and clears live,
as a second tab on the same node does. The nodes share nothing but the store and the bus,
so each room follows its session's log (:func:`hub.events.follow`, woken by the bus):

- ``message.appended`` / ``updated`` / ``deleted`` (a few coalesced): the stored transcript
  (``cf_agent_chat_messages``) to every socket that shows another one; while a reply streams
  to the room its chunks are the news, and its transcript follows its end;
- ``messages.cleared``: ``cf_agent_chat_clear`` to every socket not already told;
- ``turn.started`` of a turn another node runs: its reply relayed to the room as it streams
  (``cf_agent_use_chat_response`` with the reply's id; the chunks come through the hub's
  stream relay), then the transcript.

What a socket of this node did is told to the others at once, as before; each socket's
known transcript (:attr:`Member.transcript`) keeps the log from telling it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from typing import Any, Protocol

from protocol import SessionHubError, SessionNotFound

from ..events import follow
from ..store.base import session_stream
from .port import ChatHost, ChatTurn
from .replychunks import TurnChunks, turn_chunks

__all__ = ["Member", "Relay", "Room", "enter", "frame", "leave", "relay_of", "transcript_key"]

log = logging.getLogger("sessionhub.chat")


def frame(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, **fields}, separators=(",", ":"))


def transcript_key(messages: list[dict[str, Any]]) -> str:
    """What a socket is known to show, to compare with the stored transcript."""
    return json.dumps(messages, separators=(",", ":"), sort_keys=True)


class Member(Protocol):
    """A socket of a room as the room sees it."""

    #: The transcript it shows (:func:`transcript_key`), None when not known.
    transcript: str | None

    def push(self, text: str) -> None: ...


class Room:
    """The sockets of one session on this node, the replies they are being sent, and the
    session's log followed for what other nodes do (see the module)."""

    def __init__(self, hub: ChatHost, session_id: str) -> None:
        self.hub, self.session_id = hub, session_id
        self.sockets: set[Member] = set()
        self.relays: dict[int, Relay] = {}  # id(turn) -> its relay to this room
        self.follower: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None
        #: Held by whatever reads the stored transcript and tells the sockets, and by a
        #: clear: a read that was in flight across a clear would otherwise tell a tab the
        #: transcript from before it, and mark it as shown after the clear was marked
        #: (then the log's ``messages.cleared`` tells the clearing tab its own clear).
        self.telling = asyncio.Lock()

    async def history(self) -> list[dict[str, Any]]:
        try:
            return [m.to_dict() for m in await self.hub.manager.get_history(self.session_id)]
        except SessionNotFound:
            return []

    def shown(self, messages: list[dict[str, Any]] | None, members: Iterable[Member] | None = None) -> None:
        """``members`` (every socket by default) show ``messages`` now (None: not known)."""
        key = None if messages is None else transcript_key(messages)
        for member in self.sockets if members is None else members:
            member.transcript = key

    async def transcript(self, *, only_stale: bool = False) -> None:
        """The stored transcript to every socket (``only_stale``: to those that show another)."""
        async with self.telling:
            if not self.sockets:
                return
            try:
                messages = await self.history()
            except SessionHubError:
                return
            key, text = transcript_key(messages), frame("cf_agent_chat_messages", messages=messages)
            # An empty transcript read before the log's clear reached this room is that
            # clear: a tab showing messages is told it as one (and the log's then finds it told).
            cleared = frame("cf_agent_chat_clear") if not messages else text
            for member in list(self.sockets):
                if not only_stale or member.transcript != key:
                    member.push(text if member.transcript in (key, None) else cleared)
                    member.transcript = key

    # -- what other nodes do, from the log --------------------------------------------------

    async def start(self) -> None:
        store = self.hub.store
        after = (await store.stream_position(session_stream(self.session_id))).last_seq
        self.follower = asyncio.get_running_loop().create_task(
            self._follow(after), name=f"cf room {self.session_id}"
        )

    def stop(self) -> None:
        for task in (self.follower, self._soon):
            if task is not None:
                task.cancel()

    async def _follow(self, after: int) -> None:
        try:
            async for event in follow(self.hub.store, session_stream(self.session_id), after):
                await self._on(event.type, event.data)
        except asyncio.CancelledError:
            raise
        except Exception:  # the log out of reach: this node's own tabs still hear each other
            log.info("following %s for its other nodes' changes stopped", self.session_id, exc_info=True)

    def _turn_here(self) -> bool:
        return bool(self.relays) or self.hub.turns.in_flight(self.session_id) is not None

    async def _on(self, kind: str, data: dict[str, Any]) -> None:
        if kind in ("message.appended", "message.updated", "message.deleted"):
            # A reply streaming is sent as chunks, and its transcript follows its end.
            if not self._turn_here() and (self._soon is None or self._soon.done()):
                self._soon = asyncio.get_running_loop().create_task(self._transcript_soon())
        elif kind == "messages.cleared":
            cleared, text = transcript_key([]), frame("cf_agent_chat_clear")
            async with self.telling:
                for member in list(self.sockets):
                    if member.transcript != cleared:
                        member.push(text)
                        member.transcript = cleared
        elif kind == "turn.started" and self.hub.turns.in_flight(self.session_id) is None:
            # Another node's turn (this node's own are relayed where they start).
            with contextlib.suppress(SessionHubError):
                turn = await self.hub.turns.find(self.session_id)
                if turn is not None and turn.reply_id == data.get("reply_id"):
                    relay = relay_of(self, self.hub, turn, None, [])
                    relay.deliver(0, False)

    async def _transcript_soon(self) -> None:
        await asyncio.sleep(_COALESCE)  # a burst of writes is one transcript
        await self.transcript(only_stale=True)


#: How long the room waits after a logged change for the next one before it reads the
#: transcript (seconds).
_COALESCE = 0.02

#: (id(hub), session) -> its room: two hubs of one process (two apps, as tests run them) are
#: two sets of rooms, each on its own store. The room holds its hub, so the id is not reused.
_ROOMS: dict[tuple[int, str], Room] = {}
#: The transcript sends in flight (see :meth:`Relay.done`).
_PENDING: set[asyncio.Task[None]] = set()


async def enter(hub: ChatHost, session_id: str, member: Member) -> Room:
    """The session's room on this node, with ``member`` in it (made, and its log followed,
    for the first)."""
    room = _ROOMS.get((id(hub), session_id))
    if room is None:
        room = _ROOMS[id(hub), session_id] = Room(hub, session_id)
        room.sockets.add(member)
        try:
            await room.start()
        except Exception:
            log.info(
                "the log of %s cannot be followed: other nodes' tabs are not heard", session_id, exc_info=True
            )
    else:
        room.sockets.add(member)
    return room


def leave(room: Room, member: Member) -> None:
    for relay in room.relays.values():
        relay.live.discard(member)
    room.sockets.discard(member)
    _close_if_empty(room)


def _close_if_empty(room: Room) -> None:
    """A room with no socket and no reply going goes, with its log follower."""
    key = (id(room.hub), room.session_id)
    if not room.sockets and not room.relays and _ROOMS.get(key) is room:
        del _ROOMS[key]
        room.stop()


class Relay:
    """One turn's chunks to a room: live to every socket that is not replaying, and the
    chunks so far to one that asks to resume. ``request_id`` is what the frames carry: the
    id of the chat request that started it, or the reply's id for a turn from another door."""

    def __init__(self, room: Room, chunks: TurnChunks, request_id: str, message_ids: list[str]) -> None:
        self.room, self.chunks, self.request_id, self.message_ids = room, chunks, request_id, message_ids
        self.sent = 0  # chunks sent live so far
        self.live: set[Member] = set(room.sockets)
        chunks.listeners.append(self)

    def _chunk(self, index: int, *, replay: bool = False) -> str:
        fields: dict[str, Any] = {
            "id": self.request_id,
            "body": self.chunks.texts[index],
            "done": False,
            "seq": index,
        }
        if replay:
            fields["replay"] = True
        return frame("cf_agent_use_chat_response", **fields)

    def _end(self) -> str:
        items = self.chunks.items
        last = items[-1].get("type") if items else None
        outcome = {"finish": "completed", "abort": "aborted"}.get(str(last), "error")
        fields: dict[str, Any] = {"id": self.request_id, "body": "", "done": True, "outcome": outcome}
        if self.message_ids:
            fields["messageIds"] = self.message_ids
        if outcome == "error":
            fields["error"] = True
            fields["body"] = (
                str(items[-1].get("errorText", "the turn failed")) if items else "the turn failed"
            )
        return frame("cf_agent_use_chat_response", **fields)

    def deliver(self, first: int, last: bool) -> None:
        texts = self.chunks.texts
        frames = [self._chunk(i) for i in range(self.sent, len(texts))]
        self.sent = len(texts)
        if last:
            frames.append(self._end())
        for socket in list(self.live):
            for frame in frames:
                socket.push(frame)
        if last:
            self.done()

    def resume(self, socket: Member) -> None:
        """Everything so far as replay, the marker, then live with the others."""
        for i in range(self.sent):
            socket.push(self._chunk(i, replay=True))
        socket.push(
            frame(
                "cf_agent_use_chat_response",
                id=self.request_id,
                body="",
                done=False,
                replay=True,
                replayComplete=True,
            )
        )
        self.live.add(socket)

    def done(self) -> None:
        with contextlib.suppress(ValueError):
            self.chunks.listeners.remove(self)
        turn = self.chunks.turn
        if self.room.relays.get(id(turn)) is self:
            del self.room.relays[id(turn)]
        _close_if_empty(self.room)
        # Held until done: the loop keeps only a weak reference to a task.
        task = asyncio.get_running_loop().create_task(self._transcript())
        _PENDING.add(task)
        task.add_done_callback(_PENDING.discard)

    async def _transcript(self) -> None:
        """The stored transcript to every socket once the reply is whole."""
        await self.room.transcript()


def relay_of(
    room: Room,
    hub: ChatHost,
    turn: ChatTurn,
    request_id: str | None,
    message_ids: list[str],
    primed: bool = False,
) -> Relay:
    """The turn's relay to the room; ``primed``: a new one from the reply as it stands (a
    tab answered a tool of it, and every tab holds it up to here)."""
    relay = room.relays.get(id(turn))
    if primed or relay is None or relay.chunks.turn is not turn:
        relay = room.relays[id(turn)] = Relay(
            room, turn_chunks(hub, turn, primed), request_id or turn.reply_id, message_ids
        )
    return relay
