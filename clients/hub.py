"""`HubClient`: the engine's API over the hub's WebSocket (``/ws``).

One socket, one reader task. Requests run concurrently on it (each gets an id, and its reply
resolves a future); events are dispatched to per-stream queues. The protocol state (request
ids, each subscription's ``(epoch, seq)``, dropping events already delivered, resubscribing
after a reconnect) lives in :class:`protocol.connection.ClientConnection`; this module only
does the I/O around it.

Reconnects: when the socket drops, requests in flight fail with :class:`ConnectionLost`
(they are not retried: a request may have run before the socket went away), the client
reconnects with exponential backoff (capped by ``max_backoff``), and every subscription
resumes from the last event it delivered: each event is delivered exactly once, in order.
Requests made while the client is reconnecting wait for the new socket (up to
``open_timeout`` seconds).

``parent_id`` arguments take :data:`LATEST` (the default: attach to the latest leaf; the
request leaves ``parent_id`` out), ``None`` (a new root; sent as ``null``) or a message id.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import functools
import inspect
import logging
import random
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Self, TypeVar

import msgspec
from websockets.asyncio.client import ClientConnection as Socket
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from protocol import (
    Compaction,
    Conflict,
    ContextBlock,
    Event,
    InvalidInput,
    InvalidMessage,
    Message,
    NotFound,
    PositionLost,
    SearchResult,
    SessionHubError,
    SessionInfo,
    SessionNotFound,
    StoreError,
    SummarizerError,
)
from protocol.connection import (
    ClientConnection,
    ClientEffect,
    Delivered,
    Failed,
    Ignored,
    PresenceChanged,
    Reset,
    Resolved,
    Streamed,
    StreamKey,
    SummaryWanted,
    TurnGiven,
)
from protocol.deltas import apply_delta
from protocol.frames import EventFrame, PresenceFrame, ResetFrame, StreamFrame, SummarizeFrame
from protocol.markers import LATEST as _LATEST
from protocol.markers import ParentArg

from .turns import Turn, TurnQueue, iterate_turns

__all__ = [
    "LATEST",
    "ConnectionLost",
    "HubClient",
    "HubError",
    "LiveMessages",
    "MessageStream",
    "ParentArg",
    "RemoteSession",
    "RemoteSessions",
    "RemoteTool",
    "Turn",
]

log = logging.getLogger("sessionhub.client")

#: The largest frame the client accepts (a long history is one reply).
MAX_FRAME_BYTES = 16 * 1024 * 1024

_FIRST_BACKOFF = 0.05
#: A connection that stayed up this long resets the backoff: the next reconnect is immediate.
_STABLE_AFTER = 1.0


# The engine's marker: ``hub.LATEST is clients.LATEST``.
LATEST = _LATEST

MessageInput = Message | Mapping[str, Any]

_T = TypeVar("_T")


# -- errors --------------------------------------------------------------------------------


class HubError(SessionHubError):
    """An error frame whose code has no engine exception (``bad_frame``, ``unknown_op``,
    ``too_large``, ``too_many``, ``forbidden``, ``unavailable``). ``code`` is the wire code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionLost(HubError):
    """No answer can come: the socket dropped while the request was in flight, the hub
    could not be reached, or the client was closed. Code ``unavailable``."""

    def __init__(self, message: str = "the connection to the hub was lost") -> None:
        super().__init__("unavailable", message)


_SESSION_NOT_FOUND = re.compile(r"session not found: ('.*'|\".*\")\Z", re.DOTALL)
_INVALID_MESSAGE = re.compile(r"invalid message: (\S+) (.*)\Z", re.DOTALL)


def error_from(code: str, message: str) -> SessionHubError:
    """The exception the engine would have raised for an error frame, as near as the frame
    tells: ``SessionNotFound`` and ``InvalidMessage`` are recognised by their messages."""
    if code == "invalid":
        found = _INVALID_MESSAGE.match(message)
        if found:
            return InvalidMessage(found.group(1), found.group(2))
        return InvalidInput(message)
    if code == "not_found":
        found = _SESSION_NOT_FOUND.match(message)
        if found:
            try:
                session_id = ast.literal_eval(found.group(1))
            except (ValueError, SyntaxError):
                session_id = None
            if isinstance(session_id, str):
                return SessionNotFound(session_id)
        return NotFound(message)
    if code == "conflict":
        return Conflict(message)
    if code == "upstream":
        return SummarizerError(message)
    if code == "internal":
        return StoreError(message)
    return HubError(code, message)


