"""How a streamed message grows by one delta: the same rule for the hub that applies a
writer's deltas, for a node mirroring another node's stream, and for a client rebuilding
the message from ``stream`` frames."""

from __future__ import annotations

from typing import Any

from .errors import InvalidInput

__all__ = ["apply_delta"]


def apply_delta(parts: list[dict[str, Any]], kind: Any, text: Any, part: Any) -> None:
    """Grow ``parts`` by one delta: text and reasoning extend the last part of their kind;
    a tool part replaces the part with its ``toolCallId`` (or is added). A delta that is
    none of these raises :class:`~protocol.errors.InvalidInput` and changes nothing."""
    if kind in ("text", "reasoning"):
        if not isinstance(text, str):
            raise InvalidInput(f"a {kind} delta needs `text`")
        if parts and parts[-1].get("type") == kind and isinstance(parts[-1].get("text"), str):
            parts[-1]["text"] += text
        else:
            parts.append({"type": kind, "text": text})
        return
    tool = part.get("type") if isinstance(part, dict) else None
    if (
        not isinstance(part, dict)
        or not isinstance(tool, str)
        or not (tool.startswith("tool-") or tool == "dynamic-tool")
    ):
        raise InvalidInput("a tool delta needs a `part` of type `tool-<name>` or `dynamic-tool`")
    call_id = part.get("toolCallId")
    for i, existing in enumerate(parts):
        if call_id is not None and existing.get("toolCallId") == call_id:
            parts[i] = dict(part)
            return
    parts.append(dict(part))
