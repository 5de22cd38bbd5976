"""A Pydantic AI agent's message history kept in a sessionhub session.

``HubMessageHistory(manager_or_hub, session_id)`` works over an in-process
``hub.SessionManager`` or a connected ``HubClient`` (the same methods, clients/sessionsapi.py):

    history = HubMessageHistory(hub, session_id)
    result = await agent.run(prompt, message_history=await history.load())
    await history.save(result.new_messages())        # or all_messages(): the same

or, to save as the run goes (each step reaches the hub's subscribers before the next model
call), the capability: ``Agent(model, capabilities=[history.capability()])``.

Each ``ModelMessage`` is kept whole, as ``ModelMessagesTypeAdapter`` dumps it (JSON mode), in
``metadata["pydantic_ai"]["messages"]`` of the hub message that shows it, so ``load()``
gives back messages whose dump equals the dump of what was saved. The same message is shown
as a ``UIMessage``, so the session is watchable (the inspector, ``sessionhub tail``, any chat
UI) and searchable like any other:

- a request with a user prompt: a ``user`` message, its text as ``text`` parts (files and
  images as ``data-pydantic-ai-<kind>`` parts naming them; system prompts as
  ``data-pydantic-ai-system-prompt``);
- a response: an ``assistant`` message, text as ``text``, thinking as ``reasoning``, each tool
  call as a ``tool-<name>`` part (``toolCallId``, ``input``);
- the request that returns those calls' results (tool returns, retry prompts) is merged into
  the message of the response that made the calls: its tool parts get ``output`` (or
  ``errorText``, for a failed or retried call). A call and its result are then one hub
  message, which compaction, replacing whole messages, cannot separate (as
  clients/openai_agents.py does for the Agents SDK).

Messages other writers add (a person in a chat UI, an MCP client) load as a user prompt or a
model response made from their text and tool parts; a compacted range loads as one user prompt
carrying its summary.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.capabilities.abstract import AgentNode, NodeResult
    from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest, ModelResponse
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import RunContext
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    from .framework_records import missing_package

    raise missing_package(__name__, "pydantic-ai-slim", "pydantic-ai") from exc

from protocol import InvalidInput, Message, SessionInfo
from protocol.message import format_js_iso

from .framework_records import SUMMARY_PREFIX, kept_records, parsed_arguments, tool_name
from .sessionsapi import SessionsAPI, sessions_of

__all__ = ["METADATA_KEY", "HubHistoryCapability", "HubMessageHistory"]

#: The key of a message's ``metadata`` under which the original messages' dumps are kept.
METADATA_KEY = "pydantic_ai"

# Response parts that call a tool: each a tool part of the response's message.
_CALL_KINDS = frozenset({"tool-call", "builtin-tool-call"})
# Parts that answer a call the model made: merged into that call's tool part.
_RESULT_KINDS = frozenset({"tool-return", "builtin-tool-return", "retry-prompt"})
# Return outcomes that reach the model as an error (pydantic_ai.messages.ERROR_OUTCOMES).
_ERROR_OUTCOMES = frozenset({"failed", "retried"})
# The timestamp of a message another writer made without one (see _foreign).
_NO_TIME = "1970-01-01T00:00:00.000Z"

Dump = dict[str, Any]


# -- ModelMessages (their JSON dumps) -> a UIMessage ------------------------------------------


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _described(piece: Mapping[str, Any]) -> dict[str, Any]:
    """A file, an image, ... named without its bytes (they stay in the metadata's dump)."""
    keep = ("kind", "url", "media_type", "identifier", "file_id")
    return {key: piece[key] for key in keep if piece.get(key) is not None}


def _prompt_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for piece in content if isinstance(content, list) else [content]:
        if isinstance(piece, str):
            parts.append({"type": "text", "text": piece})
        elif (
            isinstance(piece, Mapping)
            and isinstance(piece.get("content"), str)
            and "text" in str(piece.get("kind", ""))
        ):
            parts.append({"type": "text", "text": piece["content"]})
        elif isinstance(piece, Mapping):
            parts.append(
                {"type": f"data-pydantic-ai-{piece.get('kind', 'content')}", "data": _described(piece)}
            )
    return parts


def _tool_part(part: Mapping[str, Any]) -> dict[str, Any]:
    tool = {
        "type": f"tool-{part.get('tool_name') or 'unknown'}",
        "toolCallId": part.get("tool_call_id"),
        "state": "input-available",
        "input": parsed_arguments(part.get("args")),
    }
    if part.get("part_kind") == "builtin-tool-call":
        tool["providerExecuted"] = True
    return tool


def _answer(part: Mapping[str, Any], parts: list[dict[str, Any]], calls: dict[str, dict[str, Any]]) -> None:
    """A tool's result into its call's part, or a part of its own when its call is elsewhere."""
    call_id = part.get("tool_call_id")
    found = calls.get(call_id) if isinstance(call_id, str) else None
    if found is None:
        found = {
            "type": "dynamic-tool",
            "toolName": part.get("tool_name") or "unknown",
            "toolCallId": call_id,
        }
        parts.append(found)
    # A retry prompt, or a return whose outcome reaches the model as an error (the tool raised,
    # or its call was refused), is the call's error.
    if part.get("part_kind") == "retry-prompt" or part.get("outcome") in _ERROR_OUTCOMES:
        found["state"] = "output-error"
        found["errorText"] = _as_text(part.get("content"))
    else:
        found["state"] = "output-available"
        found["output"] = part.get("content")


def _response_parts(dump: Dump, parts: list[dict[str, Any]], calls: dict[str, dict[str, Any]]) -> None:
    for part in dump.get("parts") or ():
        kind = part.get("part_kind")
        if kind == "text":
            parts.append({"type": "text", "text": _as_text(part.get("content"))})
        elif kind == "thinking":
            parts.append({"type": "reasoning", "text": _as_text(part.get("content"))})
        elif kind in _CALL_KINDS:
            tool = _tool_part(part)
            parts.append(tool)
            if isinstance(part.get("tool_call_id"), str):
                calls[part["tool_call_id"]] = tool
        elif kind in _RESULT_KINDS:
            _answer(part, parts, calls)
        else:  # files and whatever later versions add: named, kept whole in the metadata
            parts.append({"type": f"data-pydantic-ai-{kind}", "data": _described(part.get("content") or {})})


def _request_parts(dump: Dump, parts: list[dict[str, Any]], calls: dict[str, dict[str, Any]]) -> None:
    for part in dump.get("parts") or ():
        kind = part.get("part_kind")
        if kind == "user-prompt":
            parts.extend(_prompt_parts(part.get("content")))
        elif kind == "system-prompt":
            parts.append({"type": "data-pydantic-ai-system-prompt", "data": {"content": part.get("content")}})
        elif kind == "retry-prompt" and not part.get("tool_call_id"):
            parts.append({"type": "text", "text": _as_text(part.get("content"))})
        elif kind in _RESULT_KINDS:
            _answer(part, parts, calls)
        # Instructions and the other request plumbing are not shown: the dump keeps them.


def _role(dump: Dump) -> str:
    if dump.get("kind") == "response":
        return "assistant"
    kinds = {part.get("part_kind") for part in dump.get("parts") or ()}
    if "user-prompt" in kinds:
        return "user"
    if kinds == {"system-prompt"}:
        return "system"
    return "assistant" if kinds and kinds <= _RESULT_KINDS else "user"


def _message(dumps: list[Dump], message_id: str | None = None) -> dict[str, Any]:
    """The hub message that shows ``dumps`` (one message, or a response and its results)."""
    parts: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    for dump in dumps:
        if dump.get("kind") == "response":
            _response_parts(dump, parts, calls)
        else:
            _request_parts(dump, parts, calls)
    return {
        "id": message_id or f"pa_{uuid.uuid4().hex}",
        "role": _role(dumps[0]),
        "parts": parts or [{"type": "text", "text": ""}],
        "metadata": {METADATA_KEY: {"messages": dumps}},
    }


def _answers_only(dump: Dump, calls: set[str]) -> bool:
    """Whether ``dump`` is a request that only returns results of ``calls``."""
    parts = dump.get("parts") or ()
    return (
        dump.get("kind") == "request"
        and bool(parts)
        and all(p.get("part_kind") in _RESULT_KINDS and p.get("tool_call_id") in calls for p in parts)
    )


def _calls(dumps: Sequence[Dump]) -> set[str]:
    return {
        part["tool_call_id"]
        for dump in dumps
        if dump.get("kind") == "response"
        for part in dump.get("parts") or ()
        if part.get("part_kind") in _CALL_KINDS and isinstance(part.get("tool_call_id"), str)
    }


# -- hub messages -> ModelMessages ----------------------------------------------------------


def _own(message: Message) -> list[Dump] | None:
    return kept_records(message, METADATA_KEY, "messages")


def _foreign(message: Message) -> list[Dump]:
    """Messages for one another writer made: its text, its tool calls and their results."""
    # A timestamp of the message's own, so the same message loads the same each time (and a
    # save of a run given it finds it held); the epoch for a message written without one.
    stamp = {"timestamp": format_js_iso(message.created_at) if message.created_at else _NO_TIME}
    if message.role != "assistant" or message.id.startswith(SUMMARY_PREFIX):
        texts = [
            p["text"] for p in message.parts if p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        if not texts:
            return []
        system = message.role == "system" and not message.id.startswith(SUMMARY_PREFIX)
        prompt = {"part_kind": "system-prompt" if system else "user-prompt", "content": "\n".join(texts)}
        return [{"kind": "request", "parts": [{**prompt, **stamp}], **stamp}]
    said: list[Dump] = []  # the response's parts, in the message's order
    returned: list[Dump] = []
    for part in message.parts:
        call_id, name = part.get("toolCallId"), tool_name(part)
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            said.append({"part_kind": "text", "content": part["text"]})
        if name is None:
            continue
        said.append(
            {"part_kind": "tool-call", "tool_name": name, "args": part.get("input"), "tool_call_id": call_id}
        )
        if "output" in part or "errorText" in part:
            error = "errorText" in part and "output" not in part
            returned.append(
                {
                    "part_kind": "retry-prompt" if error else "tool-return",
                    "tool_name": name,
                    "content": part.get("errorText") if error else part.get("output"),
                    "tool_call_id": call_id,
                    **stamp,
                }
            )
    dumps: list[Dump] = [{"kind": "response", "parts": said, **stamp}] if said else []
    if returned:
        dumps.append({"kind": "request", "parts": returned, **stamp})
    return dumps


def _normalized(dumps: list[Dump]) -> list[Dump]:
    """``dumps`` as the adapter dumps them back (defaults filled in), for comparing."""
    dumped: list[Dump] = ModelMessagesTypeAdapter.dump_python(
        ModelMessagesTypeAdapter.validate_python(dumps), mode="json"
    )
    return dumped


def _key(dump: Dump) -> str:
    return json.dumps(dump, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# -- the history ----------------------------------------------------------------------------


class HubMessageHistory:
    """A Pydantic AI message history over one sessionhub session.

    The session must exist in the hub's registry (``await HubMessageHistory.create(hub,
    name)`` makes one); every method raises :class:`~protocol.SessionNotFound` otherwise. Saves
    from one ``HubMessageHistory`` are serialized; two processes saving one session at once
    should each save their own run's messages.
    """

    def __init__(self, manager_or_hub: object, session_id: str) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise InvalidInput("session_id must be a non-empty string")
        self.sessions: SessionsAPI = sessions_of(manager_or_hub)
        self.session_id = session_id
        self._lock = asyncio.Lock()

    @classmethod
    async def create(cls, manager_or_hub: object, name: str) -> HubMessageHistory:
        """Register a new hub session named ``name`` and keep the history in it."""
        sessions = sessions_of(manager_or_hub)
        info: SessionInfo = await sessions.create(name)
        return cls(sessions, info.id)

    async def load(self) -> list[ModelMessage]:
        """The active branch as ``ModelMessage``s, oldest first, overlays applied: pass it as
        ``message_history=``."""
        return list(ModelMessagesTypeAdapter.validate_python(self._held(await self._history())))

    async def save(self, messages: Sequence[ModelMessage]) -> int:
        """Append the messages the session does not hold yet; returns how many.

        ``messages`` may be a run's ``new_messages()`` or ``all_messages()`` (of a run given
        ``load()``'s history, or not): what follows the newest held message found in it is
        appended, the rest is already held. A message is the same as a held one when their
        dumps are equal (a message's timestamp is part of it). Bad input raises
        :class:`~protocol.InvalidInput` before anything is written; a token without write
        access to the session is refused (over a ``HubClient``: ``HubError`` with code
        ``forbidden``) before anything is written.
        """
        if isinstance(messages, Mapping) or not isinstance(messages, Sequence):
            raise InvalidInput("messages must be a list of ModelRequest / ModelResponse")
        for index, message in enumerate(messages):
            if not isinstance(message, ModelRequest | ModelResponse):
                raise InvalidInput(
                    f"message {index} must be a ModelRequest or ModelResponse, got {type(message).__name__}"
                )
        given: list[Dump] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
        async with self._lock:
            history = await self._history()
            fresh = given[self._held_until(self._held(history), given) :]
            if not fresh:
                return 0
            await self._write(history, fresh)
            return len(fresh)

    def capability(self) -> HubHistoryCapability:
        """A capability that saves the run's messages as it goes: after each step of the run
        (the prompt, each response, the tools' results) and when it ends."""
        return HubHistoryCapability(self)

    async def _history(self) -> list[Message]:
        return await self.sessions.get_history(self.session_id)

    @staticmethod
    def _held(history: list[Message]) -> list[Dump]:
        held: list[Dump] = []
        for message in history:
            own = _own(message)
            held.extend(own if own is not None else _normalized(_foreign(message)))
        return held

    @staticmethod
    def _held_until(held: list[Dump], given: list[Dump]) -> int:
        """Where the messages of ``given`` that are not held start: after the last one that is
        the newest held message found in it (0 when none of the held is in it)."""
        if not held or not given:
            return 0
        # Keys are made lazily from the end of both: the newest held message is usually just
        # before the new ones, so a save costs what it appends, not the whole history.
        keys: list[str] = []
        for dump in reversed(held):
            wanted = _key(dump)
            for back in range(len(given)):
                if back == len(keys):
                    keys.append(_key(given[-1 - back]))
                if keys[back] == wanted:
                    return len(given) - back
        return 0

    async def _write(self, history: list[Message], fresh: list[Dump]) -> None:
        # The newest hub message, when it is ours and ends with calls, takes their results.
        open_step: tuple[str, list[Dump]] | None = None
        newest = history[-1] if history else None
        if newest is not None and (own := _own(newest)):
            open_step = (newest.id, own)
        updated = False
        groups: list[list[Dump]] = []
        for dump in fresh:
            if groups and _answers_only(dump, _calls(groups[-1])):
                groups[-1].append(dump)
            elif not groups and open_step is not None and _answers_only(dump, _calls(open_step[1])):
                open_step[1].append(dump)
                updated = True
            else:
                groups.append([dump])
        if updated and open_step is not None:
            await self.sessions.upsert(self.session_id, _message(open_step[1], open_step[0]))
        if groups:
            await self.sessions.append_all(self.session_id, [_message(group) for group in groups])

    def __repr__(self) -> str:
        return f"HubMessageHistory({self.session_id!r})"


@dataclass
class HubHistoryCapability(AbstractCapability[Any]):
    """Saves an agent's run into a :class:`HubMessageHistory` as it goes, so that the hub's
    subscribers see each step live; ``Agent(..., capabilities=[history.capability()])``."""

    history: HubMessageHistory
    # What this run last saved (how many messages, and the newest one's identity), so a step
    # that added nothing costs no round trip.
    _saved: tuple[int, int] | None = field(default=None, repr=False)

    async def for_run(self, ctx: RunContext[Any]) -> HubHistoryCapability:
        return HubHistoryCapability(self.history)  # a run's own `_saved`

    async def after_node_run(
        self, ctx: RunContext[Any], *, node: AgentNode[Any], result: NodeResult[Any]
    ) -> NodeResult[Any]:
        # After each step of the graph: the prompt once it is sent, the model's response (its
        # tool calls visible while they run), the tools' results.
        await self._save(ctx.messages)
        return result

    async def after_run(self, ctx: RunContext[Any], *, result: AgentRunResult[Any]) -> AgentRunResult[Any]:
        await self._save(result.all_messages())
        return result

    async def _save(self, messages: list[ModelMessage]) -> None:
        mark = (len(messages), id(messages[-1])) if messages else (0, 0)
        if messages and mark != self._saved:
            await self.history.save(messages)
            self._saved = mark

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live connection: not spec-serializable
