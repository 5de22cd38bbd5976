"""Context blocks, the frozen system prompt, the context tools and their events.

Ported from the original's catalogue (spec §16.1): ``session/session.test.ts`` (ContextBlocks
— frozen system prompt, tools() without load, the Session.create() builder, edge cases and
the DO-backed context cases, with real store rows instead of the SQL stub),
``session/search.test.ts``, ``session/skills.test.ts`` and ``session/init-lifecycle.test.ts``;
plus events, restarts and the SessionManager's context templates.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from hub import (
    ContextBlock,
    ContextBlocks,
    ContextConfig,
    ContextError,
    ReadonlyText,
    Session,
    SessionManager,
    SqliteStore,
    StoreSearchProvider,
    context_entry_key,
)
from hub.tokens import estimate_string_tokens
from hub.tools import Tool, dispatch
from tests.support.hubtest import text_message as T

SEP = "═" * 46

SET_CONTEXT_HINT = (
    "\n\nFor keyed blocks (skill collections / searchable), pass `metadata: { title, description }` "
    "— title stabilises updates, description helps the model pick entries. Metadata is optional; "
    "short content rarely needs it, long loadable entries benefit most."
)


def section(header: str, content: str) -> str:
    return f"{SEP}\n{header}\n{SEP}\n{content}"


# -- in-memory providers (sync and async flavours) ---------------------------------------------


class Mem:
    """Writable, sync."""

    def __init__(self, value: str | None = None) -> None:
        self.value = value
        self.sets: list[str] = []
        self.gets = 0

    def get(self) -> str | None:
        self.gets += 1
        return self.value

    def set(self, content: str) -> None:
        self.value = content
        self.sets.append(content)


class AsyncMem:
    """Writable, async."""

    def __init__(self, value: str | None = None) -> None:
        self.value = value

    async def get(self) -> str | None:
        await asyncio.sleep(0)
        return self.value

    async def set(self, content: str) -> None:
        await asyncio.sleep(0)
        self.value = content


class Readonly:
    """Get-only; counts reads."""

    def __init__(self, value: str | None) -> None:
        self.value = value
        self.gets = 0

    def get(self) -> str | None:
        self.gets += 1
        return self.value


class Skills:
    """A skill collection, sync: ``get`` lists ``- key: description``."""

    def __init__(self, docs: dict[str, tuple[str, str | None]] | None = None) -> None:
        self.docs: dict[str, tuple[str, str | None]] = dict(docs or {})
        self.calls: list[tuple[str, str, str | None]] = []

    def get(self) -> str | None:
        lines = [f"- {key}: {desc}" if desc else f"- {key}" for key, (_, desc) in self.docs.items()]
        return "\n".join(lines) or None

    def load(self, key: str) -> str | None:
        doc = self.docs.get(key)
        return None if doc is None else doc[0]

    def set(self, key: str, content: str, description: str | None = None) -> None:
        self.calls.append((key, content, description))
        self.docs[key] = (content, description)


class AsyncSkills:
    def __init__(self, docs: dict[str, tuple[str, str | None]] | None = None) -> None:
        self.inner = Skills(docs)

    async def get(self) -> str | None:
        return self.inner.get()

    async def load(self, key: str) -> str | None:
        return self.inner.load(key)

    async def set(self, key: str, content: str, description: str | None = None) -> None:
        self.inner.set(key, content, description)


class ReadonlySkills:
    def __init__(self, docs: dict[str, tuple[str, str | None]]) -> None:
        self.inner = Skills(docs)

    def get(self) -> str | None:
        return self.inner.get()

    def load(self, key: str) -> str | None:
        return self.inner.load(key)


def _matches(query: str, content: str) -> bool:
    words = [w.lower() for w in query.split()]
    have = set(re.findall(r"\w+", content.lower()))
    return bool(words) and all(w in have for w in words)


class Search:
    """Searchable, sync: every query word must appear."""

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}

    def get(self) -> str | None:
        return f"{len(self.entries)} entries indexed." if self.entries else None

    def search(self, query: str) -> str | None:
        hits = [f"[{k}]\n{v}" for k, v in self.entries.items() if _matches(query, v)]
        return "\n\n".join(hits) or None

    def set(self, key: str, content: str) -> None:
        self.entries[key] = content


class AsyncSearch:
    def __init__(self) -> None:
        self.inner = Search()

    @property
    def entries(self) -> dict[str, str]:
        return self.inner.entries

    async def get(self) -> str | None:
        await asyncio.sleep(0)
        return self.inner.get()

    async def search(self, query: str) -> str | None:
        await asyncio.sleep(0)
        return self.inner.search(query)

    async def set(self, key: str, content: str) -> None:
        await asyncio.sleep(0)
        self.inner.set(key, content)


class ReadonlySearch:
    def __init__(self, entries: dict[str, str]) -> None:
        self.inner = Search()
        self.inner.entries.update(entries)

    def get(self) -> str | None:
        return self.inner.get()

    def search(self, query: str) -> str | None:
        return self.inner.search(query)


class Recording:
    """Records ``init(label)`` and ``get`` calls; optionally writable/skill/search."""

    def __init__(self, log: list[str] | None = None, value: str = "content") -> None:
        self.log = log if log is not None else []
        self.value = value
        self.labels: list[str] = []

    def init(self, label: str) -> None:
        self.labels.append(label)
        self.log.append(f"init:{label}")

    def get(self) -> str | None:
        self.log.append("get")
        return self.value


class RecordingWritable(Recording):
    def set(self, content: str) -> None:
        self.value = content


class RecordingSkills(Recording):
    def load(self, key: str) -> str | None:
        return None


class RecordingSearch(Recording):
    def search(self, query: str) -> str | None:
        return None


class LabelledSearch:
    """Uses the label ``init`` gave it; async methods."""

    def __init__(self) -> None:
        self.label: str | None = None
        self.entries: dict[str, dict[str, str]] = {}

    async def init(self, label: str) -> None:
        self.label = label

    def _mine(self) -> dict[str, str]:
        assert self.label is not None, "init(label) must run before anything else"
        return self.entries.setdefault(self.label, {})

    async def get(self) -> str | None:
        mine = self._mine()
        return f"{self.label}: {len(mine)} entries" if mine else None

    async def search(self, query: str) -> str | None:
        hits = [f"[{k}]\n{v}" for k, v in self._mine().items() if _matches(query, v)]
        return "\n\n".join(hits) or None

    async def set(self, key: str, content: str) -> None:
        self._mine()[key] = content


# -- helpers -----------------------------------------------------------------------------------


async def tool_map(source: Session | ContextBlocks) -> dict[str, Tool]:
    return {t.name: t for t in await source.tools()}


async def run_tool(source: Session | ContextBlocks, name: str, arguments: dict[str, Any]) -> str:
    return await dispatch(await source.tools(), name, arguments)


async def event_types(session: Session, after: int = 0) -> list[str]:
    return [e.type for e in await session.read_events(after)]


async def last_seq(session: Session) -> int:
    events = await session.read_events()
    return events[-1].seq if events else 0


def block_of(block: ContextBlock | None) -> ContextBlock:
    assert block is not None
    return block


# ================================================================================================
# session.test.ts — ContextBlocks: frozen system prompt
# ================================================================================================


def soul_and_memory(memory: Any) -> ContextBlocks:
    return ContextBlocks(
        [
            ContextConfig("soul", provider=ReadonlyText("You are helpful.")),
            ContextConfig("memory", description="Learned facts", provider=memory),
        ]
    )


async def test_to_system_prompt_returns_same_value() -> None:
    blocks = soul_and_memory(Mem("User likes coffee."))
    await blocks.load()
    first = blocks.to_system_prompt()
    assert blocks.to_system_prompt() == first
    assert "SOUL" in first and "You are helpful." in first
    assert "MEMORY" in first and "User likes coffee." in first
    assert first == (
        section("SOUL [readonly]", "You are helpful.")
        + "\n\n"
        + section("MEMORY (Learned facts) [writable]", "User likes coffee.")
    )


async def test_to_system_prompt_before_load_raises() -> None:
    blocks = soul_and_memory(Mem())
    with pytest.raises(ContextError, match=r"^Context blocks not loaded\. Call load\(\) first\.$"):
        blocks.to_system_prompt()


async def test_set_block_does_not_change_frozen_prompt() -> None:
    memory = Mem("old fact")
    blocks = soul_and_memory(memory)
    await blocks.load()
    before = blocks.to_system_prompt()
    block = await blocks.set_block("memory", "new fact")
    assert memory.value == "new fact" and block.content == "new fact"
    assert block_of(blocks.get_block("memory")).content == "new fact"
    assert blocks.to_system_prompt() == before
    assert await blocks.freeze_system_prompt() == before
    assert "old fact" in before and "new fact" not in before


async def test_refresh_picks_up_changes() -> None:
    memory = Mem("old fact")
    blocks = soul_and_memory(memory)
    await blocks.load()
    blocks.to_system_prompt()
    await blocks.set_block("memory", "new fact")
    refreshed = await blocks.refresh_system_prompt()
    assert "new fact" in refreshed and "old fact" not in refreshed
    assert blocks.to_system_prompt() == refreshed
    assert await blocks.freeze_system_prompt() == refreshed
    # A change made behind the blocks' back also shows after a refresh (providers are re-read).
    memory.value = "edited elsewhere"
    assert "edited elsewhere" in await blocks.refresh_system_prompt()


async def test_readonly_blocks_reject_writes() -> None:
    blocks = soul_and_memory(Mem())
    with pytest.raises(ContextError, match=r'^Block "soul" is readonly$'):
        await blocks.set_block("soul", "new soul")
    with pytest.raises(ContextError, match=r'^Block "nope" not found$'):
        await blocks.set_block("nope", "x")
    with pytest.raises(ContextError, match=r'^Block "soul" is readonly$'):
        await blocks.append_to_block("soul", "x")
    with pytest.raises(ContextError, match=r'^Block "missing" not found$'):
        await blocks.append_to_block("missing", "x")
    assert block_of(blocks.get_block("soul")).content == "You are helpful."


async def test_max_tokens_on_every_write_path() -> None:
    memory = Mem("a b c")
    blocks = ContextBlocks([ContextConfig("memory", max_tokens=10, provider=memory)])
    with pytest.raises(ContextError, match=r'^Block "memory" exceeds maxTokens: 65 > 10$'):
        await blocks.set_block("memory", "word " * 50)
    # append: the limit applies to the total ("a b c\nd e f g h": 8 words → 11 tokens).
    with pytest.raises(ContextError, match=r'^Block "memory" exceeds maxTokens: 11 > 10$'):
        await blocks.append_to_block("memory", "d e f g h")
    assert await run_tool(blocks, "set_context", {"label": "memory", "content": "word " * 50}) == (
        'Error: Block "memory" exceeds maxTokens: 65 > 10'
    )
    assert await run_tool(
        blocks, "set_context", {"label": "memory", "content": "d e f g h", "action": "append"}
    ) == ('Error: Block "memory" exceeds maxTokens: 11 > 10')
    assert memory.value == "a b c" and memory.sets == []
    assert block_of(blocks.get_block("memory")).content == "a b c"
    # Exactly at the limit is fine.
    at_limit = "a b c d e f g"  # 7 words → 9.1 → 10 tokens
    assert estimate_string_tokens(at_limit) == 10
    assert (await blocks.set_block("memory", at_limit)).tokens == 10


async def test_plain_text_format_not_xml() -> None:
    blocks = soul_and_memory(Mem("fact"))
    await blocks.load()
    prompt = blocks.to_system_prompt()
    assert "═" in prompt and "SOUL" in prompt and "MEMORY" in prompt
    assert "<context_block" not in prompt and "<" not in prompt


async def test_empty_skill_blocks_render() -> None:
    blocks = ContextBlocks([ContextConfig("skills", provider=Skills())])
    await blocks.load()
    assert blocks.to_system_prompt() == section("SKILLS [loadable]", "")


async def test_spec_example_prompt_exactly() -> None:
    blocks = ContextBlocks(
        [
            ContextConfig(
                "soul", description="Identity", provider=ReadonlyText("You are a helpful assistant.")
            ),
            ContextConfig(
                "memory",
                description="Learned facts",
                max_tokens=1100,
                provider=Mem("User likes coffee.\nUser prefers dark roast."),
            ),
            ContextConfig("skills", provider=Skills({"code-review": ("...", "Code review")})),
            ContextConfig("knowledge", provider=ReadonlySearch({"a": "x", "b": "y"})),
            ContextConfig("empty", provider=ReadonlyText(None)),
        ]
    )
    await blocks.load()
    assert blocks.to_system_prompt() == (
        "══════════════════════════════════════════════\n"
        "SOUL (Identity) [readonly]\n"
        "══════════════════════════════════════════════\n"
        "You are a helpful assistant.\n"
        "\n"
        "══════════════════════════════════════════════\n"
        "MEMORY (Learned facts) [1% — 11/1100 tokens] [writable]\n"
        "══════════════════════════════════════════════\n"
        "User likes coffee.\n"
        "User prefers dark roast.\n"
        "\n"
        "══════════════════════════════════════════════\n"
        "SKILLS [loadable]\n"
        "══════════════════════════════════════════════\n"
        "- code-review: Code review\n"
        "\n"
        "══════════════════════════════════════════════\n"
        "KNOWLEDGE [searchable]\n"
        "══════════════════════════════════════════════\n"
        "2 entries indexed."
    )


async def test_header_usage_rounds_half_up_and_zero_max_is_absent() -> None:
    blocks = ContextBlocks(
        [
            ContextConfig("a", max_tokens=16, provider=Mem("a")),  # 2/16 = 12.5% → 13
            ContextConfig("b", max_tokens=0, provider=Mem("b")),
            ContextConfig("c", description="", provider=Mem("")),
        ]
    )
    await blocks.load()
    assert blocks.to_system_prompt() == (
        section("A [13% — 2/16 tokens] [writable]", "a")
        + "\n\n"
        + section("B [writable]", "b")
        + "\n\n"
        + section("C [writable]", "")
    )


async def test_no_blocks_render_empty_string() -> None:
    blocks = ContextBlocks([])
    await blocks.load()
    assert blocks.to_system_prompt() == ""
    assert await blocks.freeze_system_prompt() == ""


async def test_concurrent_freezes_are_identical() -> None:
    store = Mem()
    blocks = ContextBlocks(
        [ContextConfig("soul", provider=ReadonlyText("You are helpful."))], prompt_store=store
    )
    prompts = await asyncio.gather(*(blocks.freeze_system_prompt() for _ in range(8)))
    assert len(set(prompts)) == 1
    assert store.value == prompts[0] and store.sets == [prompts[0]]


async def test_keyed_blocks_refuse_set_block() -> None:
    blocks = ContextBlocks(
        [ContextConfig("skills", provider=Skills()), ContextConfig("knowledge", provider=Search())]
    )
    for label in ("skills", "knowledge"):
        with pytest.raises(
            ContextError,
            match=rf'^Block "{label}" is a keyed provider\. '
            r"Use setSkill\(\) or setSearchEntry\(\) instead\.$",
        ):
            await blocks.set_block(label, "x")


async def test_session_keyed_blocks_refuse_replace(store: SqliteStore) -> None:
    session = (
        Session(store)
        .for_session("keyed")
        .with_context("skills", provider=Skills())
        .with_context("knowledge", provider=StoreSearchProvider(store))
    )
    for label in ("skills", "knowledge"):
        with pytest.raises(ContextError) as caught:
            await session.replace_context_block(label, "x")
        assert str(caught.value) == (
            f'Block "{label}" is a keyed provider. Use setSkill() or setSearchEntry() instead.'
        )
        with pytest.raises(ContextError) as caught:
            await session.append_context_block(label, "x")
        assert str(caught.value).startswith(f'Block "{label}" is a keyed provider.')
    assert await session.read_events() == []


async def test_append_separator_rules() -> None:
    notes = Mem("first")
    empty = Mem()
    blocks = ContextBlocks([ContextConfig("notes", provider=notes), ContextConfig("m", provider=empty)])
    await blocks.append_to_block("notes", "\nsecond")
    assert notes.value == "first\nsecond"
    await blocks.append_to_block("notes", "third")
    assert notes.value == "first\nsecond\nthird"
    await blocks.append_to_block("m", "only")
    assert empty.value == "only"


async def test_blocks_with_async_providers() -> None:
    memory = AsyncMem("async fact")
    blocks = ContextBlocks([ContextConfig("memory", provider=memory)], prompt_store=AsyncMem())
    prompt = await blocks.freeze_system_prompt()
    assert prompt == section("MEMORY [writable]", "async fact")
    await blocks.append_to_block("memory", "more")
    assert memory.value == "async fact\nmore"
    assert await blocks.freeze_system_prompt() == prompt


# ================================================================================================
# session.test.ts — Session: tools() without load
# ================================================================================================


async def test_tools_lists_writable_labels_only(store: SqliteStore) -> None:
    session = (
        Session(store)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", description="Learned facts", provider=Mem())
    )
    tools = await tool_map(session)
    assert list(tools) == ["set_context"]
    set_context = tools["set_context"]
    assert set_context.description == (
        'Write to a context block. Available blocks:\n- "memory" (writable): Learned facts\n\n'
        "Writes are durable and persist across sessions."
    )
    assert '"soul"' not in set_context.description
    assert set_context.input_schema["properties"]["label"] == {
        "type": "string",
        "const": "memory",
        "description": "Block label to write to",
    }
    assert set_context.input_schema["required"] == ["label", "content"]
    assert "metadata" not in set_context.input_schema["properties"]


async def test_tools_label_keyed_writable_blocks(store: SqliteStore) -> None:
    session = (
        Session(store)
        .with_context("memory", description="Learned facts", provider=Mem())
        .with_context("skills", description="Loadable docs", provider=Skills())
        .with_context("knowledge", description="Searchable docs", provider=Search())
        .with_context("scratch", provider=Mem())
    )
    tools = await tool_map(session)
    assert list(tools) == ["set_context", "load_context", "unload_context", "search_context"]
    description = tools["set_context"].description
    assert '- "memory" (writable): Learned facts' in description
    assert '- "skills" (skill collection, keyed entries): Loadable docs' in description
    assert '- "knowledge" (searchable, keyed entries): Searchable docs' in description
    assert "metadata: { title, description }" in description
    assert description == (
        "Write to a context block. Available blocks:\n"
        '- "memory" (writable): Learned facts\n'
        '- "skills" (skill collection, keyed entries): Loadable docs\n'
        '- "knowledge" (searchable, keyed entries): Searchable docs\n'
        '- "scratch" (writable): no description\n\n'
        "Writes are durable and persist across sessions." + SET_CONTEXT_HINT
    )
    metadata = tools["set_context"].input_schema["properties"]["metadata"]
    assert metadata["type"] == "object"
    assert metadata["description"].startswith(
        'Optional metadata for keyed entries (skill collections, searchable blocks: "skills", "knowledge"). '
    )
    assert tools["set_context"].input_schema["properties"]["label"]["enum"] == [
        "memory",
        "skills",
        "knowledge",
        "scratch",
    ]


async def test_tools_execute_lazily_loads_and_writes(store: SqliteStore) -> None:
    memory = Mem()
    session = Session(store).with_context("memory", provider=memory)
    result = await run_tool(session, "set_context", {"label": "memory", "content": "User likes tea."})
    assert "Written to memory" in result and "tokens" in result
    assert result == "Written to memory. Usage: 4 tokens"
    assert memory.value == "User likes tea."


async def test_tools_execute_append(store: SqliteStore) -> None:
    memory = Mem("fact1")
    session = Session(store).with_context("memory", provider=memory)
    assert await run_tool(
        session, "set_context", {"label": "memory", "content": "fact2", "action": "append"}
    ) == ("Written to memory. Usage: 3 tokens")
    assert memory.value == "fact1\nfact2"
    # Any other action replaces.
    await run_tool(session, "set_context", {"label": "memory", "content": "only", "action": "upsert"})
    assert memory.value == "only"


async def test_tools_execute_rejects_readonly_gracefully(store: SqliteStore) -> None:
    session = (
        Session(store)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", provider=Mem())
    )
    result = await run_tool(session, "set_context", {"label": "soul", "content": "x"})
    assert "Error" in result and "readonly" in result
    assert result == 'Error: Block "soul" is readonly'
    assert await run_tool(session, "set_context", {"label": "nope", "content": "x"}) == (
        'Error: block "nope" not found'
    )


async def test_tools_empty_without_writable_blocks(store: SqliteStore) -> None:
    session = Session(store).with_context("soul", provider=ReadonlyText("You are helpful."))
    assert await session.tools() == []
    assert await Session(store).tools() == []


async def test_tool_usage_string_with_max_tokens(store: SqliteStore) -> None:
    session = Session(store).with_context("memory", description="Learned facts", max_tokens=20)
    assert await run_tool(session, "set_context", {"label": "memory", "content": "User is Ada."}) == (
        "Written to memory. Usage: 20% (4/20 tokens)"
    )
    assert await run_tool(
        session, "set_context", {"label": "memory", "content": "Likes tea.", "action": "append"}
    ) == ("Written to memory. Usage: 35% (7/20 tokens)")
    assert await store.get_context_value("memory") == "User is Ada.\nLikes tea."


# ================================================================================================
# session.test.ts — Session.create() builder (real store rows instead of the SQL stub)
# ================================================================================================


async def test_create_returns_a_session(store: SqliteStore) -> None:
    session = Session.create(store)
    assert isinstance(session, Session)
    assert session.with_context("memory") is session
    assert session.with_cached_prompt() is session
    assert session.for_session("b") is session
    # Building touches nothing.
    assert await store.get_context_value("memory_b") is None
    assert await store.get_context_value("_system_prompt_b") is None
    assert await session.read_events() == []


async def test_minimal_create_works(store: SqliteStore) -> None:
    assert await Session.create(store).get_history() == []


async def test_with_context_auto_provider_writes_row(store: SqliteStore) -> None:
    session = Session.create(store).with_context("memory", description="Learned facts")
    assert list(await tool_map(session)) == ["set_context"]
    await run_tool(session, "set_context", {"label": "memory", "content": "User likes tea."})
    assert await store.get_context_value("memory") == "User likes tea."


async def test_readonly_provider_gets_no_tools(store: SqliteStore) -> None:
    session = Session.create(store).with_context("soul", provider=ReadonlyText("You are helpful."))
    assert await session.tools() == []
    prompt = await session.freeze_system_prompt()
    assert "SOUL" in prompt and "You are helpful." in prompt


async def test_with_cached_prompt_auto_creates_prompt_row(store: SqliteStore) -> None:
    session = (
        Session.create(store)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory")
        .with_cached_prompt()
    )
    prompt = await session.freeze_system_prompt()
    assert await store.get_context_value("_system_prompt") == prompt
    assert await session.freeze_system_prompt() == prompt
    assert prompt == section("SOUL [readonly]", "You are helpful.") + "\n\n" + section(
        "MEMORY [writable]", ""
    )


async def test_for_session_namespaces_rows(store: SqliteStore) -> None:
    session = Session.create(store).for_session("chat-123").with_context("memory").with_cached_prompt()
    await session.replace_context_block("memory", "fact")
    prompt = await session.freeze_system_prompt()
    assert await store.get_context_value("memory_chat-123") == "fact"
    assert await store.get_context_value("_system_prompt_chat-123") == prompt
    assert await store.get_context_value("memory") is None
    assert await store.get_context_value("_system_prompt") is None


async def test_with_context_accepts_explicit_provider(store: SqliteStore) -> None:
    session = Session.create(store).with_context("notes", provider=Mem("Provider content here."))
    assert "Provider content here." in await session.freeze_system_prompt()
    assert await store.get_context_value("notes") is None


async def test_auto_wired_block_starts_empty_and_can_be_written(store: SqliteStore) -> None:
    session = Session.create(store).with_context("notes")
    block = block_of(await session.get_context_block("notes"))
    assert (block.content, block.tokens, block.writable) == ("", 0, True)
    await run_tool(session, "set_context", {"label": "notes", "content": "remember this"})
    assert await store.get_context_value("notes") == "remember this"


async def test_provider_returning_none_gives_empty_block(store: SqliteStore) -> None:
    session = Session.create(store).with_context("memory", provider=Mem(None))
    prompt = await session.freeze_system_prompt()
    assert "MEMORY" in prompt and "[writable]" in prompt
    assert prompt == section("MEMORY [writable]", "")


async def test_for_session_before_with_context(store: SqliteStore) -> None:
    session = Session.create(store).for_session("abc").with_context("memory")
    await session.replace_context_block("memory", "x")
    assert await store.get_context_value("memory_abc") == "x"
    assert await store.get_context_value("memory") is None


async def test_with_context_before_for_session(store: SqliteStore) -> None:
    session = Session.create(store).with_context("memory").with_cached_prompt().for_session("xyz")
    await session.replace_context_block("memory", "x")
    await session.freeze_system_prompt()
    assert await store.get_context_value("memory_xyz") == "x"
    assert await store.get_context_value("_system_prompt_xyz") is not None
    assert await store.get_context_value("memory") is None
    assert await store.get_context_value("_system_prompt") is None


async def test_with_cached_prompt_uses_a_given_provider(store: SqliteStore) -> None:
    prompt_store = Mem()
    session = (
        Session.create(store)
        .for_session("p")
        .with_context("soul", provider=ReadonlyText("S"))
        .with_cached_prompt(prompt_store)
    )
    prompt = await session.freeze_system_prompt()
    assert prompt_store.value == prompt
    assert await store.get_context_value("_system_prompt_p") is None


# ================================================================================================
# session.test.ts — ContextBlocks: edge cases
# ================================================================================================


async def test_freeze_persists_empty_prompt() -> None:
    prompt_store = Mem()
    blocks = ContextBlocks(
        [ContextConfig("a", provider=ReadonlyText(None)), ContextConfig("b", provider=ReadonlyText(""))],
        prompt_store=prompt_store,
    )
    assert await blocks.freeze_system_prompt() == ""
    assert prompt_store.value == "" and prompt_store.sets == [""]
    assert await blocks.freeze_system_prompt() == ""
    assert prompt_store.sets == [""]


async def test_freeze_returns_stored_empty_string_as_is() -> None:
    prompt_store = Mem("")
    soul = Readonly("You are helpful.")
    blocks = ContextBlocks([ContextConfig("soul", provider=soul)], prompt_store=prompt_store)
    assert await blocks.freeze_system_prompt() == ""
    assert prompt_store.sets == []
    assert soul.gets == 0  # the stored prompt wins before any block is read


async def test_session_empty_prompt_persisted_and_returned(store: SqliteStore) -> None:
    session = (
        Session(store).for_session("e1").with_context("soul", provider=ReadonlyText("")).with_cached_prompt()
    )
    assert await session.freeze_system_prompt() == ""
    assert await store.get_context_value("_system_prompt_e1") == ""
    again = (
        Session(store)
        .for_session("e1")
        .with_context("soul", provider=ReadonlyText("now"))
        .with_cached_prompt()
    )
    assert await again.freeze_system_prompt() == ""


async def test_session_stored_empty_string_wins(store: SqliteStore) -> None:
    await store.set_context_value("_system_prompt_e2", "")
    session = (
        Session(store)
        .for_session("e2")
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_cached_prompt()
    )
    assert await session.freeze_system_prompt() == ""


# ================================================================================================
# session.test.ts — DO-backed context cases, on a real store
# ================================================================================================


def chat(store: SqliteStore, session_id: str = "chat-1") -> Session:
    return (
        Session(store)
        .for_session(session_id)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", description="Learned facts", max_tokens=1100)
        .with_cached_prompt()
    )


async def test_prompt_persisted_and_frozen_across_session_objects(store: SqliteStore) -> None:
    first = chat(store)
    prompt = await first.freeze_system_prompt()
    assert await first.freeze_system_prompt() == prompt
    await first.replace_context_block("memory", "User likes tea.")
    second = chat(store)
    assert await second.freeze_system_prompt() == prompt
    assert "User likes tea." not in prompt
    # The new object reads the block itself, though.
    assert block_of(await second.get_context_block("memory")).content == "User likes tea."


async def test_refresh_updates_stored_prompt(store: SqliteStore) -> None:
    session = chat(store)
    original = await session.freeze_system_prompt()
    await session.replace_context_block("memory", "User likes tea.")
    assert await session.freeze_system_prompt() == original
    refreshed = await session.refresh_system_prompt()
    assert "User likes tea." in refreshed and refreshed != original
    assert "[0% — 4/1100 tokens]" in refreshed
    assert await store.get_context_value("_system_prompt_chat-1") == refreshed
    assert await session.freeze_system_prompt() == refreshed
    assert await chat(store).freeze_system_prompt() == refreshed


async def test_replace_append_get_context_block(store: SqliteStore) -> None:
    session = chat(store)
    replaced = await session.replace_context_block("memory", "fact A")
    assert replaced.content == "fact A" and replaced.tokens == estimate_string_tokens("fact A")
    appended = await session.append_context_block("memory", "fact B")
    assert appended.content == "fact A\nfact B"
    assert block_of(await session.get_context_block("memory")).content == "fact A\nfact B"
    blocks = await session.get_context_blocks()
    assert [b.label for b in blocks] == ["soul", "memory"]
    assert await session.get_context_block("nope") is None
    memory = blocks[1]
    assert (
        memory.description,
        memory.max_tokens,
        memory.writable,
        memory.is_skill,
        memory.is_searchable,
    ) == (
        "Learned facts",
        1100,
        True,
        False,
        False,
    )
    with pytest.raises(ContextError, match=r'^Block "soul" is readonly$'):
        await session.replace_context_block("soul", "x")
    with pytest.raises(ContextError, match=r'^Block "missing" not found$'):
        await session.append_context_block("missing", "x")
    # An unknown label is "not found" for replace as for append (the original said
    # "readonly", a permission problem that is not there).
    with pytest.raises(ContextError, match=r'^Block "nosuch" not found$'):
        await session.replace_context_block("nosuch", "x")


async def test_store_backed_blocks_persist_and_overwrite(store: SqliteStore) -> None:
    assert block_of(await chat(store).get_context_block("memory")).content == ""
    await chat(store).replace_context_block("memory", "one")
    assert block_of(await chat(store).get_context_block("memory")).content == "one"
    await chat(store).replace_context_block("memory", "two")
    assert block_of(await chat(store).get_context_block("memory")).content == "two"
    assert await store.get_context_value("memory_chat-1") == "two"


async def test_sessions_have_separate_store_backed_blocks(store: SqliteStore) -> None:
    a, b = chat(store, "a"), chat(store, "b")
    await a.replace_context_block("memory", "A")
    assert block_of(await b.get_context_block("memory")).content == ""
    await b.replace_context_block("memory", "B")
    assert (await store.get_context_value("memory_a"), await store.get_context_value("memory_b")) == (
        "A",
        "B",
    )


async def test_max_tokens_on_session_write_paths(store: SqliteStore) -> None:
    session = Session(store).for_session("mt").with_context("memory", max_tokens=10)
    await session.replace_context_block("memory", "a b c")
    seq = await last_seq(session)
    with pytest.raises(ContextError, match=r'^Block "memory" exceeds maxTokens: 65 > 10$'):
        await session.replace_context_block("memory", "word " * 50)
    with pytest.raises(ContextError, match=r'^Block "memory" exceeds maxTokens: 11 > 10$'):
        await session.append_context_block("memory", "d e f g h")
    assert await run_tool(session, "set_context", {"label": "memory", "content": "word " * 50}) == (
        'Error: Block "memory" exceeds maxTokens: 65 > 10'
    )
    assert await store.get_context_value("memory_mt") == "a b c"
    assert await last_seq(session) == seq  # a refused write logs nothing


# ================================================================================================
# search.test.ts — ContextBlocks with in-memory search providers
# ================================================================================================

SEARCH_KINDS = [pytest.param(Search, id="sync"), pytest.param(AsyncSearch, id="async")]


@pytest.mark.parametrize("kind", SEARCH_KINDS)
async def test_search_provider_gets_search_and_set_tools(kind: type[Search | AsyncSearch]) -> None:
    blocks = ContextBlocks([ContextConfig("knowledge", provider=kind())])
    assert list(await tool_map(blocks)) == ["set_context", "search_context"]


async def test_no_search_provider_no_search_tool() -> None:
    blocks = ContextBlocks([ContextConfig("memory", provider=Mem())])
    assert "search_context" not in await tool_map(blocks)


async def test_readonly_search_provider_has_no_set_context() -> None:
    blocks = ContextBlocks([ContextConfig("knowledge", provider=ReadonlySearch({"k": "v"}))])
    assert list(await tool_map(blocks)) == ["search_context"]
    with pytest.raises(ContextError, match=r'^Block "knowledge" does not support writes$'):
        await blocks.set_search_entry("knowledge", "k", "x")


@pytest.mark.parametrize("kind", SEARCH_KINDS)
async def test_searchable_header_and_empty_block(kind: type[Search | AsyncSearch]) -> None:
    blocks = ContextBlocks([ContextConfig("knowledge", description="Team wiki", provider=kind())])
    await blocks.load()
    assert blocks.to_system_prompt() == section("KNOWLEDGE (Team wiki) [searchable]", "")


@pytest.mark.parametrize("kind", SEARCH_KINDS)
async def test_search_context_results_and_no_results(kind: type[Search | AsyncSearch]) -> None:
    provider = kind()
    provider.entries["deploy"] = "Deploy with wrangler."
    blocks = ContextBlocks([ContextConfig("knowledge", provider=provider)])
    tools = await tool_map(blocks)
    assert tools["search_context"].description == (
        "Search for information in a searchable context block. "
        'ONLY these blocks are searchable: "knowledge". Other blocks cannot be searched.'
    )
    result = await tools["search_context"].execute({"label": "knowledge", "query": "wrangler"})
    assert "deploy" in result and "Deploy with wrangler." in result
    assert await tools["search_context"].execute({"label": "knowledge", "query": "kubernetes"}) == (
        "No results found."
    )
    assert await tools["search_context"].execute({"label": "memory", "query": "x"}) == (
        'Error: "memory" is not searchable. Searchable blocks: knowledge'
    )


@pytest.mark.parametrize("kind", SEARCH_KINDS)
async def test_set_context_indexes_and_updates_summary(kind: type[Search | AsyncSearch]) -> None:
    blocks = ContextBlocks([ContextConfig("knowledge", provider=kind())])
    result = await run_tool(
        blocks,
        "set_context",
        {
            "label": "knowledge",
            "content": "Rollbacks take 2 minutes.",
            "metadata": {"title": "Rollback policy"},
        },
    )
    assert result == 'Indexed "rollback-policy" in knowledge.'
    assert "Rollbacks take 2 minutes." in await run_tool(
        blocks, "search_context", {"label": "knowledge", "query": "rollbacks"}
    )
    knowledge = block_of(blocks.get_block("knowledge"))
    assert "1 entries" in knowledge.content
    assert knowledge.tokens == estimate_string_tokens("1 entries indexed.")


@pytest.mark.parametrize("kind", SEARCH_KINDS)
async def test_set_context_auto_generates_key(kind: type[Search | AsyncSearch]) -> None:
    provider = kind()
    blocks = ContextBlocks([ContextConfig("knowledge", provider=provider)])
    content = "Deployments happen on Tuesdays and Thursdays."
    result = await run_tool(
        blocks, "set_context", {"label": "knowledge", "content": content, "action": "append"}
    )
    assert result == 'Indexed "deployments-happen-on-tuesdays-and-thursdays-1bnq2le" in knowledge.'
    assert provider.entries == {context_entry_key(None, content): content}


async def test_search_errors_on_wrong_blocks() -> None:
    blocks = ContextBlocks(
        [ContextConfig("memory", provider=Mem()), ContextConfig("knowledge", provider=Search())]
    )
    with pytest.raises(ContextError, match=r'^Block "memory" is not a search provider$'):
        await blocks.search_context("memory", "x")
    with pytest.raises(ContextError, match=r'^Block "memory" is not a search provider$'):
        await blocks.set_search_entry("memory", "k", "x")
    with pytest.raises(ContextError, match=r'^Block "nope" is not a search provider$'):
        await blocks.search_context("nope", "x")


# AgentSearchProvider FTS5 (TestSearchAgent), with the store-backed provider.


def search_session(store: SqliteStore) -> Session:
    return (
        Session(store)
        .for_session("search")
        .with_context("knowledge", description="Team wiki", provider=StoreSearchProvider(store))
    )


async def test_store_search_block_gets_its_label_from_init(store: SqliteStore) -> None:
    session = search_session(store)
    prompt = await session.freeze_system_prompt()
    assert "KNOWLEDGE" in prompt and "[searchable]" in prompt
    await run_tool(
        session, "set_context", {"label": "knowledge", "content": "hello", "metadata": {"title": "k"}}
    )
    assert await store.count_search_entries("knowledge") == 1


async def test_store_search_indexes_and_searches(store: SqliteStore) -> None:
    session = search_session(store)
    assert await run_tool(
        session,
        "set_context",
        {
            "label": "knowledge",
            "content": "The API uses bearer tokens for auth.",
            "metadata": {"title": "auth"},
        },
    ) == ('Indexed "auth" in knowledge.')
    await run_tool(
        session,
        "set_context",
        {"label": "knowledge", "content": "Deploys go out on Tuesdays.", "metadata": {"title": "deploys"}},
    )

    async def search(query: str) -> str:
        return await run_tool(session, "search_context", {"label": "knowledge", "query": query})

    assert await search("bearer") == "[auth]\nThe API uses bearer tokens for auth."
    assert await search("API auth") == "[auth]\nThe API uses bearer tokens for auth."  # not adjacent
    assert await search("kubernetes") == "No results found."
    assert await search("Tuesdays") == "[deploys]\nDeploys go out on Tuesdays."
    assert block_of(await session.get_context_block("knowledge")).content == "2 entries indexed."


async def test_store_search_update_replaces_entry(store: SqliteStore) -> None:
    session = search_session(store)
    args = {"label": "knowledge", "metadata": {"title": "Rollback policy"}}
    await run_tool(session, "set_context", {**args, "content": "Rollbacks take 2 minutes."})
    await run_tool(session, "set_context", {**args, "content": "Rollbacks need approval now."})

    async def search(query: str) -> str:
        return await run_tool(session, "search_context", {"label": "knowledge", "query": query})

    assert await search("approval") == "[rollback-policy]\nRollbacks need approval now."
    assert await search("minutes") == "No results found."
    assert await store.count_search_entries("knowledge") == 1


# ================================================================================================
# skills.test.ts
# ================================================================================================


def pirate_skills() -> Skills:
    return Skills(
        {
            "pirate": ("Talk like a pirate. Arr!", "Talk like a pirate"),
            "formal": ("Be formal.", None),
        }
    )


@pytest.mark.parametrize(
    ("provider", "names", "tag"),
    [
        (ReadonlyText("x"), [], "[readonly]"),
        (Mem("x"), ["set_context"], "[writable]"),
        (Skills({"k": ("c", None)}), ["set_context", "load_context", "unload_context"], "[loadable]"),
        (ReadonlySkills({"k": ("c", None)}), ["load_context", "unload_context"], "[loadable]"),
        (Search(), ["set_context", "search_context"], "[searchable]"),
    ],
    ids=["readonly", "writable", "skill", "readonly-skill", "search"],
)
async def test_provider_type_detection(provider: Any, names: list[str], tag: str) -> None:
    blocks = ContextBlocks([ContextConfig("block", provider=provider)])
    assert list(await tool_map(blocks)) == names
    await blocks.load()
    prompt = blocks.to_system_prompt()
    assert f"BLOCK {tag}\n" in prompt
    if tag != "[readonly]":
        assert "[readonly]" not in prompt


async def test_skill_and_search_provider_is_both() -> None:
    class Both(Skills):
        def search(self, query: str) -> str | None:
            return None

    blocks = ContextBlocks([ContextConfig("docs", provider=Both({"k": ("c", "d")}))])
    assert list(await tool_map(blocks)) == ["set_context", "load_context", "unload_context", "search_context"]
    await blocks.load()
    assert blocks.to_system_prompt() == section("DOCS [searchable]", "- k: d")
    block = block_of(blocks.get_block("docs"))
    assert block.is_skill and block.is_searchable and block.writable


async def test_skill_blocks_render_metadata() -> None:
    blocks = ContextBlocks([ContextConfig("skills", description="Playbooks", provider=pirate_skills())])
    await blocks.load()
    assert blocks.to_system_prompt() == section(
        "SKILLS (Playbooks) [loadable]", "- pirate: Talk like a pirate\n- formal"
    )


@pytest.mark.parametrize("kind", [Skills, AsyncSkills], ids=["sync", "async"])
async def test_load_context(kind: type[Skills | AsyncSkills]) -> None:
    blocks = ContextBlocks(
        [
            ContextConfig("memory", provider=Mem()),
            ContextConfig("skills", provider=kind(pirate_skills().docs)),
        ]
    )
    tools = await tool_map(blocks)
    assert tools["load_context"].description == (
        'Load a document from a skill block by key. Available skill blocks: "skills". '
        "Check the system prompt for available keys."
    )
    assert tools["load_context"].input_schema["properties"]["key"] == {
        "type": "string",
        "description": "Skill key to load",
    }
    load = tools["load_context"]
    assert await load.execute({"label": "skills", "key": "pirate"}) == "Talk like a pirate. Arr!"
    assert await load.execute({"label": "skills", "key": "nope"}) == "Not found: nope"
    assert await load.execute({"label": "memory", "key": "pirate"}) == (
        'Error: "memory" is not a skill block. Skill blocks: skills'
    )
    assert blocks.get_loaded_skill_keys() == {"skills:pirate"}


async def test_load_context_absent_without_skill_providers() -> None:
    blocks = ContextBlocks([ContextConfig("memory", provider=Mem()), ContextConfig("k", provider=Search())])
    names = await tool_map(blocks)
    assert "load_context" not in names and "unload_context" not in names


async def test_skill_method_errors() -> None:
    blocks = ContextBlocks(
        [
            ContextConfig("memory", provider=Mem()),
            ContextConfig("ro", provider=ReadonlySkills({"k": ("c", None)})),
        ]
    )
    with pytest.raises(ContextError, match=r'^Block "memory" is not a skill provider$'):
        await blocks.load_skill("memory", "k")
    with pytest.raises(ContextError, match=r'^Block "memory" is not a skill provider$'):
        await blocks.set_skill("memory", "k", "c")
    with pytest.raises(ContextError, match=r'^Block "ro" does not support writes$'):
        await blocks.set_skill("ro", "k", "c")


async def test_set_context_writes_regular_block_beside_skills() -> None:
    memory = Mem()
    blocks = ContextBlocks(
        [ContextConfig("memory", provider=memory), ContextConfig("skills", provider=Skills())]
    )
    assert await run_tool(blocks, "set_context", {"label": "memory", "content": "fact"}) == (
        "Written to memory. Usage: 2 tokens"
    )
    assert memory.value == "fact"


async def test_set_context_skill_with_title() -> None:
    skills = Skills()
    blocks = ContextBlocks([ContextConfig("skills", provider=skills)])
    result = await run_tool(
        blocks,
        "set_context",
        {
            "label": "skills",
            "content": "Speak like a pirate.",
            "metadata": {"title": "Pirate style", "description": "Pirate voice"},
        },
    )
    assert result == 'Indexed "pirate-style" in skills.'
    assert skills.calls == [("pirate-style", "Speak like a pirate.", "Pirate voice")]
    # Title without description: the title is the description.
    await run_tool(
        blocks, "set_context", {"label": "skills", "content": "x", "metadata": {"title": "Formal"}}
    )
    assert skills.calls[-1] == ("formal", "x", "Formal")
    assert await blocks.load_skill("skills", "pirate-style") == "Speak like a pirate."


async def test_set_context_skill_auto_key() -> None:
    skills = Skills()
    blocks = ContextBlocks([ContextConfig("skills", provider=skills)])
    result = await run_tool(blocks, "set_context", {"label": "skills", "content": "no key"})
    assert re.fullmatch(r'Indexed "no-key-[a-z0-9]+" in skills\.', result)
    assert result == 'Indexed "no-key-1nprufp" in skills.'
    assert skills.calls == [("no-key-1nprufp", "no key", None)]


async def test_set_context_absent_for_readonly_only() -> None:
    blocks = ContextBlocks([ContextConfig("soul", provider=ReadonlyText("x"))])
    assert "set_context" not in await tool_map(blocks)


async def test_title_slug_refreshes_block_metadata() -> None:
    blocks = ContextBlocks([ContextConfig("skills", provider=Skills())])
    await run_tool(
        blocks,
        "set_context",
        {
            "label": "skills",
            "content": "Say hello warmly.",
            "metadata": {"title": "Greeting instructions", "description": "How to greet"},
        },
    )
    block = block_of(blocks.get_block("skills"))
    assert "greeting-instructions" in block.content
    assert block.content == "- greeting-instructions: How to greet"
    assert block.tokens == estimate_string_tokens(block.content)


async def test_no_title_key_from_content() -> None:
    skills = Skills()
    blocks = ContextBlocks([ContextConfig("skills", provider=skills)])
    await run_tool(blocks, "set_context", {"label": "skills", "content": "Just content, no desc"})
    (key,) = skills.docs
    assert re.fullmatch(r"^just-content-no-desc-[a-z0-9]+$", key)
    assert key == "just-content-no-desc-cgko96"


async def test_prefix_and_non_latin_collisions_avoided() -> None:
    skills = Skills()
    blocks = ContextBlocks([ContextConfig("skills", provider=skills)])
    prefix = "x" * 60
    for content in (prefix + " first", prefix + " second", "用户喜欢咖啡", "用户喜欢茶"):
        await run_tool(blocks, "set_context", {"label": "skills", "content": content})
    keys = list(skills.docs)
    assert len(set(keys)) == 4
    assert keys[0].startswith(prefix + "-") and keys[1].startswith(prefix + "-")
    assert all(re.fullmatch(r"^entry-[a-z0-9]+$", k) for k in keys[2:])
    assert keys[2] == "entry-2mzjev"


async def test_multiple_calls_accumulate_skills() -> None:
    skills = Skills()
    blocks = ContextBlocks([ContextConfig("skills", provider=skills)])
    for title in ("One", "Two", "Three"):
        await run_tool(
            blocks, "set_context", {"label": "skills", "content": title, "metadata": {"title": title}}
        )
    assert list(skills.docs) == ["one", "two", "three"]
    assert block_of(blocks.get_block("skills")).content == "- one: One\n- two: Two\n- three: Three"


async def test_unload_context_cycle() -> None:
    unloaded: list[tuple[str, str]] = []

    async def on_unload(label: str, key: str) -> None:
        unloaded.append((label, key))

    blocks = ContextBlocks([ContextConfig("skills", provider=pirate_skills())], on_unload=on_unload)
    tools = await tool_map(blocks)
    assert tools["unload_context"].description == (
        "Unload a previously loaded skill to free context space. The skill remains available for re-loading. "
        "No skills currently loaded."
    )
    assert tools["unload_context"].input_schema["properties"]["key"]["description"] == "Skill key to unload"
    assert await run_tool(blocks, "unload_context", {"label": "skills", "key": "pirate"}) == (
        'Skill "pirate" is not currently loaded in "skills".'
    )
    assert await run_tool(blocks, "unload_context", {"label": "nope", "key": "pirate"}) == (
        'Error: "nope" is not a skill block. Skill blocks: skills'
    )
    await run_tool(blocks, "load_context", {"label": "skills", "key": "pirate"})
    assert blocks.get_loaded_skill_keys() == {"skills:pirate"}
    # The description is computed when tools() is called.
    assert (await tool_map(blocks))["unload_context"].description.endswith(
        " Currently loaded: skills:pirate."
    )
    assert await run_tool(blocks, "unload_context", {"label": "skills", "key": "pirate"}) == (
        'Unloaded "pirate" from skills. Context reclaimed.'
    )
    assert blocks.get_loaded_skill_keys() == set()
    assert unloaded == [("skills", "pirate")]
    # Re-load after unloading.
    assert (
        await run_tool(blocks, "load_context", {"label": "skills", "key": "pirate"})
        == "Talk like a pirate. Arr!"
    )
    assert blocks.get_loaded_skill_keys() == {"skills:pirate"}
    # A missing key is not tracked.
    await run_tool(blocks, "load_context", {"label": "skills", "key": "nope"})
    assert blocks.get_loaded_skill_keys() == {"skills:pirate"}
    blocks.clear_skill_state()
    assert blocks.get_loaded_skill_keys() == set()
    assert not await blocks.unload_skill("skills", "pirate")
    assert unloaded == [("skills", "pirate")]


async def test_unload_context_absent_without_skill_providers() -> None:
    blocks = ContextBlocks([ContextConfig("memory", provider=Mem())])
    assert "unload_context" not in await tool_map(blocks)


async def test_session_unload_and_loaded_keys(store: SqliteStore) -> None:
    session = Session(store).for_session("sk").with_context("skills", provider=pirate_skills())
    await run_tool(session, "load_context", {"label": "skills", "key": "pirate"})
    await run_tool(session, "load_context", {"label": "skills", "key": "formal"})
    assert await session.get_loaded_skill_keys() == {"skills:pirate", "skills:formal"}
    # Listed in load order, as the original's Set iterates.
    assert (await tool_map(session))["unload_context"].description.endswith(
        " Currently loaded: skills:pirate, skills:formal."
    )
    assert await session.unload_skill("skills", "pirate")
    assert not await session.unload_skill("skills", "pirate")
    assert await session.get_loaded_skill_keys() == {"skills:formal"}


async def test_remove_context_drops_loaded_skills_without_rewriting(store: SqliteStore) -> None:
    session = Session(store).for_session("rm").with_context("skills", provider=pirate_skills())
    await run_tool(session, "load_context", {"label": "skills", "key": "pirate"})
    await session.append_message(load_message("a1", "pirate", "Talk like a pirate. Arr!"))
    assert await session.remove_context("skills")
    assert not await session.remove_context("skills")
    assert await session.get_loaded_skill_keys() == set()
    message = await session.get_message("a1")
    assert message is not None and message.parts[0]["output"] == "Talk like a pirate. Arr!"


# ================================================================================================
# init-lifecycle.test.ts
# ================================================================================================


@pytest.mark.parametrize("kind", [Recording, RecordingWritable, RecordingSkills, RecordingSearch])
async def test_init_called_with_label_before_get(kind: type[Recording]) -> None:
    log: list[str] = []
    blocks = ContextBlocks([ContextConfig("test", provider=kind(log))])
    await blocks.tools()
    assert log == ["init:test", "get"]


async def test_each_provider_gets_its_own_label() -> None:
    providers = [Recording(), RecordingWritable(), RecordingSkills(), RecordingSearch()]
    labels = ["soul", "memory", "skills", "knowledge"]
    blocks = ContextBlocks(
        [ContextConfig(label, provider=p) for label, p in zip(labels, providers, strict=True)]
    )
    await blocks.load()
    assert [p.labels for p in providers] == [[label] for label in labels]


async def test_works_without_init(store: SqliteStore) -> None:
    session = (
        Session(store).with_context("soul", provider=ReadonlyText("x")).with_context("memory", provider=Mem())
    )
    assert list(await tool_map(session)) == ["set_context"]
    assert "SOUL" in await session.freeze_system_prompt()


async def test_init_once_across_repeated_tools() -> None:
    provider = RecordingWritable()
    blocks = ContextBlocks([ContextConfig("memory", provider=provider)])
    for _ in range(3):
        await blocks.tools()
    await blocks.set_block("memory", "x")
    await blocks.tools()
    assert provider.labels == ["memory"]
    assert provider.log.count("get") == 1


async def test_refresh_runs_init_and_get_again() -> None:
    """spec §7.2/§7.4: ``load()`` calls ``init`` before ``get`` every time it runs, and
    ``refreshSystemPrompt`` reloads from providers."""
    provider = RecordingWritable()
    blocks = ContextBlocks([ContextConfig("memory", provider=provider)])
    await blocks.freeze_system_prompt()
    await blocks.refresh_system_prompt()
    assert provider.log == ["init:memory", "get", "init:memory", "get"]


async def test_provider_uses_label_in_get() -> None:
    class LabelEcho:
        label = "?"

        def init(self, label: str) -> None:
            self.label = label

        def get(self) -> str:
            return f"I am the {self.label} block."

    blocks = ContextBlocks([ContextConfig("persona", provider=LabelEcho())])
    await blocks.load()
    assert blocks.to_system_prompt() == section("PERSONA [readonly]", "I am the persona block.")


async def test_search_provider_uses_init_label_and_ignores_unknown_key() -> None:
    provider = LabelledSearch()
    blocks = ContextBlocks([ContextConfig("knowledge", provider=provider)])
    content = "The sky is blue today."
    result = await run_tool(
        blocks, "set_context", {"label": "knowledge", "content": content, "key": "ignored-key"}
    )
    key = context_entry_key(None, content)
    assert result == f'Indexed "{key}" in knowledge.'
    assert provider.entries == {"knowledge": {key: content}}
    assert (
        await run_tool(blocks, "search_context", {"label": "knowledge", "query": "sky"})
        == f"[{key}]\n{content}"
    )
    assert block_of(blocks.get_block("knowledge")).content == "knowledge: 1 entries"


# ================================================================================================
# Events: every context write and prompt refresh is in the session's log
# ================================================================================================


async def test_store_backed_writes_log_one_event_each(store: SqliteStore) -> None:
    session = Session(store).for_session("ev").with_context("memory", max_tokens=50)
    await session.replace_context_block("memory", "one")
    await session.append_context_block("memory", "two")
    await run_tool(session, "set_context", {"label": "memory", "content": "three"})
    events = await session.read_events()
    assert [(e.seq, e.type, e.data) for e in events] == [
        (1, "context.updated", {"label": "memory", "content": "one"}),
        (2, "context.updated", {"label": "memory", "content": "one\ntwo"}),
        (3, "context.updated", {"label": "memory", "content": "three"}),
    ]
    assert all(e.session_id == "ev" for e in events)


async def test_store_backed_write_event_survives_reopen(store: SqliteStore, db_path: Path) -> None:
    await Session(store).for_session("ev2").with_context("memory").replace_context_block("memory", "durable")
    reopened = await SqliteStore.open(db_path)
    try:
        events = await Session(reopened).for_session("ev2").read_events()
        assert [(e.type, e.data) for e in events] == [
            ("context.updated", {"label": "memory", "content": "durable"})
        ]
        assert await reopened.get_context_value("memory_ev2") == "durable"
    finally:
        await reopened.close()


async def test_custom_provider_writes_are_logged(store: SqliteStore) -> None:
    memory = AsyncMem()
    session = Session(store).for_session("ev3").with_context("memory", provider=memory)
    await session.replace_context_block("memory", "x")
    assert [(e.type, e.data) for e in await session.read_events()] == [
        ("context.updated", {"label": "memory", "content": "x"})
    ]


async def test_keyed_and_skill_events(store: SqliteStore) -> None:
    session = (
        Session(store)
        .for_session("ev4")
        .with_context("skills", provider=pirate_skills())
        .with_context("knowledge", provider=StoreSearchProvider(store))
    )
    await run_tool(
        session,
        "set_context",
        {
            "label": "skills",
            "content": "Be brief.",
            "metadata": {"title": "Brief", "description": "Short answers"},
        },
    )
    await run_tool(
        session, "set_context", {"label": "knowledge", "content": "hello", "metadata": {"title": "k"}}
    )
    await run_tool(session, "load_context", {"label": "skills", "key": "pirate"})
    await run_tool(session, "load_context", {"label": "skills", "key": "nope"})  # not found: no event
    await run_tool(session, "unload_context", {"label": "skills", "key": "pirate"})
    await run_tool(session, "unload_context", {"label": "skills", "key": "pirate"})  # not loaded: no event
    events = await session.read_events()
    assert [(e.type, e.data) for e in events] == [
        (
            "context.entry_set",
            {"label": "skills", "key": "brief", "content": "Be brief.", "description": "Short answers"},
        ),
        ("context.entry_set", {"label": "knowledge", "key": "k", "content": "hello"}),
        ("context.skill_loaded", {"label": "skills", "key": "pirate"}),
        ("context.skill_unloaded", {"label": "skills", "key": "pirate"}),
    ]


async def test_prompt_events(store: SqliteStore) -> None:
    cached = chat(store, "ev5")
    prompt = await cached.freeze_system_prompt()
    await cached.freeze_system_prompt()  # already stored: nothing new
    await cached.replace_context_block("memory", "fact")
    refreshed = await cached.refresh_system_prompt()
    assert [(e.type, e.data) for e in await cached.read_events()] == [
        ("prompt.updated", {"prompt": prompt}),
        ("context.updated", {"label": "memory", "content": "fact"}),
        ("prompt.updated", {"prompt": refreshed}),
    ]
    uncached = (
        Session(store)
        .for_session("ev6")
        .with_context("soul", provider=ReadonlyText("S"))
        .with_context("memory")
    )
    first = await uncached.freeze_system_prompt()
    again = await uncached.refresh_system_prompt()
    # Without a prompt store, a refresh that renders the same prompt is no change to log.
    assert first == again
    assert await uncached.read_events() == []
    await uncached.replace_context_block("memory", "fact")
    changed = await uncached.refresh_system_prompt()
    assert changed != first and "fact" in changed
    assert [(e.type, e.data) for e in await uncached.read_events()] == [
        ("context.updated", {"label": "memory", "content": "fact"}),
        ("prompt.updated", {"prompt": changed}),
    ]


async def test_add_and_remove_context_events(store: SqliteStore) -> None:
    session = chat(store, "ev7")
    prompt = await session.freeze_system_prompt()
    seq = await last_seq(session)
    block = await session.add_context("notes", description="Scratch", max_tokens=30)
    assert (block.label, block.content, block.writable) == ("notes", "", True)
    with pytest.raises(ContextError, match=r'^Block "notes" already exists$'):
        await session.add_context("notes")
    await session.replace_context_block("notes", "jot")
    assert await store.get_context_value("notes_ev7") == "jot"
    assert await session.freeze_system_prompt() == prompt  # adding does not touch the frozen prompt
    assert await session.remove_context("notes")
    events = await session.read_events(seq)
    assert [e.type for e in events] == ["context.added", "context.updated", "context.removed"]
    assert events[0].data["block"]["label"] == "notes"
    assert events[0].data["block"]["description"] == "Scratch"
    assert events[2].data == {"label": "notes"}
    assert "NOTES" not in await session.refresh_system_prompt()


async def test_event_seqs_are_gap_free(store: SqliteStore) -> None:
    session = chat(store, "ev8")
    await session.freeze_system_prompt()
    await session.append_message(T("m1", "user", "hi"))
    await session.replace_context_block("memory", "x")
    await session.refresh_system_prompt()
    await session.clear_messages()
    events = await session.read_events()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events] == [
        "prompt.updated",
        "message.appended",
        "context.updated",
        "prompt.updated",
        "messages.cleared",
        "prompt.updated",
    ]


# ================================================================================================
# clear_messages re-renders and persists the frozen prompt
# ================================================================================================


async def test_clear_messages_refreshes_and_persists_prompt(store: SqliteStore) -> None:
    session = chat(store, "clr").with_context("skills", provider=pirate_skills())
    old = await session.freeze_system_prompt()
    await session.append_message(T("m1", "user", "hi"))
    await run_tool(session, "load_context", {"label": "skills", "key": "pirate"})
    await session.replace_context_block("memory", "User likes tea.")
    assert await session.freeze_system_prompt() == old
    seq = await last_seq(session)
    await session.clear_messages()
    new = await store.get_context_value("_system_prompt_clr")
    assert new is not None and new != old and "User likes tea." in new
    assert await session.freeze_system_prompt() == new
    assert await session.get_loaded_skill_keys() == set()
    assert await session.get_history() == []
    assert [(e.type, e.data) for e in await session.read_events(seq)] == [
        ("messages.cleared", {}),
        ("prompt.updated", {"prompt": new}),
    ]


# ================================================================================================
# Restart: frozen prompt byte for byte, loaded skills restored from the transcript
# ================================================================================================


def load_part(call_id: str, key: str, output: str, *, typed: bool = False) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "tool-load_context" if typed else "dynamic-tool",
        "toolCallId": call_id,
        "state": "output-available",
        "input": {"label": "skills", "key": key},
        "output": output,
    }
    if not typed:
        part["toolName"] = "load_context"
    return part


def load_message(message_id: str, key: str, output: str, *, typed: bool = False) -> dict[str, Any]:
    return {
        "id": message_id,
        "role": "assistant",
        "parts": [load_part("c-" + message_id, key, output, typed=typed)],
    }


def restart_session(store: SqliteStore) -> Session:
    return (
        Session(store)
        .for_session("r1")
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", description="Learned facts", max_tokens=100)
        .with_context("skills", description="Playbooks", provider=pirate_skills())
        .with_cached_prompt()
    )


async def test_restart_keeps_prompt_and_restores_skills(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    try:
        session = restart_session(store)
        prompt = await session.freeze_system_prompt()
        await session.replace_context_block("memory", "User likes tea.")
        await session.append_message(T("u1", "user", "talk like a pirate"))
        await session.append_message(
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    {"type": "step-start"},
                    {
                        "type": "dynamic-tool",
                        "toolName": "load_context",
                        "toolCallId": "c",
                        "state": "output-available",
                        "input": {"label": "skills", "key": "x"},
                        "output": "...",
                    },
                    {
                        "type": "tool-load_context",
                        "toolCallId": "c2",
                        "state": "output-available",
                        "input": {"label": "skills", "key": "y"},
                        "output": "...",
                    },
                ],
            }
        )
    finally:
        await store.close()

    store = await SqliteStore.open(db_path)
    try:
        session = restart_session(store)
        again = await session.freeze_system_prompt()
        assert again == prompt and again.encode() == prompt.encode()
        assert "User likes tea." not in again
        # Departure: the typed `tool-load_context` part (no toolName) is restored too.
        assert await session.get_loaded_skill_keys() == {"skills:x", "skills:y"}
        assert (await tool_map(session))["unload_context"].description.endswith(
            " Currently loaded: skills:x, skills:y."
        )
        assert await run_tool(session, "unload_context", {"label": "skills", "key": "y"}) == (
            'Unloaded "y" from skills. Context reclaimed.'
        )
        message = await session.get_message("a1")
        assert message is not None
        assert [p.get("output") for p in message.parts] == [None, "...", "[skill unloaded: y]"]
        assert message.parts[2]["type"] == "tool-load_context" and "toolName" not in message.parts[2]
    finally:
        await store.close()

    store = await SqliteStore.open(db_path)
    try:
        session = restart_session(store)
        assert await session.freeze_system_prompt() == prompt
        assert await session.get_loaded_skill_keys() == {"skills:x"}
    finally:
        await store.close()


async def test_restore_rules(store: SqliteStore) -> None:
    first = restart_session(store)
    await first.append_message(load_message("a1", "kept", "doc"))
    await first.append_message(load_message("a2", "gone", "doc", typed=True))
    await first.append_message(
        {
            "id": "a3",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": "unload_context",
                    "toolCallId": "u",
                    "state": "output-available",
                    "input": {"label": "skills", "key": "gone"},
                    "output": 'Unloaded "gone" from skills. Context reclaimed.',
                }
            ],
        }
    )
    await first.append_message(load_message("a4", "reclaimed", "[skill unloaded: reclaimed]"))
    await first.append_message(load_message("u5", "from-user", "doc") | {"role": "user"})
    streaming = load_message("a6", "streaming", "doc")
    streaming["parts"][0]["state"] = "input-available"
    await first.append_message(streaming)
    await first.append_message(
        {
            "id": "a7",
            "role": "assistant",
            "parts": [load_part("c7", "", "doc"), load_part("c8", "typed", "doc", typed=True)],
        }
    )
    restored = restart_session(store)
    assert await restored.get_loaded_skill_keys() == {"skills:kept", "skills:typed"}


async def test_restore_only_on_the_active_branch(store: SqliteStore) -> None:
    first = restart_session(store)
    await first.append_message(T("u1", "user", "q"))
    await first.append_message(load_message("a-old", "old-branch", "doc"), "u1")
    await first.append_message(load_message("a-new", "new-branch", "doc"), "u1")
    assert await restart_session(store).get_loaded_skill_keys() == {"skills:new-branch"}


async def test_adding_a_skill_block_later_restores(store: SqliteStore) -> None:
    writer = Session(store).for_session("late")
    await writer.append_message(load_message("a1", "pirate", "Talk like a pirate. Arr!", typed=True))
    session = Session(store).for_session("late").with_context("memory")
    assert await session.get_loaded_skill_keys() == set()
    await session.add_context("skills", provider=pirate_skills())
    assert await session.get_loaded_skill_keys() == {"skills:pirate"}


# ================================================================================================
# SessionManager: templates, shared providers, searchable history, tools, delete
# ================================================================================================


async def test_manager_templates_namespace_rows(store: SqliteStore) -> None:
    manager = SessionManager(store).with_context("memory", description="Learned facts").with_cached_prompt()
    a, b = await manager.create("A"), await manager.create("B")
    sa, sb = manager.get_session(a.id), manager.get_session(b.id)
    assert manager.get_session(a.id) is sa
    await run_tool(sa, "set_context", {"label": "memory", "content": "A fact"})
    await sb.replace_context_block("memory", "B fact")
    pa, pb = await sa.freeze_system_prompt(), await sb.freeze_system_prompt()
    assert "A fact" in pa and "B fact" in pb
    assert await store.get_context_value(f"memory_{a.id}") == "A fact"
    assert await store.get_context_value(f"memory_{b.id}") == "B fact"
    assert await store.get_context_value(f"_system_prompt_{a.id}") == pa
    assert await store.get_context_value(f"_system_prompt_{b.id}") == pb
    assert await store.get_context_value("memory") is None
    assert await store.get_context_value("_system_prompt") is None
    assert "context.updated" in await event_types(sa)


async def test_manager_shares_explicit_provider_instances(store: SqliteStore) -> None:
    shared = Mem("start")
    manager = SessionManager(store).with_context("notes", provider=shared)
    a, b = await manager.create("A"), await manager.create("B")
    sa, sb = manager.get_session(a.id), manager.get_session(b.id)
    await sa.freeze_system_prompt()
    await sb.freeze_system_prompt()
    await sa.replace_context_block("notes", "from A")
    assert shared.value == "from A"
    assert "from A" in await sb.refresh_system_prompt()
    assert block_of(await sb.get_context_block("notes")).content == "from A"
    assert await store.get_context_value(f"notes_{a.id}") is None


async def test_manager_searchable_history_block(store: SqliteStore) -> None:
    manager = SessionManager(store).with_searchable_history("history")
    early = manager.get_session("not-registered")
    assert await early.freeze_system_prompt() == section(
        "HISTORY (Cross-session conversation history) [searchable]", ""
    )
    a = await manager.create("A")
    sa = manager.get_session(a.id)
    block = block_of(await sa.get_context_block("history"))
    assert (block.description, block.content, block.is_searchable, block.writable) == (
        "Cross-session conversation history",
        "1 session available for search.",
        True,
        False,
    )
    b = await manager.create("B")
    assert "2 sessions available for search." in await sa.refresh_system_prompt()
    assert list(await tool_map(sa)) == ["search_context"]

    await manager.append(a.id, T("a1", "user", "How do I deploy the worker?"))
    await manager.append(b.id, T("b1", "assistant", "Deploy it with wrangler."))
    await manager.append(b.id, T("b2", "user", "Thanks, unrelated."))
    result = await run_tool(sa, "search_context", {"label": "history", "query": "deploy"})
    assert sorted(result.split("\n---\n")) == [
        "[assistant] Deploy it with wrangler.",
        "[user] How do I deploy the worker?",
    ]
    assert (
        await run_tool(sa, "search_context", {"label": "history", "query": "kubernetes"})
        == "No results found."
    )


async def test_manager_tools_are_only_session_search(store: SqliteStore) -> None:
    manager = SessionManager(store).with_context("memory").with_searchable_history("history")
    tools = manager.tools()
    assert [t.name for t in tools] == ["session_search"]
    (tool,) = tools
    assert tool.description == "Search past conversations for relevant context. Searches across all sessions."
    assert tool.input_schema["properties"] == {"query": {"type": "string", "description": "Search query"}}
    assert tool.input_schema["required"] == ["query"]
    a = await manager.create("A")
    await manager.append(a.id, T("a1", "user", "deploy the worker"))
    await manager.append(a.id, T("a2", "assistant", "Use wrangler deploy."))
    result = await tool.execute({"query": "deploy"})
    assert sorted(result.split("\n---\n")) == ["[assistant] Use wrangler deploy.", "[user] deploy the worker"]
    assert await tool.execute({"query": "kubernetes"}) == "No results found."
    assert await dispatch(tools, "session_search", '{"query": ""}') == "No results found."
    for session in (manager.get_session(a.id), Session(store).with_context("memory")):
        assert "session_search" not in await tool_map(session)


async def test_manager_delete_removes_context_rows(store: SqliteStore) -> None:
    manager = SessionManager(store).with_context("memory").with_cached_prompt()
    a, b = await manager.create("A"), await manager.create("B")
    for info in (a, b):
        session = manager.get_session(info.id)
        await session.replace_context_block("memory", f"fact {info.name}")
        await session.freeze_system_prompt()
    await manager.delete(a.id)
    assert await manager.get(a.id) is None
    assert await store.get_context_value(f"memory_{a.id}") is None
    assert await store.get_context_value(f"_system_prompt_{a.id}") is None
    assert await store.get_context_value(f"memory_{b.id}") == "fact B"
    assert await store.get_context_value(f"_system_prompt_{b.id}") is not None
    assert manager.get_session(a.id) is not manager.get_session(b.id)


async def test_manager_clear_messages_rerenders_session_prompt(store: SqliteStore) -> None:
    """spec §12: ``clearMessages(id)`` passes through to the Session's ``clearMessages``,
    which clears loaded skills and re-renders and persists the prompt (§10.5, §13.2)."""
    manager = (
        SessionManager(store)
        .with_context("memory")
        .with_context("skills", provider=pirate_skills())
        .with_cached_prompt()
    )
    a = await manager.create("A")
    session = manager.get_session(a.id)
    old = await session.freeze_system_prompt()
    await manager.append(a.id, T("m1", "user", "hi"))
    await run_tool(session, "load_context", {"label": "skills", "key": "pirate"})
    await session.replace_context_block("memory", "User likes tea.")
    await manager.clear_messages(a.id)
    assert await manager.get_history(a.id) == []
    stored = await store.get_context_value(f"_system_prompt_{a.id}")
    assert stored is not None and stored != old and "User likes tea." in stored
    assert await session.get_loaded_skill_keys() == set()
