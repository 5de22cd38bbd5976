"""What the framework backends (``clients.openai_agents``, ``clients.pydantic_ai``) share about
keeping a framework's own records in hub messages.

Each backend keeps the records a message shows (the Agents SDK's items, Pydantic AI's message
dumps) under ``metadata[<its key>][<field>]``, reads other writers' messages from their text
and tool parts, and treats a compaction summary as a prompt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from protocol import Message

__all__ = ["SUMMARY_PREFIX", "kept_records", "missing_package", "parsed_arguments", "tool_name"]

#: The id prefix of the synthetic message standing for a compacted span (hub.store.overlays;
#: the clients do not import the engine).
SUMMARY_PREFIX = "compaction_"


def kept_records(message: Message, key: str, field: str) -> list[dict[str, Any]] | None:
    """The records a backend kept in ``message`` (copies), or None for a message it did not write."""
    meta = message.metadata
    if isinstance(meta, Mapping):
        mine = meta.get(key)
        if isinstance(mine, Mapping) and isinstance(mine.get(field), list):
            return [dict(record) for record in mine[field] if isinstance(record, Mapping)]
    return None


def tool_name(part: Mapping[str, Any]) -> str | None:
    """The tool a UI message part calls (``tool-<name>``, or a ``dynamic-tool``'s
    ``toolName``) when it has a call id; None for every other part."""
    kind = part.get("type")
    if not isinstance(kind, str) or not isinstance(part.get("toolCallId"), str) or not part["toolCallId"]:
        return None
    if kind == "dynamic-tool":
        return str(part.get("toolName"))
    return kind[len("tool-") :] if kind.startswith("tool-") else None


def parsed_arguments(arguments: Any) -> Any:
    """A tool call's arguments as a UI tool part's ``input``: JSON text parsed, anything else
    (or text that is not JSON) as given."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def missing_package(module: str, package: str, extra: str) -> ImportError:
    """The error a backend raises when its framework is not installed: what to install."""
    return ImportError(f'{module} needs the {package} package: pip install "sessionhub[{extra}]"')