def _position_lost(frame: ResetFrame) -> PositionLost:
    stream = "registry" if frame.session_id is None else frame.session_id
    return PositionLost(
        stream, frame.after_seq, epoch=frame.epoch, first_seq=frame.first_seq, last_seq=frame.last_seq
    )


# -- conversions ---------------------------------------------------------------------------


def _event(frame: EventFrame) -> Event:
    return Event(
        session_id=frame.session_id,
        seq=frame.seq,
        epoch=frame.epoch,
        type=frame.type,
        data=frame.data,
        created_at=datetime.fromisoformat(frame.created_at),
        stream=frame.stream,
    )


def _message_out(message: MessageInput) -> Any:
    if isinstance(message, Message):
        return message.to_dict()
    if isinstance(message, Mapping) and not isinstance(message, dict):
        return dict(message)
    return message  # anything else: the hub answers `invalid`, as the engine would raise


def _parent_fields(parent_id: object) -> dict[str, Any]:
    if parent_id is LATEST:
        return {}
    return {"parent_id": parent_id}


async def _notify(callback: Callable[[Any], Any] | None, frame: Any) -> None:
    """Call a user's frame callback (sync or async); its failure is logged, not raised."""
    if callback is None:
        return
    try:
        outcome = callback(frame)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("%r failed on %s", callback, type(frame).__name__)


def _convert(data: Any, kind: type[_T]) -> _T:
    return msgspec.convert(data, kind)


def _convert_list(data: Any, kind: type[_T]) -> list[_T]:
    return msgspec.convert(data, list[kind])  # type: ignore[valid-type]


def _messages(data: Any) -> list[Message]:
    return [Message.from_dict(m) for m in data]


def _message_or_none(data: Any) -> Message | None:
    return None if data is None else Message.from_dict(data)


# -- subscriptions -------------------------------------------------------------------------


class _End:
    """Queued when the client closes: the subscription ends without an error."""


_END = _End()


@dataclass(eq=False)
class _Subscription:
    key: StreamKey
    reload: bool
    queue: asyncio.Queue[Event | BaseException | _End] = field(default_factory=asyncio.Queue)
    request_id: str | int | None = None
    closing: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)


# -- tools ---------------------------------------------------------------------------------


class RemoteTool:
    """A tool that runs in the hub: ``name``, ``description``, ``input_schema`` (JSON Schema)
    and ``execute(arguments) -> str`` (op ``run_tool``). As with the engine's tools, bad
    arguments come back as an ``Error: ...`` string, not an exception."""

    __slots__ = ("_client", "_session_id", "description", "input_schema", "name")

    def __init__(
        self,
        client: HubClient,
        session_id: str | None,
        name: str,
        description: str,
        input_schema: dict[str, Any],
    ) -> None:
        self._client = client
        self._session_id = session_id
        self.name = name
        self.description = description
        self.input_schema = input_schema

    async def execute(self, arguments: Mapping[str, Any] | str) -> str:
        """Run the tool. ``arguments``: an object, or the raw JSON string a model sent."""
        args = dict(arguments) if isinstance(arguments, Mapping) else arguments
        result = await self._client.request(
            "run_tool", session_id=self._session_id, name=self.name, arguments=args
        )
        return str(result)

    def __repr__(self) -> str:
        return f"RemoteTool({self.name!r})"


def _tools(client: HubClient, session_id: str | None, data: Any) -> list[RemoteTool]:
    return [RemoteTool(client, session_id, t["name"], t["description"], t["input_schema"]) for t in data]


# -- the manager's API ---------------------------------------------------------------------


