"""AG-UI 1.0's shapes without I/O: its messages to and from the hub's UI messages, and one
reply's UI message stream chunks as AG-UI events (:class:`AguiEncoder`). The door that
serves them, and re-attaches to a run, is :mod:`.agui`.
"""

from __future__ import annotations

import json
from typing import Any

from protocol import InvalidInput

__all__ = ["AguiEncoder", "Event", "result_content", "to_agui_messages", "to_ui_messages"]

Event = dict[str, Any]


# -- AG-UI messages in ---------------------------------------------------------------------


def _content_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidInput("a message's content must be a string or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict):
            raise InvalidInput("a content part must be an object")
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            parts.append({"type": "data-agui-content", "data": part})  # kept as sent
    return parts


def to_ui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """AG-UI messages as the hub's UI messages, in order. Tool results (``role: tool``) join
    the tool call of the assistant message before them; reasoning and activity messages are
    renderings of a reply the hub holds, and are not stored again."""
    out: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("id"), str):
            raise InvalidInput("every message needs a string id")
        role = m.get("role")
        if role in ("user", "system", "developer"):
            ui_role = "user" if role == "user" else "system"
            out.append({"id": m["id"], "role": ui_role, "parts": _content_parts(m.get("content", ""))})
        elif role == "assistant":
            parts = _content_parts(m.get("content") or "")
            for call in m.get("toolCalls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(call.get("id"), str):
                    raise InvalidInput("a tool call needs an id and a function")
                try:
                    args = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    args = function.get("arguments")
                part = {
                    "type": f"tool-{function.get('name', 'tool')}",
                    "toolCallId": call["id"],
                    "state": "input-available",
                    "input": args,
                }
                calls[call["id"]] = part
                parts.append(part)
            out.append({"id": m["id"], "role": "assistant", "parts": parts})
        elif role == "tool":
            call_part = calls.get(str(m.get("toolCallId")))
            if call_part is not None:
                if m.get("error"):
                    call_part.update(state="output-error", errorText=str(m["error"]))
                else:
                    content = m.get("content")
                    try:
                        output = json.loads(content) if isinstance(content, str) else content
                    except ValueError:
                        output = content
                    call_part.update(state="output-available", output=output)
        elif role in ("reasoning", "activity"):
            continue
        else:
            raise InvalidInput(f"unknown message role {role!r}")
    return out


def to_agui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The thread's stored UI messages as AG-UI messages (for ``MESSAGES_SNAPSHOT``)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        text = "".join(p.get("text", "") for p in m.get("parts", []) if p.get("type") == "text")
        role = m.get("role")
        if role == "assistant":
            message: dict[str, Any] = {"id": m["id"], "role": "assistant", "content": text}
            calls, results = [], []
            for p in m.get("parts", []):
                name = _tool_name(p)
                if name is None:
                    continue
                calls.append(
                    {
                        "id": p.get("toolCallId", ""),
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(p.get("input"))},
                    }
                )
                if p.get("state") in ("output-available", "output-error"):
                    results.append(
                        {
                            "id": f"{p.get('toolCallId')}-result",
                            "role": "tool",
                            "toolCallId": p.get("toolCallId", ""),
                            "content": result_content(p),
                        }
                    )
            if calls:
                message["toolCalls"] = calls
            out.append(message)
            out += results
        elif role == "system":
            out.append({"id": m["id"], "role": "system", "content": text})
        else:
            out.append({"id": m["id"], "role": "user", "content": text})
    return out


def _tool_name(part: dict[str, Any]) -> str | None:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        return str(part.get("toolName", "tool"))
    return kind[len("tool-") :] if kind.startswith("tool-") else None


def result_content(part: dict[str, Any]) -> str:
    if part.get("state") == "output-error":
        return str(part.get("errorText", ""))
    output = part.get("output")
    return output if isinstance(output, str) else json.dumps(output)


# -- UI chunks out as AG-UI events -----------------------------------------------------------


