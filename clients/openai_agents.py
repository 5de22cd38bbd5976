"""An OpenAI Agents SDK ``Session`` that keeps the conversation in a sessionhub session.

``HubAgentSession(session_id, sessions=...)`` works over ``HubClient.sessions`` (the hub,
over its WebSocket) or an in-process ``hub.SessionManager``: both have the same methods.
Every item the Runner saves becomes a message on the session's active branch, so the
inspector and every subscriber watch the run live:

- user / assistant / system items: a message of that role with text parts;
- function calls and their outputs (any ``*_call`` / ``*_call_output`` pair with a
  ``call_id``): one assistant message per model step, holding a tool part per call
  (``toolCallId`` = the call id) into which its output is merged. A call and its output
  are then one message, and compaction, which replaces whole messages, cannot separate
  them (two messages would rely on boundary alignment, which sees only the message just
  before a boundary and so can split parallel calls from their outputs);
- any other item (reasoning, hosted tool calls, ...): a message of its own.

Each message keeps the original items under ``metadata["openai_agents"]["items"]``, so
``get_items`` returns exactly the dicts that were added. Messages written by others (a
person in a chat UI, an MCP client) read back as items made from their text and tool parts,
and a compacted range reads back as one user item carrying the summary.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

try:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings, coerce_session_settings, resolve_session_limit
    from agents.run_context import RunContextWrapper
    from agents.usage import Usage
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    from .framework_records import missing_package

    raise missing_package(__name__, "openai-agents", "openai-agents") from exc

from protocol import Conflict, InvalidInput, Message, SessionInfo

from .framework_records import SUMMARY_PREFIX, kept_records, parsed_arguments, tool_name
from .sessionsapi import SessionsAPI

__all__ = ["METADATA_KEY", "HubAgentSession", "SessionsAPI"]

#: The key of a message's ``metadata`` under which the original items are kept.
METADATA_KEY = "openai_agents"

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


# -- items <-> messages --------------------------------------------------------------------


def _kind(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind in (None, "message") and item.get("role") in _ROLES:
        return "message"
    if isinstance(kind, str) and isinstance(item.get("call_id"), str):
        if kind.endswith("_call_output"):
            return "output"
        if kind.endswith("_call"):
            return "call"
    return "other"


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    if isinstance(content, list):
        for piece in content:
            if not isinstance(piece, Mapping):
                continue
            if isinstance(piece.get("text"), str):  # input_text, output_text
                parts.append({"type": "text", "text": piece["text"]})
            elif isinstance(piece.get("refusal"), str):
                parts.append({"type": "text", "text": piece["refusal"]})
            else:  # images, files, audio: shown as data, kept whole in the metadata
                parts.append({"type": "data-openai-content", "data": dict(piece)})
    return parts or [{"type": "text", "text": ""}]


def _call_input(item: Mapping[str, Any]) -> Any:
    if item.get("type") == "function_call":
        return parsed_arguments(item.get("arguments"))
    if "input" in item:  # custom_tool_call
        return item["input"]
    return {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}


def _tool_parts(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    by_call: dict[str, dict[str, Any]] = {}
    for item in items:
        call_id = item["call_id"]
        if _kind(item) == "call":
            name = item.get("name")
            part = {
                "type": f"tool-{name if isinstance(name, str) and name else item['type']}",
                "toolCallId": call_id,
                "state": "input-available",
                "input": _call_input(item),
            }
            parts.append(part)
            by_call[call_id] = part
        else:
            found = by_call.get(call_id)
            if found is None:  # its call is in an earlier message
                found = {"type": "dynamic-tool", "toolName": item["type"][: -len("_output")]}
                found["toolCallId"] = call_id
                parts.append(found)
            found["state"] = "output-available"
            found["output"] = item.get("output")
    return parts


def _message(items: list[dict[str, Any]], message_id: str | None = None) -> dict[str, Any]:
    """The message that holds ``items`` (one item, or one model step's calls and outputs)."""
    first = items[0]
    kind = _kind(first)
    if kind == "message":
        role = _ROLES[first["role"]]
        parts = _text_parts(first.get("content"))
    elif kind in ("call", "output"):
        role, parts = "assistant", _tool_parts(items)
    elif first.get("type") == "reasoning":
        summary = first.get("summary")
        texts = [
            s["text"] for s in summary or () if isinstance(s, Mapping) and isinstance(s.get("text"), str)
        ]
        role, parts = "assistant", [{"type": "reasoning", "text": "\n".join(texts)}]
    else:
        role, parts = "assistant", [{"type": f"data-openai-{first.get('type', 'item')}", "data": first}]
    return {
        "id": message_id or f"oa_{uuid.uuid4().hex}",
        "role": role,
        "parts": parts,
        "metadata": {METADATA_KEY: {"items": items}},
    }


def _own_items(message: Message) -> list[dict[str, Any]] | None:
    return kept_records(message, METADATA_KEY, "items")


def _foreign_items(message: Message) -> list[dict[str, Any]]:
    """Items for a message another writer made: its text, and its tool parts as calls and
    outputs, so the agent sees what a person or another client added."""
    role = message.role if message.role in _ROLES else "user"
    if message.id.startswith(SUMMARY_PREFIX):
        # A user item: every model the SDK talks to accepts one anywhere in the input, while
        # several refuse a system message after the first.
        role = "user"
    items: list[dict[str, Any]] = []
    texts: list[str] = []

    def flush() -> None:
        if texts:
            items.append({"role": role, "content": "\n".join(texts)})
            texts.clear()

    for part in message.parts:
        call_id, name = part.get("toolCallId"), tool_name(part)
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif name is not None:
            flush()
            if "input" in part:
                arguments = part["input"] if isinstance(part["input"], str) else json.dumps(part["input"])
                items.append(
                    {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
                )
            if "output" in part:
                output = part["output"] if isinstance(part["output"], str) else json.dumps(part["output"])
                items.append({"type": "function_call_output", "call_id": call_id, "output": output})
    flush()
    return items


def _items_of(message: Message) -> list[dict[str, Any]]:
    own = _own_items(message)
    return own if own is not None else _foreign_items(message)


def _answered(items: Sequence[Mapping[str, Any]]) -> set[str]:
    return {i["call_id"] for i in items if _kind(i) == "output"}


def _joins(tool_items: list[dict[str, Any]], item: Mapping[str, Any]) -> bool:
    """Whether ``item`` belongs in the tool message holding ``tool_items``: a call joins
    while the step has no output yet (parallel calls); an output joins its call."""
    answered = _answered(tool_items)
    if _kind(item) == "call":
        return not answered
    calls = {i["call_id"] for i in tool_items if _kind(i) == "call"}
    return item["call_id"] in calls and item["call_id"] not in answered


# -- the session ---------------------------------------------------------------------------


class HubAgentSession:
    """The Agents SDK ``Session`` protocol over one sessionhub session.

    The session must exist in the hub's registry (``await sessions.create(name)`` gives
    one); every method raises :class:`~protocol.SessionNotFound` otherwise. Each method takes
    the SDK's optional ``wrapper`` keyword (the run's ``RunContextWrapper``), so the Runner,
    which passes it only to sessions whose four methods all take it, treats this one as
    context-aware; the hub does not read it: access is scoped by the hub's tokens (a token for
    one tenant's session reaches that session only), checked on every call. Writes from one
    ``HubAgentSession`` are serialized; two writers on one session should each append
    whole turns, as two SQLite sessions on one table would.
    """

    def __init__(
        self,
        session_id: str,
        *,
        sessions: SessionsAPI,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInput("session_id must be a non-empty string")
        self.session_id = session_id
        self.sessions = sessions
        self.session_settings: SessionSettings | None = (
            coerce_session_settings(
                dict(session_settings) if isinstance(session_settings, Mapping) else session_settings
            )
            if session_settings is not None
            else SessionSettings()
        )
        self._lock = asyncio.Lock()

    @classmethod
    async def create(
        cls,
        sessions: SessionsAPI,
        name: str,
        *,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> HubAgentSession:
        """Register a new hub session named ``name`` and wrap it."""
        info = await sessions.create(name)
        return cls(info.id, sessions=sessions, session_settings=session_settings)

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        """The latest ``limit`` items (default: ``session_settings.limit``, else all), oldest
        first, overlays applied. As the SDK's SQLite session: ``0`` gives none, a negative
        limit all."""
        session_limit = resolve_session_limit(limit, self.session_settings)
        if session_limit == 0:
            return []
        items: list[dict[str, Any]] = []
        for message in await self.sessions.get_history(self.session_id):
            items.extend(_items_of(message))
        if session_limit is not None and session_limit > 0:
            items = items[-session_limit:]
        return cast(list[TResponseInputItem], copy.deepcopy(items))

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        """Append the items on the active branch: a call or output continuing the newest
        tool step is merged into its message, everything else is a new message. Bad input
        (an item that is not an object) raises :class:`~protocol.InvalidInput` before
        anything is written."""
        if isinstance(items, Mapping) or not isinstance(items, Sequence):
            raise InvalidInput("items must be a list of item objects")
        batch: list[dict[str, Any]] = []
        for index, given in enumerate(items):
            if not isinstance(given, Mapping):
                raise InvalidInput(f"item {index} must be an object, got {type(given).__name__}")
            batch.append(copy.deepcopy(dict(given)))
        if not batch:
            return
        async with self._lock:
            leaf = await self._newest()
            open_step: tuple[str, list[dict[str, Any]]] | None = None
            if leaf is not None:
                own = _own_items(leaf)
                if own and _kind(own[0]) in ("call", "output"):
                    open_step = (leaf.id, own)
            updated = False
            fresh: list[list[dict[str, Any]]] = []
            for item in batch:
                kind = _kind(item)
                if kind in ("call", "output"):
                    if fresh and _kind(fresh[-1][0]) in ("call", "output"):
                        if _joins(fresh[-1], item):
                            fresh[-1].append(item)
                            continue
                    elif not fresh and open_step is not None and _joins(open_step[1], item):
                        open_step[1].append(item)
                        updated = True
                        continue
                fresh.append([item])
            if updated and open_step is not None:
                await self.sessions.upsert(self.session_id, _message(open_step[1], open_step[0]))
            if fresh:
                await self.sessions.append_all(self.session_id, [_message(group) for group in fresh])

    async def pop_item(self, *, wrapper: RunContextWrapper[Any] | None = None) -> TResponseInputItem | None:
        """Remove and return the newest item, or None when there is none. The newest item of a
        tool step is taken out of its message (the message goes when it holds no more)."""
        async with self._lock:
            history = await self.sessions.get_history(self.session_id)
            for message in reversed(history):
                items = _items_of(message)
                if not items:
                    continue  # a message with nothing an agent reads (a data part, say)
                if message.id.startswith(SUMMARY_PREFIX):
                    raise Conflict(
                        "the newest item is a compaction summary; it cannot be popped "
                        "(the messages it summarizes are still stored)"
                    )
                newest = items.pop()
                if items:
                    await self.sessions.upsert(self.session_id, _message(items, message.id))
                else:
                    await self.sessions.delete_messages(self.session_id, [message.id])
                return cast(TResponseInputItem, newest)
            return None

    async def clear_session(self, *, wrapper: RunContextWrapper[Any] | None = None) -> None:
        """Delete every message (and overlay) of the session; the session stays registered."""
        async with self._lock:
            await self.sessions.clear_messages(self.session_id)

    async def add_usage(self, usage: Usage, cost: float = 0.0) -> SessionInfo:
        """Add a run's token usage (``result.context_wrapper.usage``) to the session's totals."""
        return await self.sessions.add_usage(self.session_id, usage.input_tokens, usage.output_tokens, cost)

    async def _newest(self) -> Message | None:
        history = await self.sessions.get_history(self.session_id)
        return history[-1] if history else None

    def __repr__(self) -> str:
        return f"HubAgentSession({self.session_id!r})"
