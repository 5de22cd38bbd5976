"""Context blocks: what the model always knows, rendered into a frozen system prompt.

Behavior, strings and formats are the original's (spec §7–§8), to the character: the
prompt's format and the entries' keys are :mod:`hub.contextprompt`'s, the
``set_context`` / ``load_context`` / ``unload_context`` / ``search_context`` tools
:mod:`hub.contexttools`'; this module holds the blocks, their providers and the prompt.

The rendered prompt is **frozen**: writes change the blocks (and what the tools report) but
never the prompt, so a model's prefix cache stays warm; only ``refresh_system_prompt``
re-renders it. With a prompt store the frozen prompt survives restarts byte for byte.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from protocol import ContextBlock, ContextError

from .contextprompt import (
    REMINDER_PREAMBLE,
    SEPARATOR,
    context_entry_key,
    prompt_renders_block,
    render_section,
    render_system_prompt,
)
from .contexttools import context_tools
from .tokens import estimate_string_tokens
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


# -- configuration -----------------------------------------------------------------------


@dataclass
class ContextConfig:
    """One block as configured: its label, optional description and token budget, and the
    provider behind it (None: empty and read-only, unless the owner supplies a default)."""

    label: str
    description: str | None = None
    max_tokens: int | None = None
    provider: Any = None
    #: What the model sees when the block's value moves on after the prompt was frozen
    #: (agents 0.32): ``"wait"``, nothing until ``refresh_system_prompt()``; ``"remind"``,
    #: :meth:`ContextBlocks.reminder` gives its current value to send after the cached
    #: prefix, the frozen prompt (and the provider's prefix cache) staying as they are.
    when_changed: Literal["wait", "remind"] = "wait"


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
            return dataclasses.replace(config, provider=self._default_provider(config.label))
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
            self._snapshot = render_system_prompt(self._blocks.values(), self._remind)
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
                before = render_system_prompt(self._blocks.values(), self._remind)
            await self.load()
            self._snapshot = render_system_prompt(self._blocks.values(), self._remind)
            if self.prompt_store is not None:
                await self._store_prompt(self._snapshot)
            elif self._on_change is not None and (before or "") != self._snapshot:
                await self._on_change("prompt.updated", {"prompt": self._snapshot})
            return self._snapshot

    @property
    def _remind(self) -> set[str]:
        return {c.label for c in self._configs if c.when_changed == "remind"}

    async def reminder(self) -> str | None:
        """The current values of the ``when_changed="remind"`` blocks that the frozen prompt
        no longer shows, rendered for the host to send after the cached prefix (at the end
        of the conversation, not in the system prompt); None when nothing changed or nothing
        is frozen yet. Each call re-reads those blocks; the comparison is against the frozen
        prompt itself (so it holds across restarts), and a reminder comes back on every call
        until ``refresh_system_prompt()`` folds the value in. As agents 0.32's ``reminder()``."""
        await self.ensure_loaded()
        frozen: str | None = None
        if self.prompt_store is not None:
            stored = await call(self.prompt_store.get)
            frozen = None if stored is None else str(stored)
        if frozen is None:
            frozen = self._snapshot
        if frozen is None:
            return None
        sections = []
        for config in self._configs:
            if config.when_changed != "remind":
                continue
            block = await self._load_block(config)
            self._blocks[config.label] = block
            if not prompt_renders_block(frozen, block):
                sections.append(render_section(block))
        return "\n\n".join([REMINDER_PREAMBLE, *sections]) if sections else None

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
        return render_system_prompt(self._blocks.values(), self._remind)

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
        """The tools the current blocks call for (none when every block is read-only):
        :mod:`hub.contexttools`."""
        await self.ensure_loaded()
        return context_tools(self, list(self._blocks.values()), list(self._loaded_skills))
