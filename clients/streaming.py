"""Streamed messages: :class:`MessageStream` (a writer's side) and :class:`LiveMessages`
(a reader rebuilding each message from ``stream`` frames)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Protocol

from protocol import Event, InvalidInput
from protocol.deltas import apply_delta
from protocol.frames import StreamFrame

__all__ = ["LiveMessages", "MessageStream", "SessionCalls"]


class SessionCalls(Protocol):
    """What a stream needs of its session: one request on it (``RemoteSession._call``)."""

    async def _call(self, op: str, **fields: Any) -> Any: ...


class MessageStream:
    """A message being streamed (``async with session.stream_message(...) as st``).

    ``text``/``reasoning`` append to the message's last part of that kind, ``tool_part``
    sets a tool part (by ``toolCallId``), ``part`` appends any other part, ``reset_step``
    drops the current step's parts. Deltas are sent at once without waiting for their
    replies (at most ``window`` in flight); leaving the block waits for them all and finishes
    the message, or aborts it when the block raised."""

    def __init__(self, session: SessionCalls, message_id: str, window: int = 1000) -> None:
        self.session = session
        self.message_id = message_id
        self.window = window
        self._in_flight: list[asyncio.Task[Any]] = []
        self.deltas = 0

    async def _delta(self, **fields: Any) -> None:
        if len(self._in_flight) >= self.window:
            done, pending = self._in_flight[: self.window // 2], self._in_flight[self.window // 2 :]
            self._in_flight = pending
            await asyncio.gather(*done)
        call = self.session._call("stream_delta", message_id=self.message_id, **fields)
        self._in_flight.append(asyncio.get_running_loop().create_task(call))
        self.deltas += 1
        await asyncio.sleep(0)  # let the frame go out now, in order

    async def text(self, delta: str) -> None:
        await self._delta(kind="text", text=delta)

    async def reasoning(self, delta: str) -> None:
        await self._delta(kind="reasoning", text=delta)

    async def tool_part(self, part: Mapping[str, Any]) -> None:
        await self._delta(kind="tool", part=dict(part))

    async def part(self, part: Mapping[str, Any]) -> None:
        """Append any other part: ``step-start``, ``file``, ``source-*``, ``data-*`` (one
        with an ``id`` replaces its namesake), ``custom``, ``reasoning-file``."""
        await self._delta(kind="part", part=dict(part))

    async def reset_step(self) -> None:
        """Drop the current step's parts (those after the last ``step-start``): the AI
        SDK's ``reset-step``, for a step that is retried."""
        await self._delta(kind="reset")

    async def __aenter__(self) -> MessageStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        results = await asyncio.gather(*self._in_flight, return_exceptions=True)
        self._in_flight.clear()
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        status = "aborted" if exc is not None or failed is not None else "finished"
        await self.session._call("stream_end", message_id=self.message_id, status=status)
        if failed is not None and exc is None:
            raise failed


class LiveMessages:
    """Messages being streamed, as a reader sees them: feed every ``StreamFrame`` (from
    ``HubClient(on_stream=...)``) to :meth:`apply`; it returns the message as it stands now.
    Deltas are applied once each, in index order; a delta that arrives before the ``state``
    it follows is kept until that state comes. ``status[message_id]`` is ``streaming`` from
    the first frame until the end's status (``finished``, ``aborted``, ``interrupted``)."""

    def __init__(self) -> None:
        self.messages: dict[str, dict[str, Any]] = {}
        self.index: dict[str, int] = {}
        self.status: dict[str, str] = {}
        self._early: dict[str, dict[int, dict[str, Any]]] = {}

    def apply(self, frame: StreamFrame) -> dict[str, Any] | None:
        mid = frame.message_id
        if frame.action in ("start", "state", "end") and frame.message is not None:
            if frame.action == "state" and self.index.get(mid, -1) >= frame.index:
                return self.messages.get(mid)
            self.messages[mid] = {**frame.message, "parts": [dict(p) for p in frame.message.get("parts", [])]}
            self.index[mid] = frame.index
            # A message held without an end is "streaming", as in the JS client: a reader
            # can show it as in progress from its first frame on.
            if frame.status is not None:
                self.status[mid] = frame.status
            elif frame.action != "end":
                self.status[mid] = "streaming"
        elif frame.action == "delta":
            pending = self._early.setdefault(mid, {})
            for delta in frame.deltas or []:
                pending[int(delta["index"])] = delta
        early = self._early.get(mid, {})
        while mid in self.index and self.index[mid] + 1 in early:
            self._apply_delta(self.messages[mid], early.pop(self.index[mid] + 1))
            self.index[mid] += 1
        for stale in [i for i in early if i <= self.index.get(mid, -1)]:
            del early[stale]
        return self.messages.get(mid)

    def apply_event(self, event: Event) -> dict[str, Any] | None:
        """Logged changes complete the picture after a reconnect: a stream that ended while
        this client was away shows up as ``message.updated`` then ``stream.ended``."""
        if event.type == "message.updated":
            message = event.data.get("message")
            if isinstance(message, dict) and message.get("id") in self.index:
                mid = str(message["id"])
                self.messages[mid] = {**message, "parts": [dict(p) for p in message.get("parts", [])]}
                return self.messages[mid]
        elif event.type == "stream.ended":
            mid = str(event.data.get("message_id"))
            if mid in self.index:
                self.status[mid] = str(event.data.get("status"))
                self.index[mid] = max(self.index[mid], int(event.data.get("deltas", 0)))
                self._early.pop(mid, None)
                return self.messages.get(mid)
        return None

    @staticmethod
    def _apply_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
        # The hub validated every delta before sending it; one that is not valid is skipped.
        with contextlib.suppress(InvalidInput):
            apply_delta(
                message.setdefault("parts", []), delta.get("kind"), delta.get("text"), delta.get("part")
            )
