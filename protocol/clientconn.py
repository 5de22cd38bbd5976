"""Sans-I/O client side of the protocol: calls and frames in, frames to send and effects
out, no asyncio.

:class:`ClientConnection` numbers requests, matches replies, and keeps each subscription's
position (epoch and last seq, the epoch taken from the subscribe reply) so that after a
reconnect it can resubscribe exactly where it stopped, drops any event it has already
delivered, resubscribes after a reset when asked to (``reload``), forgets a subscription
the hub refused, and builds the ``hello`` and ``summary`` frames. Everything the Python
and JS clients must agree on is here (and, ported, in ``web/sessionhub.js``);
``tests/vectors/`` holds the cases both run. The server side is :mod:`protocol.serverconn`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .codec import decode_frame, encode
from .frames import (
    DumpFrame,
    ErrorFrame,
    EventFrame,
    PresenceFrame,
    ReplyFrame,
    ResetFrame,
    SteeringFrame,
    StreamFrame,
    SummarizeFrame,
    ToolAnswerFrame,
    TurnFrame,
    TurnStoppedFrame,
    UnsubscribedFrame,
)
from .serverconn import StreamKey

__all__ = [
    "ClientConnection",
    "ClientEffect",
    "Delivered",
    "Dumped",
    "Failed",
    "Ignored",
    "PresenceChanged",
    "Reset",
    "Resolved",
    "StreamKey",
    "Streamed",
    "SubscribeFailed",
    "Subscribed",
    "SummaryWanted",
    "TurnGiven",
    "TurnNews",
    "TurnStopped",
    "Unsubscribed",
]


@dataclass(frozen=True)
class Resolved:
    id: str | int
    result: Any


@dataclass(frozen=True)
class Failed:
    """An error frame for a request (``id``), or for a frame the hub could not read (``id``
    None). ``detail`` is the frame's structured detail (:func:`protocol.errors.from_wire`)."""

    id: str | int | None
    code: str
    message: str
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class Subscribed:
    """The reply to a subscribe (``result``: ``{epoch, last_seq}``); its epoch is already in
    the position, so a resubscribe made before the first event names it."""

    key: StreamKey
    result: Any


@dataclass(frozen=True)
class SubscribeFailed:
    """The hub refused or ended a subscription (``forbidden``, ``not_found``...): the stream
    is no longer followed, and a reconnect does not resume it."""

    key: StreamKey
    id: str | int
    code: str
    message: str
    detail: dict[str, Any] | None = None


@dataclass(frozen=True)
class Delivered:
    key: StreamKey
    event: EventFrame


@dataclass(frozen=True)
class Reset:
    """The log cannot serve the stream's position. ``resubscribe`` is the subscribe to send
    (from the reset's ``last_seq`` and epoch) when the stream was followed with ``reload``;
    None when the subscription has ended."""

    key: StreamKey
    frame: ResetFrame
    resubscribe: tuple[str | int, bytes] | None = None


@dataclass(frozen=True)
class Unsubscribed:
    """The hub ended the subscription because it could not read the log for a while. The
    position is kept: the shell sends :meth:`ClientConnection.subscribe` for ``key`` again
    after a pause (if it still follows it), and gets every event from where it was."""

    key: StreamKey
    frame: UnsubscribedFrame


@dataclass(frozen=True)
class Dumped:
    """Lines of the dump the ``export`` request ``id`` is waiting for (its reply follows)."""

    id: str | int
    lines: list[str]


@dataclass(frozen=True)
class Ignored:
    """A duplicate event (already delivered before a reconnect) or an unmatched reply."""

    reason: str


@dataclass(frozen=True)
class PresenceChanged:
    frame: PresenceFrame


@dataclass(frozen=True)
class SummaryWanted:
    frame: SummarizeFrame


@dataclass(frozen=True)
class Streamed:
    frame: StreamFrame


@dataclass(frozen=True)
class TurnGiven:
    frame: TurnFrame


