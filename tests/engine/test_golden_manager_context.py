"""SessionManager context, tools and prompt against the real original (``session_manager.json``).

The parts ``tests/engine/test_golden_manager.py`` leaves out: ``managerTools``,
``managerTool_session_search``, ``sessionPrompt_A``, ``sessionTools_A``,
``session_set_context``, ``session_search_context_history(_miss)`` and ``contextRows``.
``golden-exp.mjs::manager()`` is replayed up to that point (create A and B, appends,
append_all, upserts, usage, rename, fork, both compact-and-splits: five sessions) with the
recorder's template: soul (read-only), memory (``max_tokens=200``), searchable history
``"history"`` and a cached prompt.

The original dumped ``cf_agents_context_blocks``; its labels ``_system_prompt_<id>`` and
``memory_<id>`` (deterministic UUIDs) are mapped to A's real id and read back with
``store.get_context_value``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hub import ReadonlyText, Session, SessionInfo, SessionManager, SqliteStore, Tool
from tests.support.hubtest import text_message

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "session_manager.json").read_text(
        encoding="utf-8"
    )
)
GOLDEN_A: str = GOLDEN["create_A"]["id"]


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


def aisdk_schema(golden_tool: dict[str, Any]) -> dict[str, Any]:
    schema = dict(golden_tool["inputSchema_aisdk_v6_asSchema"])
    assert schema.pop("$schema") == "http://json-schema.org/draft-07/schema#"
    return schema


@dataclass
class Replay:
    manager: SessionManager
    a: SessionInfo

    def session_a(self) -> Session:
        return self.manager.get_session(self.a.id)


async def replay(store: SqliteStore) -> Replay:
    m = (
        SessionManager(store)
        .with_context("soul", provider=ReadonlyText("You are a helpful assistant."))
        .with_context("memory", description="Learned facts", max_tokens=200)
        .with_searchable_history("history")
        .with_cached_prompt()
    )
    a = await m.create("Chat A", model="gpt-x", source="web")
    b = await m.create("Chat B")
    await m.append(a.id, text_message("a-1", "user", "How do I deploy the worker?"))
    await m.append(a.id, text_message("a-2", "assistant", "Run wrangler deploy after the deployment checks."))
    await m.append_all(
        b.id,
        [
            text_message("b-1", "user", "Deploying on Friday?"),
            text_message("b-2", "assistant", "Never deploy on Friday."),
        ],
    )
    await m.upsert(
        a.id, text_message("a-2", "assistant", "Run wrangler deploy after deployment checks pass.")
    )
    await m.upsert(a.id, text_message("a-3", "user", "Thanks!"))
    await m.add_usage(a.id, 100, 50, 0.0123)
    await m.add_usage(a.id, 1, 2, 0.5)
    await m.rename(b.id, "Chat B renamed")
    await m.fork(a.id, "a-2", "Fork of A")
    await m.compact_and_split(a.id, "We discussed deploying workers.", "A (continued)")
    await m.compact_and_split(b.id, "B summary")
    assert len(await m.list()) == len(GOLDEN["list_after"]) == 5
    return Replay(m, a)


# -- the manager's own tool ------------------------------------------------------------------


async def test_manager_tools(store: SqliteStore) -> None:
    r = await replay(store)
    golden = GOLDEN["managerTools"]
    tools = r.manager.tools()
    assert [t.name for t in tools] == list(golden) == ["session_search"]
    for tool in tools:
        assert tool.description == golden[tool.name]["description"]
        assert tool.input_schema == aisdk_schema(golden[tool.name])


@pytest.mark.parametrize(("case", "query"), [("hit", "friday"), ("miss", "zzzz")])
async def test_manager_tool_session_search(store: SqliteStore, case: str, query: str) -> None:
    r = await replay(store)
    session_search = by_name(r.manager.tools())["session_search"]
    assert await session_search.execute({"query": query}) == GOLDEN["managerTool_session_search"][case]


# -- a managed session's prompt, tools and blocks --------------------------------------------


async def test_session_prompt_a(store: SqliteStore) -> None:
    r = await replay(store)
    assert await r.session_a().freeze_system_prompt() == GOLDEN["sessionPrompt_A"]


async def test_session_tools_a(store: SqliteStore) -> None:
    r = await replay(store)
    golden = GOLDEN["sessionTools_A"]
    tools = await r.session_a().tools()
    assert [t.name for t in tools] == list(golden) == ["set_context", "search_context"]
    for tool in tools:
        assert tool.description == golden[tool.name]["description"], tool.name
        assert tool.input_schema == aisdk_schema(golden[tool.name]), tool.name
    assert "session_search" not in by_name(tools)


async def test_session_set_context(store: SqliteStore) -> None:
    r = await replay(store)
    sa = r.session_a()
    await sa.freeze_system_prompt()
    set_context = by_name(await sa.tools())["set_context"]
    result = await set_context.execute({"label": "memory", "content": "A likes workers."})
    assert result == GOLDEN["session_set_context"]


@pytest.mark.parametrize(
    ("key", "query"),
    [("session_search_context_history", "friday"), ("session_search_context_history_miss", "zzzz")],
)
async def test_session_search_context_history(store: SqliteStore, key: str, query: str) -> None:
    r = await replay(store)
    search_context = by_name(await r.session_a().tools())["search_context"]
    assert await search_context.execute({"label": "history", "query": query}) == GOLDEN[key]


async def test_context_rows(store: SqliteStore) -> None:
    """The recorder's sequence: freeze A's prompt, then ``set_context`` on memory; the rows
    left behind are the persisted frozen prompt and A's namespaced memory."""
    r = await replay(store)
    sa = r.session_a()
    await sa.freeze_system_prompt()
    await by_name(await sa.tools())["set_context"].execute({"label": "memory", "content": "A likes workers."})

    rows = GOLDEN["contextRows"]
    assert [row["label"] for row in rows] == [f"_system_prompt_{GOLDEN_A}", f"memory_{GOLDEN_A}"]
    for row in rows:
        our_key = row["label"].replace(GOLDEN_A, r.a.id)
        assert await store.get_context_value(our_key) == row["content"], row["label"]
    # No un-namespaced rows: every context row of a managed session carries its id.
    assert await store.get_context_value("memory") is None
    assert await store.get_context_value("_system_prompt") is None