class AguiEncoder:
    """UI message stream chunks (one reply's, in order) as AG-UI events. It tracks what is
    open (text, reasoning, tool calls, steps) so that the run never finishes with anything
    open, and so that a continuation can re-open what was open at any event."""

    def __init__(self, thread_id: str, run_id: str, reply_id: str) -> None:
        self.thread_id, self.run_id, self.reply_id = thread_id, run_id, reply_id
        self.text = False  # the reply's text message is open
        self.reasoning: str | None = None  # the open reasoning message's id
        self.tools: dict[str, str] = {}  # open tool calls: id -> name
        self.step: str | None = None
        self.steps = 0
        self.ended = False

    def started(self) -> Event:
        return {"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id}

    def reopen(self) -> list[Event]:
        """Events that open again what is open now (for a stream that continues here)."""
        events: list[Event] = []
        if self.step is not None:
            events.append({"type": "STEP_STARTED", "stepName": self.step})
        if self.text:
            events.append({"type": "TEXT_MESSAGE_START", "messageId": self.reply_id, "role": "assistant"})
        if self.reasoning is not None:
            events.append({"type": "REASONING_START", "messageId": self.reasoning})
            events.append(
                {"type": "REASONING_MESSAGE_START", "messageId": self.reasoning, "role": "reasoning"}
            )
        for call, name in self.tools.items():
            events.append(
                {
                    "type": "TOOL_CALL_START",
                    "toolCallId": call,
                    "toolCallName": name,
                    "parentMessageId": self.reply_id,
                }
            )
        return events

    def _close(self) -> list[Event]:
        events: list[Event] = []
        if self.text:
            self.text = False
            events.append({"type": "TEXT_MESSAGE_END", "messageId": self.reply_id})
        if self.reasoning is not None:
            events.append({"type": "REASONING_MESSAGE_END", "messageId": self.reasoning})
            events.append({"type": "REASONING_END", "messageId": self.reasoning})
            self.reasoning = None
        for call in list(self.tools):
            events.append({"type": "TOOL_CALL_END", "toolCallId": call})
        self.tools.clear()
        if self.step is not None:
            events.append({"type": "STEP_FINISHED", "stepName": self.step})
            self.step = None
        return events

    def chunk(self, chunk: dict[str, Any]) -> list[Event]:
        if self.ended:
            return []
        kind = chunk.get("type")
        match kind:
            case "start":
                return []
            case "text-start":
                if self.text:
                    return []
                self.text = True
                return [{"type": "TEXT_MESSAGE_START", "messageId": self.reply_id, "role": "assistant"}]
            case "text-delta":
                delta = chunk.get("delta") or ""
                if not delta:
                    return []
                opened = self.chunk({"type": "text-start"}) if not self.text else []
                return [*opened, {"type": "TEXT_MESSAGE_CONTENT", "messageId": self.reply_id, "delta": delta}]
            case "text-end":
                if not self.text:
                    return []
                self.text = False
                return [{"type": "TEXT_MESSAGE_END", "messageId": self.reply_id}]
            case "reasoning-start":
                if self.reasoning is not None:
                    return []
                self.reasoning = f"{self.reply_id}-{chunk.get('id', 'reasoning')}"
                return [
                    {"type": "REASONING_START", "messageId": self.reasoning},
                    {"type": "REASONING_MESSAGE_START", "messageId": self.reasoning, "role": "reasoning"},
                ]
            case "reasoning-delta":
                delta = chunk.get("delta") or ""
                if not delta or self.reasoning is None:
                    return []
                return [{"type": "REASONING_MESSAGE_CONTENT", "messageId": self.reasoning, "delta": delta}]
            case "reasoning-end":
                if self.reasoning is None:
                    return []
                rid, self.reasoning = self.reasoning, None
                return [
                    {"type": "REASONING_MESSAGE_END", "messageId": rid},
                    {"type": "REASONING_END", "messageId": rid},
                ]
            case "tool-input-start":
                call = str(chunk.get("toolCallId", ""))
                self.tools[call] = str(chunk.get("toolName", "tool"))
                return [
                    {
                        "type": "TOOL_CALL_START",
                        "toolCallId": call,
                        "toolCallName": self.tools[call],
                        "parentMessageId": self.reply_id,
                    }
                ]
            case "tool-input-available":
                call = str(chunk.get("toolCallId", ""))
                events = [] if call in self.tools else self.chunk({**chunk, "type": "tool-input-start"})
                self.tools.pop(call, None)
                return [
                    *events,
                    {"type": "TOOL_CALL_ARGS", "toolCallId": call, "delta": json.dumps(chunk.get("input"))},
                    {"type": "TOOL_CALL_END", "toolCallId": call},
                ]
            case "tool-output-available" | "tool-output-error":
                call = str(chunk.get("toolCallId", ""))
                content = (
                    str(chunk.get("errorText", ""))
                    if kind == "tool-output-error"
                    else result_content({"output": chunk.get("output")})
                )
                return [
                    {
                        "type": "TOOL_CALL_RESULT",
                        "messageId": f"{call}-result",
                        "toolCallId": call,
                        "content": content,
                        "role": "tool",
                    }
                ]
            case "start-step":
                events = [{"type": "STEP_FINISHED", "stepName": self.step}] if self.step else []
                self.steps += 1
                self.step = f"step-{self.steps}"
                return [*events, {"type": "STEP_STARTED", "stepName": self.step}]
            case "finish-step":
                if self.step is None:
                    return []
                step, self.step = self.step, None
                return [{"type": "STEP_FINISHED", "stepName": step}]
            case "finish" | "abort":
                self.ended = True
                outcome = {"type": "success"} if kind == "finish" else {"type": "cancelled"}
                return [
                    *self._close(),
                    {
                        "type": "RUN_FINISHED",
                        "threadId": self.thread_id,
                        "runId": self.run_id,
                        "outcome": outcome,
                    },
                ]
            case "error":
                self.ended = True
                return [{"type": "RUN_ERROR", "message": str(chunk.get("errorText") or "the run failed")}]
            case _:
                # AG-UI has no event for it: carried whole, so nothing of the reply is lost.
                return [{"type": "CUSTOM", "name": f"ai-sdk:{kind}", "value": chunk}]
