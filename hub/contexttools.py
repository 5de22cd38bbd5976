"""The context tools a session's blocks call for: ``set_context`` (any writable block),
``load_context`` and ``unload_context`` (skill blocks), ``search_context`` (searchable
blocks), with the original's descriptions, schemas and answers to the character.

The tools act on the blocks through :class:`BlockTarget` (what
:class:`~hub.context.ContextBlocks` offers), so this module does not import it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from protocol import ContextBlock

from .contextprompt import context_entry_key, usage_percent
from .tools import Tool

__all__ = ["BlockTarget", "context_tools"]


class BlockTarget(Protocol):
    """The writes and reads of a session's blocks that the tools call."""

    def get_block(self, label: str) -> ContextBlock | None: ...

    async def set_block(self, label: str, content: str) -> ContextBlock: ...

    async def append_to_block(self, label: str, content: str) -> ContextBlock: ...

    async def set_skill(
        self, label: str, key: str, content: str, description: str | None = None
    ) -> ContextBlock: ...

    async def set_search_entry(self, label: str, key: str, content: str) -> ContextBlock: ...

    async def load_skill(self, label: str, key: str) -> str | None: ...

    async def unload_skill(self, label: str, key: str) -> bool: ...

    async def search_context(self, label: str, query: str) -> str | None: ...


def _quoted(labels: Sequence[str]) -> str:
    return ", ".join(f'"{label}"' for label in labels)


def _label_schema(labels: Sequence[str], description: str) -> dict[str, Any]:
    # What the AI SDK sends for a zod enum: a one-value enum becomes a const.
    if len(labels) == 1:
        return {"type": "string", "const": labels[0], "description": description}
    return {"type": "string", "enum": list(labels), "description": description}


_SET_CONTEXT_HINT = (
    "\n\nFor keyed blocks (skill collections / searchable), pass `metadata: { title, description }` "
    "— title stabilises updates, description helps the model pick entries. Metadata is optional; "
    "short content rarely needs it, long loadable entries benefit most."
)


def context_tools(target: BlockTarget, blocks: Sequence[ContextBlock], loaded: Sequence[str]) -> list[Tool]:
    """The tools ``blocks`` call for (none when every block is read-only); ``loaded``: the
    skills loaded now, in the order they were (``unload_context`` lists them)."""
    writable = [b for b in blocks if b.writable]
    skills = [b.label for b in blocks if b.is_skill]
    searchable = [b.label for b in blocks if b.is_searchable]
    out: list[Tool] = []
    if writable:
        out.append(_set_context_tool(target, writable))
    if skills:
        out.append(_load_context_tool(target, skills))
        out.append(_unload_context_tool(target, skills, list(loaded)))
    if searchable:
        out.append(_search_context_tool(target, searchable))
    return out