class RemoteSessions:
    """``SessionManager`` over the socket: the same method names, arguments and result
    types. Departure: :meth:`tools` is a coroutine (it asks the hub)."""

    def __init__(self, client: HubClient) -> None:
        self._client = client

    async def _call(self, op: str, **fields: Any) -> Any:
        return await self._client.request(op, **fields)

    # -- registry ------------------------------------------------------------------------
    async def create(
        self,
        name: str,
        parent_session_id: str | None = None,
        model: str | None = None,
        source: str | None = None,
    ) -> SessionInfo:
        data = await self._call(
            "create", name=name, parent_session_id=parent_session_id, model=model, source=source
        )
        return _convert(data, SessionInfo)

    async def get(self, session_id: str) -> SessionInfo | None:
        data = await self._call("get", session_id=session_id)
        return None if data is None else _convert(data, SessionInfo)

    async def list(self) -> builtins.list[SessionInfo]:
        """Every session, most recently updated first."""
        return _convert_list(await self._call("list"), SessionInfo)

    async def rename(self, session_id: str, name: str) -> SessionInfo:
        return _convert(await self._call("rename", session_id=session_id, name=name), SessionInfo)

    async def delete(self, session_id: str) -> None:
        await self._call("delete", session_id=session_id)

    def get_session(self, session_id: str) -> RemoteSession:
        """The session's own API (no round trip; the registry is not checked)."""
        return RemoteSession(self._client, session_id)

    # -- messages ------------------------------------------------------------------------
    async def append(self, session_id: str, message: MessageInput, parent_id: ParentArg = LATEST) -> str:
        """Append one message (idempotent on its id); returns the message id."""
        data = await self._call(
            "append", session_id=session_id, message=_message_out(message), **_parent_fields(parent_id)
        )
        return str(data)

    async def upsert(self, session_id: str, message: MessageInput, parent_id: ParentArg = LATEST) -> str:
        data = await self._call(
            "upsert", session_id=session_id, message=_message_out(message), **_parent_fields(parent_id)
        )
        return str(data)

    async def append_all(
        self, session_id: str, messages: Sequence[MessageInput], parent_id: ParentArg = LATEST
    ) -> str | None:
        """Append a chain in one transaction; returns the last message's id."""
        batch = (
            [_message_out(m) for m in messages]
            if isinstance(messages, Sequence) and not isinstance(messages, str)
            else messages
        )
        data = await self._call(
            "append_all", session_id=session_id, messages=batch, **_parent_fields(parent_id)
        )
        return None if data is None else str(data)

    async def get_history(self, session_id: str, leaf_id: str | None = None) -> builtins.list[Message]:
        return _messages(await self._call("get_history", session_id=session_id, leaf_id=leaf_id))

    async def get_branches(self, session_id: str, message_id: str) -> builtins.list[Message]:
        return _messages(await self._call("get_branches", session_id=session_id, message_id=message_id))

    async def get_message_count(self, session_id: str) -> int:
        return int(await self._call("get_message_count", session_id=session_id))

    async def clear_messages(self, session_id: str) -> None:
        await self._call("clear_messages", session_id=session_id)

    async def delete_messages(self, session_id: str, ids: Sequence[str]) -> builtins.list[str]:
        out = list(ids) if isinstance(ids, Sequence) and not isinstance(ids, str) else ids
        return _convert_list(await self._call("delete_messages", session_id=session_id, ids=out), str)

    # -- forks, overlays, usage ----------------------------------------------------------
    async def fork(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        data = await self._call("fork", session_id=session_id, at_message_id=at_message_id, name=name)
        return _convert(data, SessionInfo)

    async def add_compaction(self, session_id: str, summary: str, from_id: str, to_id: str) -> Compaction:
        data = await self._call(
            "add_compaction", session_id=session_id, summary=summary, from_id=from_id, to_id=to_id
        )
        return _convert(data, Compaction)

    async def get_compactions(self, session_id: str) -> builtins.list[Compaction]:
        return _convert_list(await self._call("get_compactions", session_id=session_id), Compaction)

    async def compact_and_split(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        data = await self._call("compact_and_split", session_id=session_id, summary=summary, name=name)
        return _convert(data, SessionInfo)

    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo:
        data = await self._call(
            "add_usage",
            session_id=session_id,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost=cost,
        )
        return _convert(data, SessionInfo)

    async def search(self, query: str, limit: int = 20) -> builtins.list[SearchResult]:
        """Every word must match; hits from all sessions, best first."""
        return _convert_list(await self._call("search", query=query, limit=limit), SearchResult)

    async def tools(self) -> builtins.list[RemoteTool]:
        """The manager's tools (``session_search``), run in the hub."""
        return _tools(self._client, None, await self._call("tools", session_id=None))

    # -- events --------------------------------------------------------------------------
    def registry_events(
        self, after_seq: int = 0, *, epoch: str | None = None, reload: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Registry changes: :meth:`HubClient.subscribe` with ``session_id=None``."""
        return self._client.subscribe(None, after_seq, epoch=epoch, reload=reload)


# -- one session's API ---------------------------------------------------------------------


class MessageStream:
    """A message being streamed (``async with session.stream_message(...) as st``).

    ``text``/``reasoning`` append to the message's last part of that kind, ``tool_part``
    sets a tool part (by ``toolCallId``). Deltas are sent at once without waiting for their
    replies (at most ``window`` in flight); leaving the block waits for them all and finishes
    the message, or aborts it when the block raised."""

    def __init__(self, session: RemoteSession, message_id: str, window: int = 1000) -> None:
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
    it follows is kept until that state comes."""

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
            if frame.status is not None:
                self.status[mid] = frame.status
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


class RemoteSession:
    """``Session`` over the socket, for a session of the registry: messages, context blocks,
    the frozen prompt, tools, compaction and events.

    Departure: :meth:`append_message` returns the message id, not whether it was inserted
    (the hub's ``append`` op answers with the id)."""

    def __init__(self, client: HubClient, session_id: str) -> None:
        self._client = client
        self.session_id = session_id

    async def _call(self, op: str, **fields: Any) -> Any:
        return await self._client.request(op, session_id=self.session_id, **fields)

    # -- messages ------------------------------------------------------------------------
    async def append_message(self, message: MessageInput, parent_id: ParentArg = LATEST) -> str:
        """Attach ``message`` to the latest leaf (:data:`LATEST`), to ``parent_id``, or as a
        new root (``None``). Idempotent on the id; returns it."""
        return str(await self._call("append", message=_message_out(message), **_parent_fields(parent_id)))

    async def update_message(self, message: MessageInput) -> bool:
        """Replace a stored message; an unknown id changes nothing (returns False)."""
        return bool(await self._call("update_message", message=_message_out(message)))

    async def get_history(self, leaf_id: str | None = None) -> list[Message]:
        return _messages(await self._call("get_history", leaf_id=leaf_id))

    async def get_message(self, message_id: str) -> Message | None:
        return _message_or_none(await self._call("get_message", message_id=message_id))

    async def get_latest_leaf(self) -> Message | None:
        return _message_or_none(await self._call("get_latest_leaf"))

    async def get_path_length(self, leaf_id: str | None = None) -> int:
        return int(await self._call("get_path_length", leaf_id=leaf_id))

    async def get_branches(self, message_id: str) -> list[Message]:
        return _messages(await self._call("get_branches", message_id=message_id))

    async def delete_messages(self, ids: Sequence[str]) -> list[str]:
        out = list(ids) if isinstance(ids, Sequence) and not isinstance(ids, str) else ids
        return _convert_list(await self._call("delete_messages", ids=out), str)

    async def clear_messages(self) -> None:
        await self._call("clear_messages")

    async def search(self, query: str, limit: int = 20) -> list[SearchResult]:
        """Phrase search over this session's messages, best match first."""
        return _convert_list(await self._call("session_search", query=query, limit=limit), SearchResult)

    # -- overlays and compaction ---------------------------------------------------------
    async def add_compaction(self, summary: str, from_id: str, to_id: str) -> Compaction:
        data = await self._call("add_compaction", summary=summary, from_id=from_id, to_id=to_id)
        return _convert(data, Compaction)

    async def get_compactions(self) -> list[Compaction]:
        return _convert_list(await self._call("get_compactions"), Compaction)

    async def compact(self, leaf_id: str | None = None) -> dict[str, str] | None:
        """Run the hub's compaction on the branch ending at ``leaf_id`` (default: the latest
        leaf). Returns ``{from_message_id, to_message_id, summary}``, or None."""
        data = await self._call("compact", leaf_id=leaf_id)
        return None if data is None else _convert(data, dict[str, str])

    # -- context blocks, the frozen prompt, tools ----------------------------------------
    async def get_context_block(self, label: str) -> ContextBlock | None:
        data = await self._call("get_context_block", label=label)
        return None if data is None else _convert(data, ContextBlock)

    async def get_context_blocks(self) -> list[ContextBlock]:
        return _convert_list(await self._call("get_context_blocks"), ContextBlock)

    async def replace_context_block(self, label: str, content: str) -> ContextBlock:
        return _convert(await self._call("replace_context_block", label=label, content=content), ContextBlock)

    async def append_context_block(self, label: str, content: str) -> ContextBlock:
        return _convert(await self._call("append_context_block", label=label, content=content), ContextBlock)

    async def start_stream(
        self,
        message_id: str,
        parent_id: ParentArg = LATEST,
        role: str = "assistant",
        metadata: Any = None,
    ) -> MessageStream:
        """Store an empty message and return its stream (call ``__aexit__`` or use
        :meth:`stream_message` to finish it)."""
        fields: dict[str, Any] = {"message_id": message_id, "role": role, "metadata": metadata}
        await self._call("stream_start", **fields, **_parent_fields(parent_id))
        return MessageStream(self, message_id)

    @contextlib.asynccontextmanager
    async def stream_message(
        self,
        message_id: str,
        parent_id: ParentArg = LATEST,
        role: str = "assistant",
        metadata: Any = None,
    ) -> AsyncIterator[MessageStream]:
        """``async with session.stream_message("m9") as st: await st.text("Hel")``."""
        stream = await self.start_stream(message_id, parent_id, role, metadata)
        async with stream:
            yield stream

    async def start_turn(self, message_id: str | None = None, trigger: str | None = None) -> dict[str, Any]:
        """Ask a connected responder for a reply to ``message_id`` (default: the latest
        leaf; an assistant message is regenerated). Returns ``{turn_id, reply_id,
        parent_id, trigger}``; the reply streams into the session (hub/turns.py)."""
        fields: dict[str, Any] = {"message_id": message_id}
        if trigger is not None:
            fields["trigger"] = trigger
        return dict(await self._call("start_turn", **fields))

    async def freeze_system_prompt(self) -> str:
        return str(await self._call("freeze_system_prompt"))

    async def refresh_system_prompt(self) -> str:
        return str(await self._call("refresh_system_prompt"))

    async def tools(self) -> list[RemoteTool]:
        """The session's context tools, run in the hub."""
        return _tools(self._client, self.session_id, await self._call("tools"))

    # -- events --------------------------------------------------------------------------
    def subscribe(
        self, after_seq: int = 0, *, epoch: str | None = None, reload: bool = False
    ) -> AsyncGenerator[Event, None]:
        """:meth:`HubClient.subscribe` for this session."""
        return self._client.subscribe(self.session_id, after_seq, epoch=epoch, reload=reload)

    def events(self, after_seq: int = 0, *, epoch: str | None = None) -> AsyncGenerator[Event, None]:
        """Every change after ``after_seq``: the backlog, then live (as ``Session.events``)."""
        return self.subscribe(after_seq, epoch=epoch)

    def __repr__(self) -> str:
        return f"RemoteSession({self.session_id!r})"


# -- the client ----------------------------------------------------------------------------


class HubClient:
    """A connection to a hub, kept open across drops.

    ``token`` is sent as ``Authorization: Bearer <token>``. ``name`` and ``role`` (e.g.
    ``"worker"``, ``"observer"``) are announced to the hub on every (re)connect, with the
    ``sessions`` this client is on besides the ones it subscribes to; they are what
    :meth:`presence` lists. With ``on_presence(frame)`` (sync or async), subscriptions
    ask for the session's join/leave frames and it is called for each. With
    ``reconnect=False`` a dropped socket ends the client: subscriptions raise
    :class:`ConnectionLost`, and so does every later request.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        name: str | None = None,
        role: str | None = None,
        *,
        reconnect: bool = True,
        max_backoff: float = 5.0,
        open_timeout: float = 10,
        sessions: Sequence[str] = (),
        on_presence: Callable[[PresenceFrame], Any] | None = None,
        summarize: Callable[[str], Any] | None = None,
        on_stream: Callable[[StreamFrame], Any] | None = None,
    ) -> None:
        self.url = url
        self.token = token
        self.name = name
        self.role = role
        self.present_on = list(sessions)
        self.on_presence = on_presence
        #: ``summarize(prompt) -> str`` (sync or async): this client writes summaries the hub
        #: asks for (a worker; see ``hub.workers.WorkerSummarizer``).
        self.summarize = summarize
        #: ``on_stream(frame)`` (sync or async): each streamed-message frame of a subscribed
        #: session (feed them to a :class:`LiveMessages`).
        self.on_stream = on_stream
        self._background: set[asyncio.Task[None]] = set()
        self._turns: TurnQueue | None = None  # set while turns() is iterated
        self.reconnect = reconnect
        self.max_backoff = max_backoff
        self.open_timeout = open_timeout
        #: How many times the socket was re-opened after a drop.
        self.reconnects = 0
        self.sessions = RemoteSessions(self)
        self._protocol = ClientConnection()
        self._socket: Socket | None = None
        self._connected = asyncio.Event()
        self._futures: dict[str | int, asyncio.Future[Any]] = {}
        self._subscriptions: dict[StreamKey, _Subscription] = {}
        self._subscribe_ids: dict[str | int, _Subscription] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        #: Set when the client cannot go on (a refused reconnect, a drop without reconnect):
        #: makes the error every later request raises.
        self._failure: Callable[[], SessionHubError] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the socket (raises :class:`ConnectionLost` if the hub cannot be reached)."""
        if self._supervisor is not None:
            return
        if self._closed:
            raise ConnectionLost("the client is closed")
        try:
            socket = await self._open()
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise self._open_error(exc) from exc
        self._socket = socket
        self._connected.set()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._run(socket), name=f"HubClient {self.url}"
        )

    async def aclose(self) -> None:
        """Close the socket. Requests in flight fail with :class:`ConnectionLost`; running
        subscriptions end (their iterators stop)."""
        if self._closed:
            return
        self._closed = True
        socket = self._socket
        self._fail("the client is closed")
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        if socket is not None:
            await socket.close()
        for subscription in self._subscriptions.values():
            subscription.queue.put_nowait(_END)
        if self._turns is not None:
            self._turns.end()

    @property
    def connected(self) -> bool:
        return self._socket is not None

    # -- requests ------------------------------------------------------------------------
    async def request(self, op: str, **fields: Any) -> Any:
        """Send one request and return its reply's ``result`` (raw JSON data). Raises the
        engine's exception for an error frame, :class:`HubError` for a protocol error, and
        :class:`ConnectionLost` when the socket drops before the reply."""
        socket = await self._ready()
        rid, data = self._protocol.request(op, **fields)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[rid] = future
        try:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed:
                raise ConnectionLost() from None
            return await future
        finally:
            self._forget(rid, future)

    async def ping(self) -> float:
        """A round trip through the hub's request loop; returns its duration in seconds."""
        started = time.perf_counter()
        await self.request("ping")
        return time.perf_counter() - started

    def session(self, session_id: str) -> RemoteSession:
        """One session's API: context blocks, tools, compaction, events."""
        return RemoteSession(self, session_id)

    def turns(self) -> AsyncGenerator[Turn, None]:
        """The turns the hub gives this client (a responder; see clients/turns.py):
        ``async for turn in hub.turns(): async with turn.reply() as st: ...``."""
        return iterate_turns(self)

    async def _ready(self) -> Socket:
        """The open socket, waiting for a reconnect up to ``open_timeout``."""
        if self._socket is not None:
            return self._socket
        if self._supervisor is None and not self._closed:
            raise ConnectionLost("the client is not connected: use `async with HubClient(...)`")
        deadline = time.monotonic() + self.open_timeout
        while self._socket is None:
            self._check_usable()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ConnectionLost(f"no connection to the hub within {self.open_timeout:g}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), remaining)
        return self._socket

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure()
        if self._closed:
            raise ConnectionLost("the client is closed")

    # -- subscriptions -------------------------------------------------------------------
    async def subscribe(
        self,
        session_id: str | None,
        after_seq: int = 0,
        *,
        epoch: str | None = None,
        reload: bool = False,
    ) -> AsyncGenerator[Event, None]:
        """Every event of the session (``None``: the registry) after ``after_seq``: the
        backlog, then live, each exactly once and in ``seq`` order, across reconnects.

        When the log cannot serve the position (pruned, another epoch, beyond the end), the
        iterator raises :class:`~protocol.errors.PositionLost` (``epoch``, ``first_seq``,
        ``last_seq``): reload a snapshot and subscribe again from ``last_seq``. With
        ``reload=True`` it does that by itself, silently: it continues from the reset's
        ``last_seq`` and epoch, and the events in between are skipped (the caller is expected
        to re-read the state it needs). Closing the iterator (``break``, ``aclose()``)
        unsubscribes. One subscription per stream per client at a time (``InvalidInput``
        otherwise); any number of streams at once.
        """
        key = session_id
        previous = self._subscriptions.get(key)
        if previous is not None and previous.closing:
            # Its unsubscribe is on the way: wait for it rather than refuse.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(previous.closed.wait(), self.open_timeout)
        if key in self._subscriptions:
            raise InvalidInput(f"already subscribed to {'the registry' if key is None else repr(key)}")
        subscription = _Subscription(key, reload)
        self._subscriptions[key] = subscription
        try:
            socket = await self._ready()
            watch = self.on_presence is not None and key is not None
            rid, data = self._protocol.subscribe(key, after_seq, epoch, presence=watch)
            subscription.request_id = rid
            self._subscribe_ids[rid] = subscription
            # A failed send is not an error: the position is registered, and the reconnect
            # that follows the drop resubscribes from it.
            with contextlib.suppress(ConnectionClosed):
                await socket.send(data, text=True)
            while True:
                item = await subscription.queue.get()
                if isinstance(item, _End):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await self._end_subscription(subscription)

    async def _end_subscription(self, subscription: _Subscription) -> None:
        key = subscription.key
        subscription.closing = True
        try:
            if subscription.request_id is not None:
                self._subscribe_ids.pop(subscription.request_id, None)
            if (
                self._subscriptions.get(key) is subscription
                and key in self._protocol.positions
                and self._socket is not None
                and not self._closed
            ):
                subscription.request_id = None
                # Wait for the reply: the server's events for this stream all come before
                # it, so a new subscription to the stream cannot receive a stale one.
                with contextlib.suppress(SessionHubError, TimeoutError):
                    await asyncio.wait_for(self._unsubscribe(key), self.open_timeout)
            else:
                self._protocol.positions.pop(key, None)
        finally:
            if self._subscriptions.get(key) is subscription:
                del self._subscriptions[key]
            subscription.closed.set()

    async def _unsubscribe(self, key: StreamKey) -> None:
        socket = self._socket
        if socket is None:
            self._protocol.positions.pop(key, None)
            return
        rid, data = self._protocol.unsubscribe(key)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[rid] = future
        try:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed:
                return
            await future
        finally:
            self._forget(rid, future)

    def _forget(self, rid: str | int, future: asyncio.Future[Any]) -> None:
        """The caller is done with the request (answered, failed or cancelled)."""
        if self._futures.get(rid) is future:
            del self._futures[rid]
        self._protocol.pending.discard(rid)
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: a failure nobody waits for is not logged

    # -- the socket ----------------------------------------------------------------------
    async def _open(self) -> Socket:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token is not None else None
        socket = await connect(
            self.url,
            additional_headers=headers,
            max_size=MAX_FRAME_BYTES,
            open_timeout=self.open_timeout,
        )
        if self.name is not None or self.role is not None or self.present_on or self.summarize:
            # First frame on every socket; its reply (id "hello") is not awaited.
            hello: dict[str, Any] = {"op": "hello", "id": "hello", "name": self.name, "role": self.role}
            hello |= {"sessions": self.present_on, "summarizer": self.summarize is not None}
            await socket.send(msgspec.json.encode(hello).decode(), text=True)
        if self._turns is not None:  # a responder again after a reconnect
            await socket.send('{"op":"take_turns","id":"take_turns"}', text=True)
        return socket

    async def presence(self, session_id: str) -> list[dict[str, Any]]:
        """Who is on ``session_id``: ``[{"connection_id", "name", "role"}]``."""
        result = await self.request("presence", session_id=session_id)
        return list(result)

    @staticmethod
    def _open_error(exc: BaseException) -> SessionHubError:
        if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403):
            return HubError("forbidden", f"the hub refused the connection: {exc}")
        return ConnectionLost(f"cannot connect to the hub: {exc}")

    def _fail(self, message: str) -> None:
        """Fail every request in flight with :class:`ConnectionLost` and forget the socket."""
        self._socket = None
        self._connected.clear()
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(ConnectionLost(message))
        self._subscribe_ids.clear()

    async def _run(self, socket: Socket) -> None:
        try:
            await self._supervise(socket)
        except Exception as exc:  # a bug: fail loudly rather than leave callers waiting
            log.exception("the HubClient reader failed")
            message = f"the client's reader failed: {exc!r}"
            current = self._socket
            self._fail(message)
            self._failure = functools.partial(ConnectionLost, message)
            self._end_all(self._failure)
            if current is not None:
                with contextlib.suppress(Exception):
                    await current.close()

    async def _supervise(self, socket: Socket) -> None:
        backoff = 0.0
        while True:
            opened = time.monotonic()
            await self._read(socket)
            reason = socket.close_reason or "connection closed"
            message = f"the connection to the hub was lost ({socket.close_code}: {reason})"
            self._fail(message)
            if self._closed:
                return
            if not self.reconnect:
                self._failure = functools.partial(ConnectionLost, message)
                self._end_all(self._failure)
                return
            backoff = 0.0 if time.monotonic() - opened >= _STABLE_AFTER else _grow(backoff, self.max_backoff)
            while True:
                if backoff:
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                try:
                    socket = await self._open()
                except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                    if self._open_error(exc).code == "forbidden" or isinstance(exc, InvalidURI):
                        self._failure = functools.partial(self._open_error, exc)
                        self._end_all(self._failure)
                        return
                    log.debug("reconnecting to %s failed: %s", self.url, exc)
                    backoff = _grow(backoff, self.max_backoff)
                    continue
                break
            self.reconnects += 1
            await self._resume(socket)

    async def _resume(self, socket: Socket) -> None:
        # All synchronous up to the first send: the positions resubscribed here are exactly
        # the streams followed when the new socket becomes current.
        keys = list(self._protocol.positions)
        frames = self._protocol.resubscribe()
        for key, (rid, _) in zip(keys, frames, strict=True):
            subscription = self._subscriptions.get(key)
            if subscription is not None:
                subscription.request_id = rid
                self._subscribe_ids[rid] = subscription
        self._socket = socket
        self._connected.set()
        for _, data in frames:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed:
                return  # the read loop sees the drop and reconnects again

    def _end_all(self, error: Callable[[], SessionHubError]) -> None:
        for subscription in self._subscriptions.values():
            subscription.queue.put_nowait(error())
        self._protocol.positions.clear()

    async def _read(self, socket: Socket) -> None:
        try:
            async for data in socket:
                try:
                    effect = self._protocol.receive_text(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning("unreadable frame from the hub: %s", exc)
                    continue
                await self._dispatch(socket, effect)
        except ConnectionClosed:
            pass

    async def _dispatch(self, socket: Socket, effect: ClientEffect) -> None:
        if isinstance(effect, Delivered):
            subscription = self._subscriptions.get(effect.key)
            if subscription is not None:
                subscription.queue.put_nowait(_event(effect.event))
        elif isinstance(effect, Resolved):
            subscription = self._subscribe_ids.pop(effect.id, None)
            if subscription is not None:
                self._acknowledged(subscription, effect.result)
                return
            future = self._futures.get(effect.id)
            if future is not None and not future.done():
                future.set_result(effect.result)
        elif isinstance(effect, Failed):
            error = error_from(effect.code, effect.message)
            if effect.id is None:
                log.warning("the hub could not read a frame: %s", effect.message)
                return
            subscription = self._subscribe_ids.pop(effect.id, None)
            if subscription is not None:
                # The server ended the subscription (unknown session...): so does the client.
                self._protocol.positions.pop(subscription.key, None)
                subscription.request_id = None
                subscription.queue.put_nowait(error)
                return
            future = self._futures.get(effect.id)
            if future is not None and not future.done():
                future.set_exception(error)
        elif isinstance(effect, Reset):
            subscription = self._subscriptions.get(effect.key)
            if subscription is None:
                return
            if subscription.request_id is not None:
                # A reset answers the subscribe request in place of its reply.
                self._subscribe_ids.pop(subscription.request_id, None)
                self._protocol.pending.discard(subscription.request_id)
                subscription.request_id = None
            if not subscription.reload:
                subscription.queue.put_nowait(_position_lost(effect.frame))
                return
            rid, data = self._protocol.subscribe(effect.key, effect.frame.last_seq, effect.frame.epoch)
            subscription.request_id = rid
            self._subscribe_ids[rid] = subscription
            with contextlib.suppress(ConnectionClosed):
                await socket.send(data, text=True)
        elif isinstance(effect, PresenceChanged):
            await _notify(self.on_presence, effect.frame)
        elif isinstance(effect, Streamed):
            await _notify(self.on_stream, effect.frame)
        elif isinstance(effect, SummaryWanted):
            task = asyncio.get_running_loop().create_task(self._write_summary(socket, effect.frame))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        elif isinstance(effect, TurnGiven):
            if self._turns is not None:
                self._turns.given(effect.frame)
        elif isinstance(effect, Ignored):
            log.debug("ignored frame: %s", effect.reason)

    async def _write_summary(self, socket: Socket, frame: SummarizeFrame) -> None:
        """Answer the hub's ``summarize`` frame with this worker's summary (or its error)."""
        answer: dict[str, Any] = {"op": "summary", "id": f"summary-{frame.request_id}"}
        answer["request_id"] = frame.request_id
        try:
            if self.summarize is None:
                raise RuntimeError("this client does not summarize")
            summary = self.summarize(frame.prompt)
            if inspect.isawaitable(summary):
                summary = await summary
            answer["summary"] = str(summary)
        except Exception as exc:
            answer["error"] = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(ConnectionClosed):
            await socket.send(msgspec.json.encode(answer).decode(), text=True)

    def _acknowledged(self, subscription: _Subscription, result: Any) -> None:
        """The subscribe reply (``{epoch, last_seq}``): remember the epoch, so a resubscribe
        made before the first event still names it and the hub can tell a changed log."""
        subscription.request_id = None
        position = self._protocol.positions.get(subscription.key)
        if position is not None and position.epoch is None and isinstance(result, dict):
            epoch = result.get("epoch")
            if isinstance(epoch, str):
                position.epoch = epoch


def _grow(backoff: float, cap: float) -> float:
    return min(cap, max(_FIRST_BACKOFF, backoff * 2))