@dataclass(frozen=True)
class TurnStopped:
    frame: TurnStoppedFrame


@dataclass(frozen=True)
class TurnNews:
    """The user's word for a turn this client answers: a tool's answer or a steering message."""

    frame: ToolAnswerFrame | SteeringFrame


ClientEffect = (
    Resolved
    | Failed
    | Subscribed
    | SubscribeFailed
    | Delivered
    | Reset
    | Unsubscribed
    | PresenceChanged
    | SummaryWanted
    | Streamed
    | TurnGiven
    | TurnStopped
    | TurnNews
    | Dumped
    | Ignored
)


@dataclass
class Position:
    epoch: str | None
    seq: int


class ClientConnection:
    """One client, across reconnects: request ids, subscription positions and what each
    subscribe is waiting for. The I/O shells (``clients.HubClient``, ``web/sessionhub.js``)
    send the bytes it returns and act on the effects it gives back."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.pending: set[str | int] = set()
        self.positions: dict[StreamKey, Position] = {}
        self.presence: set[StreamKey] = set()  # streams followed with presence frames
        self.reload: set[StreamKey] = set()  # streams that continue by themselves after a reset
        self.subscribing: dict[str | int, StreamKey] = {}  # subscribe requests awaiting a reply

    def request(self, op: str, **fields: Any) -> tuple[str | int, bytes]:
        """A new request frame and its id."""
        rid = next(self._ids)
        self.pending.add(rid)
        return rid, encode({"op": op, "id": rid, **fields})

    def abandon(self, rid: str | int) -> None:
        """No reply to ``rid`` is awaited any more (answered elsewhere, unsent, given up)."""
        self.pending.discard(rid)
        self.subscribing.pop(rid, None)

    def subscribe(
        self,
        key: StreamKey,
        after_seq: int = 0,
        epoch: str | None = None,
        *,
        presence: bool = False,
        reload: bool = False,
    ) -> tuple[str | int, bytes]:
        """Start following ``key`` from ``after_seq`` (or continue where it was);
        ``presence`` asks for the session's join/leave frames too and ``reload`` continues
        after a reset by itself (both kept across reconnects)."""
        position = self.positions.get(key)
        if position is None:
            position = self.positions[key] = Position(epoch, after_seq)
        if presence:
            self.presence.add(key)
        if reload:
            self.reload.add(key)
        self._drop_subscribing(key)  # an earlier subscribe's reply no longer counts
        extra = {"presence": True} if key in self.presence else {}
        rid, data = self.request(
            "subscribe", session_id=key, after_seq=position.seq, epoch=position.epoch, **extra
        )
        self.subscribing[rid] = key
        return rid, data

    def unsubscribe(self, key: StreamKey) -> tuple[str | int, bytes]:
        self.forget(key)
        return self.request("unsubscribe", session_id=key)

    def forget(self, key: StreamKey) -> None:
        """Stop following ``key`` without telling the hub (no socket, or the hub ended it)."""
        self.positions.pop(key, None)
        self.presence.discard(key)
        self.reload.discard(key)
        self._drop_subscribing(key)

    def clear(self) -> None:
        """Follow nothing any more (the client cannot go on)."""
        for key in list(self.positions):
            self.forget(key)

    def resubscribe(self) -> list[tuple[str | int, bytes]]:
        """After a reconnect: one subscribe per followed stream, from its last seq."""
        self.pending.clear()
        self.subscribing.clear()
        return [self.subscribe(key) for key in list(self.positions)]

    def hello(
        self,
        name: str | None = None,
        role: str | None = None,
        sessions: Sequence[str] = (),
        *,
        summarizer: bool = False,
    ) -> bytes | None:
        """The first frame on every socket (id ``hello``; its reply is not awaited), or None
        when there is nothing to announce."""
        if name is None and role is None and not sessions and not summarizer:
            return None
        hello = {"op": "hello", "id": "hello", "name": name, "role": role}
        return encode(hello | {"sessions": list(sessions), "summarizer": summarizer})

    def summary(self, request_id: str, summary: str | None = None, error: str | None = None) -> bytes:
        """A worker's answer to a ``summarize`` frame: its summary, or why there is none."""
        answer: dict[str, Any] = {"op": "summary", "id": f"summary-{request_id}", "request_id": request_id}
        if error is not None:
            answer["error"] = error
        else:
            answer["summary"] = summary
        return encode(answer)

    def take_turns(self) -> bytes:
        """A responder's ``take_turns`` again on a new socket (its reply is not awaited:
        the first one, from ``HubClient.turns()``, was)."""
        return encode({"op": "take_turns", "id": "take_turns"})

    def receive_text(self, data: str | bytes) -> ClientEffect:
        frame = decode_frame(data)
        if isinstance(frame, ReplyFrame):
            if frame.id not in self.pending:
                return Ignored("reply to an unknown request")
            self.pending.discard(frame.id)
            if frame.id in self.subscribing:
                return self._subscribed(self.subscribing.pop(frame.id), frame.result)
            return Resolved(frame.id, frame.result)
        if isinstance(frame, ErrorFrame):
            if frame.id is None:
                return Failed(None, frame.code, frame.message, frame.detail)
            self.pending.discard(frame.id)
            if frame.id in self.subscribing:
                ended = self.subscribing.pop(frame.id)
                self.forget(ended)
                return SubscribeFailed(ended, frame.id, frame.code, frame.message, frame.detail)
            return Failed(frame.id, frame.code, frame.message, frame.detail)
        if isinstance(frame, EventFrame):
            key: StreamKey = None if frame.stream == "registry" else frame.session_id
            position = self.positions.get(key)
            if position is None:
                return Ignored("event for a stream not followed")
            if position.epoch == frame.epoch and frame.seq <= position.seq:
                return Ignored("already delivered")
            position.epoch, position.seq = frame.epoch, frame.seq
            return Delivered(key, frame)
        if isinstance(frame, PresenceFrame):
            return PresenceChanged(frame)
        if isinstance(frame, SummarizeFrame):
            return SummaryWanted(frame)
        if isinstance(frame, StreamFrame):
            return Streamed(frame)
        if isinstance(frame, TurnFrame):
            return TurnGiven(frame)
        if isinstance(frame, TurnStoppedFrame):
            return TurnStopped(frame)
        if isinstance(frame, ToolAnswerFrame | SteeringFrame):
            return TurnNews(frame)
        if isinstance(frame, DumpFrame):
            if frame.id not in self.pending:
                return Ignored("dump lines for an unknown request")
            return Dumped(frame.id, frame.lines)
        if isinstance(frame, UnsubscribedFrame):
            # It may answer the subscribe request in place of its reply.
            self._drop_subscribing(frame.session_id)
            if frame.session_id not in self.positions:
                return Ignored("unsubscribed from a stream not followed")
            return Unsubscribed(frame.session_id, frame)
        return self._reset(frame)

    def _subscribed(self, key: StreamKey, result: Any) -> Subscribed:
        position = self.positions.get(key)
        if position is not None and position.epoch is None and isinstance(result, dict):
            epoch = result.get("epoch")
            if isinstance(epoch, str):
                position.epoch = epoch
        return Subscribed(key, result)

    def _reset(self, frame: ResetFrame) -> Reset:
        # A reset answers the subscribe request in place of its reply.
        key = frame.session_id
        self._drop_subscribing(key)
        self.positions.pop(key, None)
        if key not in self.reload:
            self.forget(key)
            return Reset(key, frame)
        return Reset(key, frame, self.subscribe(key, frame.last_seq, frame.epoch))

    def _drop_subscribing(self, key: StreamKey) -> None:
        for rid in [rid for rid, k in self.subscribing.items() if k == key]:
            del self.subscribing[rid]
            self.pending.discard(rid)
