"""The engine's API over the socket: :class:`RemoteSessions` (``SessionManager``),
:class:`RemoteSession` (``Session``) and :class:`RemoteTool`, with the conversions between
their arguments and results and the wire's JSON.

``parent_id`` arguments take :data:`LATEST` (the default: attach to the latest leaf; the
request leaves ``parent_id`` out), ``None`` (a new root; sent as ``null``) or a message id.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

import msgspec

from protocol import Compaction, ContextBlock, Event, Message, PruneResult, SearchResult, SessionInfo
from protocol.markers import LATEST as _LATEST
from protocol.markers import ParentArg

from .errors import ConnectionLost
from .streaming import MessageStream

__all__ = [
    "IMPORT_CHUNK_BYTES",
    "LATEST",
    "MessageInput",
    "RemoteSession",
    "RemoteSessions",
    "RemoteTool",
    "Requester",
]

# The engine's marker: ``hub.LATEST is clients.LATEST``.
LATEST = _LATEST

MessageInput = Message | Mapping[str, Any]

_T = TypeVar("_T")

#: Bytes of dump lines one ``import`` request carries (well under the hub's frame limit).
IMPORT_CHUNK_BYTES = 256 << 10


async def _aiter(lines: Iterable[_T] | AsyncIterable[_T]) -> AsyncIterator[_T]:
    if isinstance(lines, AsyncIterable):
        async for line in lines:
            yield line
    else:
        for line in lines:
            yield line


def _dropped() -> Exception:
    # The hub's import state went with the old socket: what it held was not written (a
    # drop after the final chunk may have written it: replace=True imports it again).
    return ConnectionLost(
        "the connection dropped during the import: import again (replace=True if it may have been written)"
    )


class Requester(Protocol):
    """What the remote API needs of a client (:class:`clients.HubClient` is one): requests
    and subscriptions. A protocol, so this module does not import the client."""

    async def request(self, op: str, **fields: Any) -> Any: ...

    def subscribe(
        self,
        session_id: str | None,
        after_seq: int = 0,
        *,
        epoch: str | None = None,
        reload: bool = False,
    ) -> AsyncGenerator[Event, None]: ...

    def streamed(self, op: str, **fields: Any) -> AsyncGenerator[list[str], None]: ...


# -- conversions ---------------------------------------------------------------------------


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


def _convert(data: Any, kind: type[_T]) -> _T:
    return msgspec.convert(data, kind)


def _convert_list(data: Any, kind: type[_T]) -> list[_T]:
    return msgspec.convert(data, list[kind])  # type: ignore[valid-type]


def _messages(data: Any) -> list[Message]:
    return [Message.from_dict(m) for m in data]


def _message_or_none(data: Any) -> Message | None:
    return None if data is None else Message.from_dict(data)


# -- tools ---------------------------------------------------------------------------------


class RemoteTool:
    """A tool that runs in the hub: ``name``, ``description``, ``input_schema`` (JSON Schema)
    and ``execute(arguments) -> str`` (op ``run_tool``). As with the engine's tools, bad
    arguments come back as an ``Error: ...`` string, not an exception."""

    __slots__ = ("_client", "_session_id", "description", "input_schema", "name")

    def __init__(
        self,
        client: Requester,
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


def _tools(client: Requester, session_id: str | None, data: Any) -> list[RemoteTool]:
    return [RemoteTool(client, session_id, t["name"], t["description"], t["input_schema"]) for t in data]


# -- the manager's API ---------------------------------------------------------------------


class RemoteSessions:
    """``SessionManager`` over the socket: the same method names, arguments and result
    types. Departures: :meth:`tools` is a coroutine (it asks the hub; the engine's is
    sync); :meth:`prune_events` returns a :class:`protocol.PruneResult` (the engine's
    fields) and also takes an age in seconds."""

    def __init__(self, client: Requester) -> None:
        self._client = client
        self._importing = asyncio.Lock()

    async def _call(self, op: str, **fields: Any) -> Any:
        return await self._client.request(op, **fields)

    # -- registry ------------------------------------------------------------------------
    async def create(
        self,
        name: str,
        parent_session_id: str | None = None,
        model: str | None = None,
        source: str | None = None,
        template: str | None = None,
    ) -> SessionInfo:
        fields: dict[str, Any] = {"template": template} if template is not None else {}
        data = await self._call(
            "create", name=name, parent_session_id=parent_session_id, model=model, source=source, **fields
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

    async def end(self, session_id: str, reason: str = "ended") -> SessionInfo:
        """Mark the session ended (``end_reason``); ending it twice is ``Conflict``."""
        return _convert(await self._call("end", session_id=session_id, reason=reason), SessionInfo)

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

    # -- export and import (admin on "*"; docs/operations.md) ------------------------------
    async def export(self, session_ids: Sequence[str] | None = None) -> AsyncIterator[str]:
        """The dump of ``session_ids`` (default: every session) line by line, without
        newlines: what ``sessionhub export`` writes, streamed in batches."""
        ids = builtins.list(session_ids) if session_ids is not None else None
        async for batch in self._client.streamed("export", session_ids=ids):
            for line in batch:
                yield line

    async def import_(
        self, lines: Iterable[str | bytes] | AsyncIterable[str | bytes], replace: bool = False
    ) -> dict[str, Any]:
        """Import a dump (lines, with or without their newlines), sent in chunks of at most
        :data:`IMPORT_CHUNK_BYTES`: ``{"sessions": [ids], "messages": n}``. Like
        ``sessionhub import``: a session already stored is :class:`~protocol.errors.Conflict`
        unless ``replace``; a bad line raises :class:`~protocol.errors.InvalidInput` naming
        its number, and nothing is written."""
        async with self._importing:  # one import at a time on a socket
            reconnects = getattr(self._client, "reconnects", 0)
            chunk: builtins.list[str] = []
            size = 0
            try:
                async for raw in _aiter(lines):
                    line = (raw.decode() if isinstance(raw, bytes) else raw).rstrip("\r\n")
                    cost = len(line.encode()) + 3
                    if chunk and size + cost > IMPORT_CHUNK_BYTES:
                        await self._call("import", lines=chunk)
                        chunk, size = [], 0
                    chunk.append(line)
                    size += cost
                result = await self._call("import", lines=chunk, final=True, replace=replace)
            except Exception:
                if getattr(self._client, "reconnects", 0) != reconnects:
                    raise _dropped() from None
                raise
            if getattr(self._client, "reconnects", 0) != reconnects:
                raise _dropped()
            return dict(result)

    # -- retention (admin on "*"; docs/operations.md) -------------------------------------
    async def prune_events(
        self,
        *,
        older_than: datetime | timedelta | float | None = None,
        keep_per_session: int | None = None,
        batch: int = 1000,
    ) -> PruneResult:
        """Prune every event log of the hub, as ``SessionManager.prune_events``: events
        stored before ``older_than`` (a time, an age as a ``timedelta``, or an age in
        seconds) and those beyond the newest ``keep_per_session`` of each log."""
        age: Any = older_than
        if isinstance(older_than, timedelta):
            age = older_than.total_seconds()
        elif isinstance(older_than, datetime):
            age = older_than.isoformat()  # the hub's clock judges an age; a time is exact
        data = await self._call(
            "prune_events", older_than=age, keep_per_session=keep_per_session, batch=batch
        )
        return _convert(data, PruneResult)

    # -- events --------------------------------------------------------------------------
    async def read_registry_events(self, after_seq: int = 0, limit: int = 1000) -> builtins.list[Event]:
        """Registry changes after ``after_seq``, at most ``limit`` (at most 10,000 over the
        socket); one read, not a subscription. A lost position raises ``PositionLost``."""
        return _convert_list(
            await self._call("read_events", session_id=None, after_seq=after_seq, limit=limit), Event
        )

    def registry_events(
        self, after_seq: int = 0, *, epoch: str | None = None, reload: bool = False
    ) -> AsyncGenerator[Event, None]:
        """Registry changes: :meth:`HubClient.subscribe` with ``session_id=None``."""
        return self._client.subscribe(None, after_seq, epoch=epoch, reload=reload)


# -- one session's API ---------------------------------------------------------------------


class RemoteSession:
    """``Session`` over the socket, for a session of the registry: messages, context blocks,
    the frozen prompt, tools, compaction and events.

    Departure: :meth:`append_message` returns the message id, not whether it was inserted
    (the hub's ``append`` op answers with the id).

    In-process only (no op): ``add_context`` / ``remove_context`` (a block is configuration
    of the hub's engine, often with a provider object, and would live in one node's memory
    until it restarts: configure blocks on the ``SessionManager`` the hub serves), and
    ``unload_skill`` / ``get_loaded_skill_keys`` (per-node memory of the hub; over the
    socket the model unloads with the ``unload_context`` tool, :meth:`tools`)."""

    def __init__(self, client: Requester, session_id: str) -> None:
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

    async def estimate_tokens(self, leaf_id: str | None = None) -> int:
        """The hub's token estimate of the branch ending at ``leaf_id`` (default: the latest
        leaf) plus the system prompt, as compaction decisions use it."""
        return int(await self._call("estimate_tokens", leaf_id=leaf_id))

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
        parent_id, trigger}``; the reply streams into the session (hub/server/turndispatch.py)."""
        fields: dict[str, Any] = {"message_id": message_id}
        if trigger is not None:
            fields["trigger"] = trigger
        return dict(await self._call("start_turn", **fields))

    async def get_turn(self) -> dict[str, Any] | None:
        """The session's turn in flight (as :meth:`start_turn` returns it, with
        ``started``), or None: what a chat reconnecting after a reload asks first."""
        data = await self._call("get_turn")
        return None if data is None else dict(data)

    async def stop_turn(self, turn_id: str | None = None, reason: str | None = None) -> dict[str, Any]:
        """Stop the turn in flight (``turn_id``: only if it is that one), on whichever node
        it runs: its reply ends as it stands. Returns ``{turn_id, reply_id, started}``; no
        such turn in flight raises :class:`~protocol.errors.NotFound`."""
        fields: dict[str, Any] = {"turn_id": turn_id}
        if reason is not None:
            fields["reason"] = reason
        return dict(await self._call("stop_turn", **fields))

    async def answer_tool(
        self,
        *,
        approval_id: str | None = None,
        approved: bool | None = None,
        reason: str | None = None,
        tool_call_id: str | None = None,
        output: Any = None,
        error_text: str | None = None,
    ) -> dict[str, Any]:
        """Answer a tool of the reply in flight: an approval (``approval_id``,
        ``approved``, ``reason``) or a client tool's result (``tool_call_id`` with
        ``output`` or ``error_text``). The hub checks it is pending and unanswered
        (:class:`~protocol.errors.NotFound`, :class:`~protocol.errors.Conflict`), writes it
        into the reply and tells the responder. Returns ``{turn_id, reply_id, tool_call_id}``."""
        fields: dict[str, Any] = {
            "approval_id": approval_id,
            "approved": approved,
            "reason": reason,
            "tool_call_id": tool_call_id,
            "output": output,
            "error_text": error_text,
        }
        return dict(await self._call("answer_tool", **{k: v for k, v in fields.items() if v is not None}))

    async def steer_turn(
        self, message: Message | Mapping[str, Any] | str, turn_id: str | None = None
    ) -> dict[str, Any]:
        """Send a user message to the turn in flight (not a new turn): stored in the reply
        as a ``steering-message`` part and given to its responder (``turn.steering()``).
        A string is a user message of one text part. Returns ``{turn_id, reply_id}``."""
        if isinstance(message, str):
            message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": message}]}
        data = message.to_dict() if isinstance(message, Message) else dict(message)
        return dict(await self._call("steer_turn", message=data, turn_id=turn_id))

    async def freeze_system_prompt(self) -> str:
        return str(await self._call("freeze_system_prompt"))

    async def refresh_system_prompt(self) -> str:
        return str(await self._call("refresh_system_prompt"))

    async def tools(self) -> list[RemoteTool]:
        """The session's context tools, run in the hub."""
        return _tools(self._client, self.session_id, await self._call("tools"))

    # -- events --------------------------------------------------------------------------
    async def read_events(self, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        """This session's logged changes after ``after_seq``, at most ``limit`` (at most
        10,000 over the socket), as ``Session.read_events``: one read, not a subscription.
        A position the log cannot serve raises :class:`~protocol.errors.PositionLost`."""
        return _convert_list(await self._call("read_events", after_seq=after_seq, limit=limit), Event)

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
