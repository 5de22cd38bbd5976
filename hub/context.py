"""Context blocks: what the model always knows, rendered into a frozen system prompt.

Behavior, strings and formats are the original's (spec §7–§8), to the character: the
46-``═`` rule, ``LABEL (description) [pct% — t/max tokens] [tag]`` headers with JavaScript
half-up rounding, empty read-only blocks omitted, sections joined by a blank line, and the
``set_context`` / ``load_context`` / ``unload_context`` / ``search_context`` tools.

The rendered prompt is **frozen**: writes change the blocks (and what the tools report) but
never the prompt, so a model's prefix cache stays warm; only ``refresh_system_prompt``
re-renders it. With a prompt store the frozen prompt survives restarts byte for byte.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from protocol import ContextBlock, ContextError

from .tokens import JS_WHITESPACE, estimate_string_tokens
from .tools import Tool

__all__ = [
    "SEPARATOR",
    "ContextBlocks",
    "ContextConfig",
    "call",
    "context_entry_key",
    "is_search_provider",
    "is_skill_provider",
    "is_writable_provider",
]

log = logging.getLogger("sessionhub.context")

SEPARATOR = "═" * 46

ChangeListener = Callable[[str, dict[str, Any]], Awaitable[None]]
UnloadListener = Callable[[str, str], Awaitable[None]]


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a provider method that may be sync or async."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _has(provider: object, name: str) -> bool:
    return callable(getattr(provider, name, None))


def is_writable_provider(provider: object) -> bool:
    return _has(provider, "set")


def is_skill_provider(provider: object) -> bool:
    return _has(provider, "load")


def is_search_provider(provider: object) -> bool:
    return _has(provider, "search")


# -- entry keys ----------------------------------------------------------------------------

_NON_SLUG = re.compile(r"[^a-z0-9]+")


def _utf16_prefix(text: str, units: int) -> str:
    data = text.encode("utf-16-le", "surrogatepass")[: units * 2]
    return data.decode("utf-16-le", "surrogatepass")


def _slugify(text: str) -> str:
    slug = _NON_SLUG.sub("-", _utf16_prefix(text, 60).lower())
    if slug.startswith("-"):
        slug = slug[1:]
    if slug.endswith("-"):
        slug = slug[:-1]
    return slug


def _base36(value: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    if value == 0:
        return "0"
    out = []
    while value:
        value, rem = divmod(value, 36)
        out.append(digits[rem])
    return "".join(reversed(out))


def _stable_hash(text: str) -> str:
    """32-bit FNV-1a over UTF-16 code units, in lowercase base 36."""
    data = text.encode("utf-16-le", "surrogatepass")
    h = 0x811C9DC5
    for i in range(0, len(data), 2):
        h ^= data[i] | (data[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return _base36(h)


def context_entry_key(title: str | None, content: str) -> str:
    """The key of a skill or search entry: the title's slug (same title → same entry,
    updated in place), else a slug of the content plus its hash."""
    if title is not None and title.strip(JS_WHITESPACE):  # JavaScript's trim()
        return _slugify(title) or "entry-" + _stable_hash(title)
    return (_slugify(content) or "entry") + "-" + _stable_hash(content)


# -- configuration and rendering -----------------------------------------------------------


@dataclass
class ContextConfig:
    """One block as configured: its label, optional description and token budget, and the
    provider behind it (None: empty and read-only, unless the owner supplies a default)."""

    label: str
    description: str | None = None
    max_tokens: int | None = None
    provider: Any = None


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _usage_percent(tokens: int, max_tokens: int) -> int:
    return _round_half_up(tokens / max_tokens * 100)


def _tag(block: ContextBlock) -> str:
    if block.is_searchable:
        return "[searchable]"
    if block.is_skill:
        return "[loadable]"
    if not block.writable:
        return "[readonly]"
    return "[writable]"


def render_system_prompt(blocks: Iterable[ContextBlock]) -> str:
    """The system prompt for these blocks, in order."""
    sections = []
    for block in blocks:
        if block.content == "" and not (block.writable or block.is_searchable or block.is_skill):
            continue
        header = block.label.upper()
        if block.description:
            header += f" ({block.description})"
        if block.max_tokens:
            pct = _usage_percent(block.tokens, block.max_tokens)
            header += f" [{pct}% — {block.tokens}/{block.max_tokens} tokens]"
        header += " " + _tag(block)
        sections.append(f"{SEPARATOR}\n{header}\n{SEPARATOR}\n{block.content}")
    return "\n\n".join(sections)


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


class ContextBlocks:
    """The blocks of one session, their providers, the frozen prompt and the tools.

    ``prompt_store`` (any writable provider) persists the frozen prompt. ``default_provider``
    makes a provider for a config that has none. ``on_change(type, data)`` is awaited after
    each write whose provider does not log its own event; ``on_unload(label, key)`` after a
    skill is unloaded (the session uses it to reclaim the skill's text from history).
    """

    def __init__(
        self,
        configs: Iterable[ContextConfig] = (),
        prompt_store: Any = None,
        default_provider: Callable[[str], Any] | None = None,
        *,
        on_change: ChangeListener | None = None,
        on_unload: UnloadListener | None = None,
    ) -> None:
        self._configs: list[ContextConfig] = []
        self._default_provider = default_provider
        for config in configs:
            self._configs.append(self._with_provider(config))
        self.prompt_store = prompt_store
        self._on_change = on_change
        self._on_unload = on_unload
        self._blocks: dict[str, ContextBlock] = {}
        self._loaded = False
        self._snapshot: str | None = None
        # Insertion-ordered (a dict), like the original's Set: tool descriptions list skills
        # in the order they were loaded.
        self._loaded_skills: dict[str, None] = {}
        self._prompt_lock = asyncio.Lock()

    def _with_provider(self, config: ContextConfig) -> ContextConfig:
        if not isinstance(config.label, str) or not config.label:
            raise ContextError("A context block needs a non-empty string label")
        if config.provider is None and self._default_provider is not None:
            return ContextConfig(
                config.label,
                config.description,
                config.max_tokens,
                self._default_provider(config.label),
            )
        return config

    def _config(self, label: str) -> ContextConfig | None:
        for config in self._configs:
            if config.label == label:
                return config
        return None

    # -- loading -------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        return self._loaded

    async def load(self) -> None:
        """Read every block from its provider (``init(label)`` first)."""
        blocks: dict[str, ContextBlock] = {}
        for config in self._configs:
            blocks[config.label] = await self._load_block(config)
        self._blocks = blocks
        self._loaded = True

    async def ensure_loaded(self) -> None:
        if not self._loaded:
            await self.load()

    async def _load_block(self, config: ContextConfig) -> ContextBlock:
        provider = config.provider
        content: Any = None
        if provider is not None:
            # As the original: every load (the first, and each refresh) calls init first.
            if _has(provider, "init"):
                await call(provider.init, config.label)
            content = await call(provider.get)
        text = "" if content is None else str(content)
        return ContextBlock(
            label=config.label,
            description=config.description,
            content=text,
            tokens=estimate_string_tokens(text),
            max_tokens=config.max_tokens,
            writable=provider is not None and is_writable_provider(provider),
            is_skill=provider is not None and is_skill_provider(provider),
            is_searchable=provider is not None and is_search_provider(provider),
        )

    def get_block(self, label: str) -> ContextBlock | None:
        return self._blocks.get(label)

    def get_blocks(self) -> list[ContextBlock]:
        return list(self._blocks.values())

    # -- the frozen prompt ---------------------------------------------------------------
    def to_system_prompt(self) -> str:
        """The frozen prompt: rendered on first call, then the same string every time."""
        if not self._loaded:
            raise ContextError("Context blocks not loaded. Call load() first.")
        if self._snapshot is None:
            self._snapshot = render_system_prompt(self._blocks.values())
        return self._snapshot

    async def freeze_system_prompt(self) -> str:
        """The stored prompt if there is one (an empty string counts), else render once,
        persist it and keep returning it. Concurrent callers get the same string."""
        async with self._prompt_lock:
            if self.prompt_store is not None:
                stored = await call(self.prompt_store.get)
                if stored is not None:
                    self._snapshot = str(stored)
                    return self._snapshot
            if self._snapshot is not None and self.prompt_store is None:
                return self._snapshot
            await self.ensure_loaded()
            prompt = self.to_system_prompt()
            if self.prompt_store is not None:
                await self._store_prompt(prompt)
            return prompt

    async def refresh_system_prompt(self) -> str:
        """Reload every provider, re-render, persist and return the new frozen prompt.

        Without a prompt store, ``prompt.updated`` is logged only when the prompt changed:
        a compaction or a clear refreshes every session that has blocks, and a session
        whose prompt stayed the same (often empty) must not show subscribers a change."""
        async with self._prompt_lock:
            before = self._snapshot
            if before is None and self._loaded:
                before = render_system_prompt(self._blocks.values())
            await self.load()
            self._snapshot = render_system_prompt(self._blocks.values())
            if self.prompt_store is not None:
                await self._store_prompt(self._snapshot)
            elif self._on_change is not None and (before or "") != self._snapshot:
                await self._on_change("prompt.updated", {"prompt": self._snapshot})
            return self._snapshot

    async def _store_prompt(self, prompt: str) -> None:
        await call(self.prompt_store.set, prompt)
        if self._on_change is not None and not getattr(self.prompt_store, "emits_events", False):
            await self._on_change("prompt.updated", {"prompt": prompt})

    async def prompt_for_estimate(self) -> str:
        """The prompt as a token estimate should count it, freezing and persisting nothing."""
        if self._snapshot is not None:
            return self._snapshot
        if self.prompt_store is not None:
            stored = await call(self.prompt_store.get)
            if stored is not None:
                return str(stored)
        await self.ensure_loaded()
        return render_system_prompt(self._blocks.values())

    # -- writes --------------------------------------------------------------------------
    async def _changed(self, provider: Any, type_: str, data: dict[str, Any]) -> None:
        if self._on_change is not None and not getattr(provider, "emits_events", False):
            await self._on_change(type_, data)

    async def set_block(self, label: str, content: str) -> ContextBlock:
        """Replace a writable block's content (``max_tokens`` enforced). The frozen prompt
        does not change."""
        await self.ensure_loaded()
        if not isinstance(content, str):
            raise ContextError(f'Block "{label}" content must be a string')
        block = self._blocks.get(label)
        if block is None:
            # Departure: the original said an unknown label "is readonly", which sends the
            # caller looking for a permission problem; append_to_block already says this.
            raise ContextError(f'Block "{label}" not found')
        config = self._config(label)
        if config is None or not block.writable:
            raise ContextError(f'Block "{label}" is readonly')
        if block.is_skill or block.is_searchable:
            raise ContextError(
                f'Block "{label}" is a keyed provider. Use setSkill() or setSearchEntry() instead.'
            )
        tokens = estimate_string_tokens(content)
        if config.max_tokens and tokens > config.max_tokens:
            raise ContextError(f'Block "{label}" exceeds maxTokens: {tokens} > {config.max_tokens}')
        await call(config.provider.set, content)
        block = msgspec.structs.replace(block, content=content, tokens=tokens)
        self._blocks[label] = block
        await self._changed(config.provider, "context.updated", {"label": label, "content": content})
        return block

    async def append_to_block(self, label: str, content: str) -> ContextBlock:
        await self.ensure_loaded()
        block = self._blocks.get(label)
        if block is None:
            raise ContextError(f'Block "{label}" not found')
        if not isinstance(content, str):
            raise ContextError(f'Block "{label}" content must be a string')
        separator = "\n" if block.content and not content.startswith("\n") else ""
        return await self.set_block(label, block.content + separator + content)

    def _keyed(self, label: str, kind: str) -> ContextConfig:
        block = self._blocks.get(label)
        config = self._config(label)
        is_kind = block is not None and (block.is_skill if kind == "skill" else block.is_searchable)
        if not is_kind or config is None:
            noun = "a skill provider" if kind == "skill" else "a search provider"
            raise ContextError(f'Block "{label}" is not {noun}')
        return config

    async def set_skill(
        self, label: str, key: str, content: str, description: str | None = None
    ) -> ContextBlock:
        await self.ensure_loaded()
        config = self._keyed(label, "skill")
        if not is_writable_provider(config.provider):
            raise ContextError(f'Block "{label}" does not support writes')
        await call(config.provider.set, key, content, description)
        refreshed = await call(config.provider.get)
        block = self._blocks[label]
        if refreshed:
            text = str(refreshed)
            block = msgspec.structs.replace(block, content=text, tokens=estimate_string_tokens(text))
            self._blocks[label] = block
        await self._changed(
            config.provider,
            "context.entry_set",
            {"label": label, "key": key, "content": content, "description": description},
        )
        return block

    async def load_skill(self, label: str, key: str) -> str | None:
        await self.ensure_loaded()
        config = self._keyed(label, "skill")
        content = await call(config.provider.load, key)
        if content is None:
            return None
        self._loaded_skills[f"{label}:{key}"] = None
        if self._on_change is not None:
            await self._on_change("context.skill_loaded", {"label": label, "key": key})
        return str(content)

    async def unload_skill(self, label: str, key: str) -> bool:
        skill_id = f"{label}:{key}"
        if skill_id not in self._loaded_skills:
            return False
        self._loaded_skills.pop(skill_id, None)
        if self._on_change is not None:
            await self._on_change("context.skill_unloaded", {"label": label, "key": key})
        if self._on_unload is not None:
            try:
                await self._on_unload(label, key)
            except Exception:  # reclaiming is best effort; the unload itself happened
                log.exception("reclaiming unloaded skill %s failed", skill_id)
        return True

    def get_loaded_skill_keys(self) -> set[str]:
        return set(self._loaded_skills)

    def restore_loaded_skills(self, skill_ids: Iterable[str]) -> None:
        self._loaded_skills = dict.fromkeys(skill_ids)

    def clear_skill_state(self) -> None:
        self._loaded_skills.clear()

    async def set_search_entry(self, label: str, key: str, content: str) -> ContextBlock:
        await self.ensure_loaded()
        config = self._keyed(label, "search")
        if not is_writable_provider(config.provider):
            raise ContextError(f'Block "{label}" does not support writes')
        await call(config.provider.set, key, content)
        refreshed = await call(config.provider.get)
        text = "" if refreshed is None else str(refreshed)
        block = msgspec.structs.replace(
            self._blocks[label], content=text, tokens=estimate_string_tokens(text)
        )
        self._blocks[label] = block
        await self._changed(
            config.provider, "context.entry_set", {"label": label, "key": key, "content": content}
        )
        return block

    async def search_context(self, label: str, query: str) -> str | None:
        await self.ensure_loaded()
        config = self._keyed(label, "search")
        result = await call(config.provider.search, query)
        return None if result is None else str(result)

    async def add_block(self, config: ContextConfig) -> ContextBlock:
        """Add a block (after loading the others). The frozen prompt does not change."""
        await self.ensure_loaded()
        if self._config(config.label) is not None:
            raise ContextError(f'Block "{config.label}" already exists')
        config = self._with_provider(config)
        self._configs.append(config)
        block = await self._load_block(config)
        self._blocks[config.label] = block
        if self._on_change is not None:
            await self._on_change("context.added", {"block": msgspec.to_builtins(block)})
        return block

    async def remove_block(self, label: str) -> bool:
        """Remove a block; its loaded skills are forgotten without rewriting history."""
        config = self._config(label)
        if config is None:
            return False
        self._configs.remove(config)
        self._blocks.pop(label, None)
        self._loaded_skills = {s: None for s in self._loaded_skills if not s.startswith(f"{label}:")}
        if self._on_change is not None:
            await self._on_change("context.removed", {"label": label})
        return True

    # -- tools ---------------------------------------------------------------------------
    async def tools(self) -> list[Tool]:
        """The tools the current blocks call for (none when every block is read-only)."""
        await self.ensure_loaded()
        blocks = list(self._blocks.values())
        writable = [b for b in blocks if b.writable]
        skills = [b.label for b in blocks if b.is_skill]
        searchable = [b.label for b in blocks if b.is_searchable]
        out: list[Tool] = []
        if writable:
            out.append(self._set_context_tool(writable))
        if skills:
            out.append(self._load_context_tool(skills))
            out.append(self._unload_context_tool(skills))
        if searchable:
            out.append(self._search_context_tool(searchable))
        return out

    def _set_context_tool(self, writable: list[ContextBlock]) -> Tool:
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
            block = self._blocks.get(label)
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
                    await self.set_skill(label, key, content, summary if summary is not None else title)
                else:
                    await self.set_search_entry(label, key, content)
                return f'Indexed "{key}" in {label}.'
            if args.get("action") == "append":
                written = await self.append_to_block(label, content)
            else:
                written = await self.set_block(label, content)
            if written.max_tokens:
                pct = _usage_percent(written.tokens, written.max_tokens)
                usage = f"{pct}% ({written.tokens}/{written.max_tokens} tokens)"
            else:
                usage = f"{written.tokens} tokens"
            return f"Written to {label}. Usage: {usage}"

        return Tool("set_context", description, schema, run)

    def _skill_schema(self, skills: list[str], key_description: str) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "label": _label_schema(skills, "Skill block label"),
                "key": {"type": "string", "description": key_description},
            },
            "required": ["label", "key"],
            "additionalProperties": {},
        }

    def _load_context_tool(self, skills: list[str]) -> Tool:
        description = (
            f"Load a document from a skill block by key. Available skill blocks: {_quoted(skills)}. "
            "Check the system prompt for available keys."
        )

        async def run(args: dict[str, Any]) -> str:
            label, key = args["label"], args["key"]
            if label not in skills:
                return f'Error: "{label}" is not a skill block. Skill blocks: {", ".join(skills)}'
            content = await self.load_skill(label, key)
            return f"Not found: {key}" if content is None else content

        return Tool("load_context", description, self._skill_schema(skills, "Skill key to load"), run)

    def _unload_context_tool(self, skills: list[str]) -> Tool:
        loaded = list(self._loaded_skills)
        description = (
            "Unload a previously loaded skill to free context space. The skill remains available "
            "for re-loading."
            + (f" Currently loaded: {', '.join(loaded)}." if loaded else " No skills currently loaded.")
        )

        async def run(args: dict[str, Any]) -> str:
            label, key = args["label"], args["key"]
            if label not in skills:
                return f'Error: "{label}" is not a skill block. Skill blocks: {", ".join(skills)}'
            if not await self.unload_skill(label, key):
                return f'Skill "{key}" is not currently loaded in "{label}".'
            return f'Unloaded "{key}" from {label}. Context reclaimed.'

        return Tool("unload_context", description, self._skill_schema(skills, "Skill key to unload"), run)

    def _search_context_tool(self, searchable: list[str]) -> Tool:
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
            result = await self.search_context(label, query)
            return "No results found." if result is None else result

        return Tool("search_context", description, schema, run)
