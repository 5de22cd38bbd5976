"""LangChain messages as ``UIMessage`` dicts: how a LangGraph thread's ``messages`` channel
shows in the session's tree (``clients.langgraph`` projects them on every put).

A human message is a user message, an AI message an assistant message with its reasoning,
its text and a ``tool-<name>`` part per tool call; the tool message answering a call is no
message of its own: it completes that part (``output-available``, or ``output-error`` for
a tool message with status ``error``), as the AI SDK shows a tool's result. Dicts
(``{"role": "user", "content": "..."}``) are read as LangChain reads them. A message without
an id (a dict) gets one derived from its place and content, so a re-put finds it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from protocol import InvalidInput

__all__ = ["ui_messages"]

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "developer": "system"}


def _text_and_reasoning(content: Any) -> tuple[list[str], list[str]]:
    if isinstance(content, str):
        return ([content] if content else []), []
    texts: list[str] = []
    thoughts: list[str] = []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, str):
            texts.append(block)
        elif isinstance(block, Mapping):
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind in ("reasoning", "thinking"):
                text = block.get("reasoning", block.get("thinking", block.get("text")))
                if isinstance(text, str) and text:
                    thoughts.append(text)
    return texts, thoughts


def _stable_id(prev: str, role: str, content: Any) -> str:
    digest = hashlib.sha256(f"{prev}\x00{role}\x00{content!r}".encode()).hexdigest()
    return f"lc-{digest[:24]}"


def _output(content: Any) -> Any:
    if isinstance(content, str):
        return content
    texts, _ = _text_and_reasoning(content)
    return "".join(texts) if texts else content


def ui_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The UI messages of a ``messages`` channel (LangChain messages or dicts), oldest first."""
    from langchain_core.messages import BaseMessage, convert_to_messages

    converted: list[BaseMessage] = []
    for i, m in enumerate(messages):
        if isinstance(m, BaseMessage):
            converted.append(m)
            continue
        try:
            converted.extend(convert_to_messages([m]))
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise InvalidInput(f"messages[{i}] is not a message LangChain reads: {exc}") from None
    out: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    prev = ""
    for m in converted:
        if m.type == "tool":
            part = calls.get(str(getattr(m, "tool_call_id", "")))
            if part is not None:
                if getattr(m, "status", "success") == "error":
                    part.update(state="output-error", errorText=str(_output(m.content)))
                else:
                    part.update(state="output-available", output=_output(m.content))
            continue
        role = _ROLES.get(m.type)
        if role is None:
            continue
        texts, thoughts = _text_and_reasoning(m.content)
        extra = m.additional_kwargs.get("reasoning_content") if role == "assistant" else None
        if isinstance(extra, str) and extra:
            thoughts.insert(0, extra)
        parts: list[dict[str, Any]] = [{"type": "reasoning", "text": t} for t in thoughts]
        parts += [{"type": "text", "text": t} for t in texts]
        for call in getattr(m, "tool_calls", None) or []:
            part = {
                "type": f"tool-{call['name']}",
                "toolCallId": call.get("id") or "",
                "state": "input-available",
                "input": call.get("args", {}),
            }
            parts.append(part)
            calls[part["toolCallId"]] = part
        mid = m.id or _stable_id(prev, role, m.content)
        prev = mid
        message: dict[str, Any] = {"id": mid, "role": role, "parts": parts}
        if m.name:
            message["metadata"] = {"name": m.name}
        out.append(message)
    return out
