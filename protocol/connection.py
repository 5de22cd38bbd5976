"""Sans-I/O protocol state: frames in, effects out, no asyncio.

:class:`ServerConnection` turns client frames into requests to run (or error frames to send)
and keeps the connection's subscriptions within its limit. :class:`ClientConnection`
numbers requests, matches replies, and keeps each subscription's position (epoch and last
seq) so that after a reconnect it can resubscribe exactly where it stopped, and drops any
event it has already delivered.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from .codec import FrameError, decode_frame, decode_request, encode
from .frames import (
    ErrorFrame,
    EventFrame,
    PresenceFrame,
    ReplyFrame,
    Request,
    ResetFrame,
    StreamFrame,
    Subscribe,
    SummarizeFrame,
    TurnFrame,
    Unsubscribe,
)

__all__ = [
    "ClientConnection",
    "Delivered",
    "Failed",
    "Ignored",
    "PresenceChanged",
    "Reset",
    "Resolved",
    "ServerConnection",
    "StreamKey",
    "Streamed",
    "SummaryWanted",
    "TurnGiven",
]

#: A subscription's stream: a session id, or None for the registry.
StreamKey = str | None


class ServerConnection:
    """One client connection, server side."""

    __slots__ = ("max_frame_bytes", "max_subscriptions", "subscriptions")

    def __init__(self, *, max_frame_bytes: int = 1 << 20, max_subscriptions: int = 64) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_subscriptions = max_subscriptions
        self.subscriptions: set[StreamKey] = set()

    def receive_text(self, data: str | bytes) -> Request | ErrorFrame:
        """The request to run, or the error frame that answers the frame."""
        try:
            request = decode_request(data, self.max_frame_bytes)
        except FrameError as exc:
            return exc.frame
        if isinstance(request, Subscribe):
            if request.session_id in self.subscriptions:
                return ErrorFrame(id=request.id, code="invalid", message="already subscribed to this stream")
            if len(self.subscriptions) >= self.max_subscriptions:
                return ErrorFrame(
                    id=request.id,
                    code="too_many",
                    message=f"at most {self.max_subscriptions} subscriptions per connection",
                )
            if request.after_seq < 0:
                return ErrorFrame(id=request.id, code="invalid", message="after_seq must be >= 0")
            self.subscriptions.add(request.session_id)
        elif isinstance(request, Unsubscribe):
            if request.session_id not in self.subscriptions:
                return ErrorFrame(id=request.id, code="not_found", message="not subscribed to this stream")
            self.subscriptions.discard(request.session_id)
        return request

    def subscription_ended(self, key: StreamKey) -> None:
        """The server ended a subscription (a reset, or an error): it no longer counts."""
        self.subscriptions.discard(key)


# -- client side -------------------------------------------------------------------------


@dataclass(frozen=True)
class Resolved:
    id: str | int
    result: Any


@dataclass(frozen=True)
class Failed:
    id: str | int | None
    code: str
    message: str


@dataclass(frozen=True)
class Delivered:
    key: StreamKey
    event: EventFrame


@dataclass(frozen=True)
class Reset:
    key: StreamKey
    frame: ResetFrame


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


ClientEffect = (
    Resolved | Failed | Delivered | Reset | PresenceChanged | SummaryWanted | Streamed | TurnGiven | Ignored
)


@dataclass
class Position:
    epoch: str | None
    seq: int


class ClientConnection:
    """One client, across reconnects: request ids and subscription positions."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.pending: set[str | int] = set()
        self.positions: dict[StreamKey, Position] = {}
        self.presence: set[StreamKey] = set()  # streams followed with presence frames

    def request(self, op: str, **fields: Any) -> tuple[str | int, bytes]:
        """A new request frame and its id."""
        rid = next(self._ids)
        self.pending.add(rid)
        return rid, encode({"op": op, "id": rid, **fields})

    def subscribe(
        self, key: StreamKey, after_seq: int = 0, epoch: str | None = None, *, presence: bool = False
    ) -> tuple[str | int, bytes]:
        """Start following ``key`` from ``after_seq`` (or continue where it was);
        ``presence`` asks for the session's join/leave frames too (kept across reconnects)."""
        position = self.positions.get(key)
        if position is None:
            position = self.positions[key] = Position(epoch, after_seq)
        if presence:
            self.presence.add(key)
        extra = {"presence": True} if key in self.presence else {}
        return self.request(
            "subscribe", session_id=key, after_seq=position.seq, epoch=position.epoch, **extra
        )

    def unsubscribe(self, key: StreamKey) -> tuple[str | int, bytes]:
        self.positions.pop(key, None)
        self.presence.discard(key)
        return self.request("unsubscribe", session_id=key)

    def resubscribe(self) -> list[tuple[str | int, bytes]]:
        """After a reconnect: one subscribe per followed stream, from its last seq."""
        self.pending.clear()
        return [self.subscribe(key) for key in list(self.positions)]

    def receive_text(self, data: str | bytes) -> ClientEffect:
        frame = decode_frame(data)
        if isinstance(frame, ReplyFrame):
            if frame.id not in self.pending:
                return Ignored("reply to an unknown request")
            self.pending.discard(frame.id)
            return Resolved(frame.id, frame.result)
        if isinstance(frame, ErrorFrame):
            if frame.id is not None:
                self.pending.discard(frame.id)
            return Failed(frame.id, frame.code, frame.message)
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
        self.positions.pop(frame.session_id, None)
        return Reset(frame.session_id, frame)