def _set_context_tool(target: BlockTarget, writable: list[ContextBlock]) -> Tool:
    lines = []
    for b in writable:
        if b.is_skill:
            kind = "skill collection, keyed entries"
        elif b.is_searchable:
            kind = "searchable, keyed entries"
        else:
            kind = "writable"
        lines.append(f'- "{b.label}" ({kind}): {b.description or "no description"}')
    keyed = [b.label for b in writable if b.is_skill or b.is_searchable]
    description = (
        "Write to a context block. Available blocks:\n"
        + "\n".join(lines)
        + "\n\nWrites are durable and persist across sessions."
        + (_SET_CONTEXT_HINT if keyed else "")
    )
    properties: dict[str, Any] = {
        "label": _label_schema([b.label for b in writable], "Block label to write to"),
        "content": {"type": "string", "description": "The main content to write to the block."},
        "action": {
            "type": "string",
            "enum": ["replace", "append"],
            "description": "replace (default) or append",
        },
    }
    if keyed:
        properties["metadata"] = {
            "type": "object",
            "properties": {
                "title": {
                    "type": "string",
                    "description": "Short title. Used as a stable identifier — entries with the "
                    "same title are updated in place, different titles create new entries.",
                },
                "description": {
                    "type": "string",
                    "description": "One-line summary shown alongside the title in the system "
                    "prompt so the model can decide when to load the entry.",
                },
            },
            "additionalProperties": {},
            "description": "Optional metadata for keyed entries (skill collections, searchable "
            f"blocks: {_quoted(keyed)}). Short content doesn't need metadata; longer loadable "
            "entries (skills) benefit from a title and description so the model can pick the "
            "right one without loading it.",
        }
    schema = {
        "type": "object",
        "properties": properties,
        "required": ["label", "content"],
        "additionalProperties": {},
    }

    async def run(args: dict[str, Any]) -> str:
        label, content = args["label"], args["content"]
        block = target.get_block(label)
        if block is None:
            return f'Error: block "{label}" not found'
        if block.is_skill or block.is_searchable:
            metadata = args.get("metadata") or {}
            title = metadata.get("title")
            title = title if isinstance(title, str) else None
            key = context_entry_key(title, content)
            if block.is_skill:
                summary = metadata.get("description")
                summary = summary if isinstance(summary, str) else None
                await target.set_skill(label, key, content, summary if summary is not None else title)
            else:
                await target.set_search_entry(label, key, content)
            return f'Indexed "{key}" in {label}.'
        if args.get("action") == "append":
            written = await target.append_to_block(label, content)
        else:
            written = await target.set_block(label, content)
        if written.max_tokens:
            pct = usage_percent(written.tokens, written.max_tokens)
            usage = f"{pct}% ({written.tokens}/{written.max_tokens} tokens)"
        else:
            usage = f"{written.tokens} tokens"
        return f"Written to {label}. Usage: {usage}"

    return Tool("set_context", description, schema, run)


def _skill_schema(skills: list[str], key_description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "label": _label_schema(skills, "Skill block label"),
            "key": {"type": "string", "description": key_description},
        },
        "required": ["label", "key"],
        "additionalProperties": {},
    }


def _load_context_tool(target: BlockTarget, skills: list[str]) -> Tool:
    description = (
        f"Load a document from a skill block by key. Available skill blocks: {_quoted(skills)}. "
        "Check the system prompt for available keys."
    )

    async def run(args: dict[str, Any]) -> str:
        label, key = args["label"], args["key"]
        if label not in skills:
            return f'Error: "{label}" is not a skill block. Skill blocks: {", ".join(skills)}'
        content = await target.load_skill(label, key)
        return f"Not found: {key}" if content is None else content

    return Tool("load_context", description, _skill_schema(skills, "Skill key to load"), run)


def _unload_context_tool(target: BlockTarget, skills: list[str], loaded: list[str]) -> Tool:
    description = (
        "Unload a previously loaded skill to free context space. The skill remains available "
        "for re-loading."
        + (f" Currently loaded: {', '.join(loaded)}." if loaded else " No skills currently loaded.")
    )

    async def run(args: dict[str, Any]) -> str:
        label, key = args["label"], args["key"]
        if label not in skills:
            return f'Error: "{label}" is not a skill block. Skill blocks: {", ".join(skills)}'
        if not await target.unload_skill(label, key):
            return f'Skill "{key}" is not currently loaded in "{label}".'
        return f'Unloaded "{key}" from {label}. Context reclaimed.'

    return Tool("unload_context", description, _skill_schema(skills, "Skill key to unload"), run)


def _search_context_tool(target: BlockTarget, searchable: list[str]) -> Tool:
    description = (
        "Search for information in a searchable context block. ONLY these blocks are "
        f"searchable: {_quoted(searchable)}. Other blocks cannot be searched."
    )
    schema = {
        "type": "object",
        "properties": {
            "label": _label_schema(searchable, "Searchable block label"),
            "query": {"type": "string", "description": "Search query"},
        },
        "required": ["label", "query"],
        "additionalProperties": {},
    }

    async def run(args: dict[str, Any]) -> str:
        label, query = args["label"], args["query"]
        if label not in searchable:
            return f'Error: "{label}" is not searchable. Searchable blocks: {", ".join(searchable)}'
        result = await target.search_context(label, query)
        return "No results found." if result is None else result

    return Tool("search_context", description, schema, run)
