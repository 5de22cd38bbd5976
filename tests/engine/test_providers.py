"""Built-in providers on a real SQLite file (spec §9.1, §9.2; the Postgres provider cases of
§16.1 ported to the store-backed providers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub import ReadonlyText, SqliteStore, StoreContextProvider, StoreSearchProvider, session_stream
from hub.context import (
    ContextBlocks,
    ContextConfig,
    is_search_provider,
    is_skill_provider,
    is_writable_provider,
)

SEP = "═" * 46


def knowledge(store: SqliteStore, label: str = "knowledge") -> StoreSearchProvider:
    provider = StoreSearchProvider(store)
    provider.init(label)
    return provider


# -- ReadonlyText ------------------------------------------------------------------------------


async def test_readonly_text() -> None:
    provider = ReadonlyText("You are helpful.")
    assert provider.get() == "You are helpful."
    assert ReadonlyText(None).get() is None
    assert not is_writable_provider(provider)
    assert not is_skill_provider(provider) and not is_search_provider(provider)


async def test_readonly_text_in_blocks() -> None:
    blocks = ContextBlocks(
        [
            ContextConfig("soul", provider=ReadonlyText("You are helpful.")),
            ContextConfig("empty", provider=ReadonlyText("")),
            ContextConfig("none", provider=ReadonlyText(None)),
        ]
    )
    await blocks.load()
    assert blocks.to_system_prompt() == f"{SEP}\nSOUL [readonly]\n{SEP}\nYou are helpful."
    block = blocks.get_block("soul")
    assert block is not None and not block.writable and block.tokens == 4
    empty = blocks.get_block("none")
    assert empty is not None and empty.content == "" and empty.tokens == 0
    assert await blocks.tools() == []


# -- StoreContextProvider ------------------------------------------------------------------------


async def test_context_provider_none_when_unset(store: SqliteStore) -> None:
    assert await StoreContextProvider(store, "memory").get() is None


async def test_context_provider_set_get_overwrite(store: SqliteStore) -> None:
    provider = StoreContextProvider(store, "memory")
    await provider.set("User likes tea.")
    assert await provider.get() == "User likes tea."
    await provider.set("User likes coffee.")
    assert await provider.get() == "User likes coffee."
    assert await store.get_context_value("memory") == "User likes coffee."
    await provider.set("")
    assert await provider.get() == ""


async def test_context_provider_isolates_by_key(store: SqliteStore) -> None:
    a, b = StoreContextProvider(store, "memory_a"), StoreContextProvider(store, "memory_b")
    await a.set("A")
    assert await b.get() is None
    await b.set("B")
    assert (await a.get(), await b.get()) == ("A", "B")
    # Another provider on the same key sees the same row.
    assert await StoreContextProvider(store, "memory_a").get() == "A"


async def test_context_provider_persists_across_reopen(store: SqliteStore, db_path: Path) -> None:
    await StoreContextProvider(store, "memory").set("kept")
    reopened = await SqliteStore.open(db_path)
    try:
        assert await StoreContextProvider(reopened, "memory").get() == "kept"
    finally:
        await reopened.close()


async def test_context_provider_init_sets_key_only_when_none_given(store: SqliteStore) -> None:
    unnamed = StoreContextProvider(store)
    unnamed.init("notes")
    await unnamed.set("from init")
    assert await store.get_context_value("notes") == "from init"

    named = StoreContextProvider(store, "memory_chat-1")
    named.init("memory")
    await named.set("namespaced")
    assert await store.get_context_value("memory_chat-1") == "namespaced"
    assert await store.get_context_value("memory") is None

    unnamed.init("other")  # the key stays the first one
    assert await unnamed.get() == "from init"


async def test_context_provider_without_session_logs_nothing(store: SqliteStore) -> None:
    await StoreContextProvider(store, "memory").set("x")
    assert await store.read_events(session_stream("")) == []


async def test_context_provider_with_session_logs_its_write(store: SqliteStore) -> None:
    provider = StoreContextProvider(store, "memory_s1", session_id="s1")
    provider.init("memory")
    await provider.set("fact")
    events = await store.read_events(session_stream("s1"))
    assert [(e.seq, e.type, e.data) for e in events] == [
        (1, "context.updated", {"label": "memory", "content": "fact"})
    ]
    prompt = StoreContextProvider(store, "_system_prompt_s1", session_id="s1", event_type="prompt.updated")
    await prompt.set("P")
    events = await store.read_events(session_stream("s1"), 1)
    assert [(e.type, e.data) for e in events] == [("prompt.updated", {"prompt": "P"})]


async def test_context_provider_in_blocks_is_writable(store: SqliteStore) -> None:
    blocks = ContextBlocks([ContextConfig("memory", provider=StoreContextProvider(store))])
    await blocks.set_block("memory", "hello")
    assert await store.get_context_value("memory") == "hello"
    fresh = ContextBlocks([ContextConfig("memory", provider=StoreContextProvider(store))])
    await fresh.load()
    block = fresh.get_block("memory")
    assert block is not None and block.content == "hello" and block.writable


# -- StoreSearchProvider -----------------------------------------------------------------------


async def test_search_provider_count(store: SqliteStore) -> None:
    provider = knowledge(store)
    assert await provider.get() is None
    await provider.set("k1", "Rollbacks take 2 minutes.")
    assert await provider.get() == "1 entries indexed."
    await provider.set("k2", "Deployments happen on Tuesdays.")
    assert await provider.get() == "2 entries indexed."


async def test_search_provider_hits(store: SqliteStore) -> None:
    provider = knowledge(store)
    await provider.set("rollback-policy", "Rollbacks take 2 minutes.")
    await provider.set("deploys", "Deployments happen on Tuesdays and Thursdays.")
    assert await provider.search("rollback") == "[rollback-policy]\nRollbacks take 2 minutes."
    assert await provider.search("Rollbacks") == "[rollback-policy]\nRollbacks take 2 minutes."
    assert await provider.search("minutes") == "[rollback-policy]\nRollbacks take 2 minutes."
    hit = "[deploys]\nDeployments happen on Tuesdays and Thursdays."
    assert await provider.search("deployment") == hit  # porter stemming
    assert await provider.search("nothing-here") is None


async def test_search_provider_word_and_semantics(store: SqliteStore) -> None:
    provider = knowledge(store)
    await provider.set("deploys", "Deployments happen on Tuesdays and Thursdays.")
    hit = "[deploys]\nDeployments happen on Tuesdays and Thursdays."
    assert await provider.search("Tuesdays Thursdays") == hit  # not adjacent
    assert await provider.search("thursdays tuesdays") == hit  # any order
    assert await provider.search("  tuesdays\n\tdeployments  ") == hit
    assert await provider.search("tuesdays fridays") is None  # every word must match
    await provider.set("other", "Fridays are quiet.")
    assert await provider.search("fridays") == "[other]\nFridays are quiet."
    both = await provider.search("happen")
    assert both == hit


async def test_search_provider_multiple_hits_joined(store: SqliteStore) -> None:
    provider = knowledge(store)
    await provider.set("a", "alpha shared")
    await provider.set("b", "beta shared")
    result = await provider.search("shared")
    assert result is not None
    assert sorted(result.split("\n\n")) == ["[a]\nalpha shared", "[b]\nbeta shared"]


async def test_search_provider_upsert_on_same_key(store: SqliteStore) -> None:
    provider = knowledge(store)
    await provider.set("policy", "Rollbacks take 2 minutes.")
    await provider.set("policy", "Rollbacks take 5 minutes with approval.")
    assert await provider.get() == "1 entries indexed."
    assert await provider.search("approval") == "[policy]\nRollbacks take 5 minutes with approval."
    assert await provider.search("2") is None  # the old words stop matching
    assert await provider.search("rollbacks") == "[policy]\nRollbacks take 5 minutes with approval."


async def test_search_provider_isolates_by_label(store: SqliteStore) -> None:
    a, b = knowledge(store, "wiki"), knowledge(store, "notes")
    await a.set("k", "shared words in wiki")
    assert await b.get() is None
    assert await b.search("shared") is None
    await b.set("k", "shared words in notes")  # same key, other label: another entry
    assert (await a.get(), await b.get()) == ("1 entries indexed.", "1 entries indexed.")
    assert await a.search("shared") == "[k]\nshared words in wiki"
    assert await b.search("shared") == "[k]\nshared words in notes"


async def test_search_provider_at_most_ten_hits(store: SqliteStore) -> None:
    provider = knowledge(store)
    for i in range(12):
        await provider.set(f"k{i:02d}", f"common entry number {i}")
    assert await provider.get() == "12 entries indexed."
    result = await provider.search("common")
    assert result is not None
    hits = result.split("\n\n")
    assert len(hits) == 10
    assert all(h.startswith("[k") and "\ncommon entry number " in h for h in hits)


@pytest.mark.parametrize(
    "query",
    [
        "",
        "   ",
        '"',
        '""',
        "NEAR(",
        "*",
        "^",
        "(",
        ")",
        "a OR b",
        "NOT",
        "x AND",
        "body:secret",
        "lbl:knowledge",
        "'",
        "\\",
        "-",
        "+",
        ":",
        "{a b}",
        "\x00",
        "NEAR(a b, 2)",
        "a*b",
    ],
)
async def test_search_provider_hostile_queries(store: SqliteStore, query: str) -> None:
    provider = knowledge(store)
    await provider.set("k", "Rollbacks take 2 minutes.")
    assert await provider.search(query) is None


async def test_search_provider_operators_are_plain_words(store: SqliteStore) -> None:
    provider = knowledge(store)
    await provider.set("ops", "cats OR dogs NOT birds")
    await provider.set("cats", "only cats here")
    assert await provider.search("cats OR dogs") == "[ops]\ncats OR dogs NOT birds"
    assert await provider.search("NOT birds") == "[ops]\ncats OR dogs NOT birds"
    quoted = await provider.search('"cats"')
    assert quoted is not None
    assert sorted(quoted.split("\n\n")) == ["[cats]\nonly cats here", "[ops]\ncats OR dogs NOT birds"]


async def test_search_provider_init_always_overwrites_label(store: SqliteStore) -> None:
    provider = StoreSearchProvider(store, "first")
    provider.init("second")
    await provider.set("k", "hello")
    assert await store.count_search_entries("second") == 1
    assert await store.count_search_entries("first") == 0


async def test_search_provider_with_session_logs_its_write(store: SqliteStore) -> None:
    provider = StoreSearchProvider(store, "knowledge", session_id="s1")
    await provider.set("k", "hello")
    events = await store.read_events(session_stream("s1"))
    assert [(e.type, e.data) for e in events] == [
        ("context.entry_set", {"label": "knowledge", "key": "k", "content": "hello"})
    ]


async def test_search_provider_persists_across_reopen(store: SqliteStore, db_path: Path) -> None:
    await knowledge(store).set("k", "durable words")
    reopened = await SqliteStore.open(db_path)
    try:
        provider = knowledge(reopened)
        assert await provider.get() == "1 entries indexed."
        assert await provider.search("durable") == "[k]\ndurable words"
    finally:
        await reopened.close()


async def test_search_provider_in_blocks(store: SqliteStore) -> None:
    blocks = ContextBlocks(
        [ContextConfig("knowledge", description="Team wiki", provider=StoreSearchProvider(store))]
    )
    await blocks.load()
    assert blocks.to_system_prompt() == f"{SEP}\nKNOWLEDGE (Team wiki) [searchable]\n{SEP}\n"
    assert [t.name for t in await blocks.tools()] == ["set_context", "search_context"]
    block = await blocks.set_search_entry("knowledge", "k", "hello there")
    assert block.content == "1 entries indexed." and block.tokens == 5
    assert await blocks.search_context("knowledge", "hello") == "[k]\nhello there"
    assert await store.count_search_entries("knowledge") == 1
