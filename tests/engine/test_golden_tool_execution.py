"""Running the context tools against the real original's outputs (``tool_execution.json``).

``golden-exp.mjs::toolExec()`` is replayed step by step against one :class:`hub.Session`
(soul, memory with ``max_tokens=20``, notes, a searchable knowledge block and a skills
folder), collecting our results under the recorder's keys; each key is then compared with
the golden value exactly:

* ``set_context`` / ``search_context`` / ``load_context`` / ``unload_context`` result strings;
* blocks (``getContextBlock``) in the original's camelCase shape;
* ``knowledgeEntries``: the original dumped ``cf_agents_search_entries`` in rowid order; ours
  is our ``search_entries`` table in insertion order (an update keeps its row);
* ``attempt(...)`` failures: ours raise :class:`hub.ContextError` with exactly the message
  (the JS error class name, ``Error``, is not compared);
* loaded skill keys: a JS ``Set`` spread to a list vs our ``set``, compared as sets.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub import (
    ContextBlock,
    ContextError,
    FileSkillProvider,
    ReadonlyText,
    Session,
    SqliteStore,
    StoreSearchProvider,
    Tool,
)

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "tool_execution.json").read_text(encoding="utf-8")
)

SEARCH_QUERIES = [
    "rollback",
    "rollbacks",
    "deployment",
    "Tuesdays Thursdays",
    "thursdays tuesdays",
    "minutes",
    "nothing-here",
    '"',
    "NEAR(",
    "*",
    "",
    "   ",
]


def block_dict(block: ContextBlock | None) -> dict[str, Any] | None:
    """Our block in the original's ``getContextBlock()`` shape (camelCase, no
    ``description`` / ``maxTokens`` when unset)."""
    if block is None:
        return None
    raw: dict[str, Any] = msgspec.to_builtins(block)
    renames = {"max_tokens": "maxTokens", "is_skill": "isSkill", "is_searchable": "isSearchable"}
    out = {renames.get(k, k): v for k, v in raw.items()}
    for key in ("description", "maxTokens"):
        if out.get(key) is None:
            out.pop(key, None)
    return out


async def attempt(fn: Callable[[], Awaitable[object]]) -> dict[str, Any]:
    """The recorder's ``attempt``: ``{ok: true, value}`` or ``{ok: false, error: {message}}``
    for a refused context operation (any other exception propagates)."""
    try:
        value = await fn()
    except ContextError as exc:
        return {"ok": False, "error": {"message": str(exc)}}
    return {"ok": True, "value": value}


def without_error_name(golden: dict[str, Any]) -> dict[str, Any]:
    if golden.get("ok") is False:
        assert golden["error"]["name"] == "Error"
        return {"ok": False, "error": {"message": golden["error"]["message"]}}
    return golden


def search_entry_rows(db_path: Path) -> list[dict[str, str]]:
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT label, key, content FROM search_entries ORDER BY pk").fetchall()
    return [{"label": label, "key": key, "content": content} for label, key, content in rows]


async def skills(tmp_path: Path) -> FileSkillProvider:
    """The recorder's ``R2SkillProvider(skillBucket(), {prefix: "skills/"})`` as a folder;
    ``other/ignored`` lies outside it (so ``../other/ignored`` exists on disk)."""
    p = FileSkillProvider(tmp_path / "skills")
    await p.set(
        "code-review", "# Code review\nCheck tests first, then naming.", "How to review a pull request"
    )
    await p.set("debugging", "# Debugging\nReproduce, bisect, fix.")
    await FileSkillProvider(tmp_path / "other").set("ignored", "not a skill", "outside prefix")
    return p


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


async def append_to_empty(tmp_path: Path) -> dict[str, Any]:
    """``appendToEmpty`` ran on a fresh agent: a fresh store here."""
    other = await SqliteStore.open(tmp_path / "append-to-empty.db")
    try:
        s2 = Session(other).with_context("m")
        t2 = by_name(await s2.tools())
        out = await t2["set_context"].execute({"label": "m", "content": "only", "action": "append"})
        block = await s2.get_context_block("m")
        assert block is not None
        return {"result": out, "content": block.content}
    finally:
        await other.close()


async def replay(store: SqliteStore, db_path: Path, tmp_path: Path) -> dict[str, Any]:
    s = (
        Session(store)
        .with_context("soul", provider=ReadonlyText("You are a helpful assistant."))
        .with_context("memory", description="Learned facts", max_tokens=20)
        .with_context("notes")
        .with_context("knowledge", description="Team wiki", provider=StoreSearchProvider(store))
        .with_context("skills", description="Playbooks", provider=await skills(tmp_path))
    )
    tools = by_name(await s.tools())

    async def set_(args: dict[str, Any]) -> str:
        return await tools["set_context"].execute(args)

    async def block(label: str) -> dict[str, Any] | None:
        return block_dict(await s.get_context_block(label))

    r: dict[str, Any] = {}
    r["replace"] = await set_({"label": "memory", "content": "User is Ada."})
    r["append"] = await set_({"label": "memory", "content": "Likes tea.", "action": "append"})
    r["blockAfterAppend"] = await block("memory")
    r["appendLeadingNewline"] = await set_({"label": "notes", "content": "first"})
    r["appendLeadingNewline2"] = await set_({"label": "notes", "content": "\nsecond", "action": "append"})
    notes = await block("notes")
    assert notes is not None
    r["notesContent"] = notes["content"]
    r["appendToEmpty"] = await append_to_empty(tmp_path)
    r["overMaxTokens"] = await set_({"label": "memory", "content": "word " * 30})
    memory = await block("memory")
    assert memory is not None
    r["memoryAfterRejectedWrite"] = memory["content"]
    r["readonlyLabel"] = await set_({"label": "soul", "content": "hacked"})
    r["unknownLabel"] = await set_({"label": "nope", "content": "x"})
    r["noMaxTokens"] = await set_({"label": "notes", "content": "a b c"})
    r["unknownAction_treatedAsReplace"] = await set_({"label": "notes", "content": "zzz", "action": "bogus"})
    r["searchableWithTitle"] = await set_(
        {
            "label": "knowledge",
            "content": "Rollbacks take 5 minutes.",
            "metadata": {"title": "Rollback Policy!"},
        }
    )
    r["searchableNoTitle"] = await set_(
        {"label": "knowledge", "content": "Deployments happen on Tuesdays and Thursdays."}
    )
    r["searchableSameTitleUpdates"] = await set_(
        {
            "label": "knowledge",
            "content": "Rollbacks take 2 minutes.",
            "metadata": {"title": "Rollback Policy!"},
        }
    )
    r["searchableTitleOnlySymbols"] = await set_(
        {"label": "knowledge", "content": "symbol title", "metadata": {"title": "!!!"}}
    )
    r["searchableContentOnlySymbols"] = await set_({"label": "knowledge", "content": "???"})
    r["knowledgeBlockAfterWrites"] = await block("knowledge")
    r["knowledgeEntries"] = search_entry_rows(db_path)
    r["skillWrite"] = await set_(
        {
            "label": "skills",
            "content": "# Deploy\nSteps...",
            "metadata": {"title": "Deploy Runbook", "description": "How to deploy"},
        }
    )
    r["skillWriteNoMeta"] = await set_({"label": "skills", "content": "Short skill"})
    r["skillsBlockAfterWrites"] = await block("skills")
    r["replaceContextBlock_readonly"] = await attempt(lambda: s.replace_context_block("soul", "x"))
    r["replaceContextBlock_keyed"] = await attempt(lambda: s.replace_context_block("knowledge", "x"))
    r["appendContextBlock_missing"] = await attempt(lambda: s.append_context_block("missing", "x"))
    r["replaceContextBlock_over"] = await attempt(lambda: s.replace_context_block("memory", "word " * 30))

    search = tools["search_context"]
    r["search"] = {
        json.dumps(q): await search.execute({"label": "knowledge", "query": q}) for q in SEARCH_QUERIES
    }
    r["searchNonSearchableLabel"] = await search.execute({"label": "memory", "query": "x"})

    load, unload = tools["load_context"], tools["unload_context"]
    r["load_existing"] = await load.execute({"label": "skills", "key": "code-review"})
    r["load_missing"] = await load.execute({"label": "skills", "key": "nope"})
    r["load_outside_prefix"] = await load.execute({"label": "skills", "key": "../other/ignored"})
    r["load_wrong_label"] = await load.execute({"label": "memory", "key": "code-review"})
    r["loadedKeysAfterLoad"] = await s.get_loaded_skill_keys()
    r["toolsAfterLoad_unloadDescription"] = by_name(await s.tools())["unload_context"].description
    r["unload_notLoaded"] = await unload.execute({"label": "skills", "key": "debugging"})
    r["unload_wrongLabel"] = await unload.execute({"label": "memory", "key": "code-review"})
    r["unload_loaded"] = await unload.execute({"label": "skills", "key": "code-review"})
    r["loadedKeysAfterUnload"] = await s.get_loaded_skill_keys()
    return r


LOADED_KEYS = ("loadedKeysAfterLoad", "loadedKeysAfterUnload")


def expected(key: str) -> Any:
    golden = GOLDEN[key]
    if key in LOADED_KEYS:
        assert len(set(golden)) == len(golden)
        return set(golden)
    if isinstance(golden, dict) and "ok" in golden:
        return without_error_name(golden)
    return golden


def test_search_queries_match_the_recorder() -> None:
    assert [json.dumps(q) for q in SEARCH_QUERIES] == list(GOLDEN["search"])


async def test_replay_records_every_key(store: SqliteStore, db_path: Path, tmp_path: Path) -> None:
    assert list(await replay(store, db_path, tmp_path)) == list(GOLDEN)


@pytest.mark.parametrize("key", [k for k in GOLDEN if k != "search"])
async def test_step(store: SqliteStore, db_path: Path, tmp_path: Path, key: str) -> None:
    ours = await replay(store, db_path, tmp_path)
    assert ours[key] == expected(key)


@pytest.mark.parametrize("query", SEARCH_QUERIES)
async def test_search_context(store: SqliteStore, db_path: Path, tmp_path: Path, query: str) -> None:
    ours = await replay(store, db_path, tmp_path)
    assert ours["search"][json.dumps(query)] == GOLDEN["search"][json.dumps(query)]


async def test_load_outside_the_folder_exists_on_disk(tmp_path: Path) -> None:
    """``../other/ignored`` is a real file next to the skills folder, yet not loadable."""
    p = await skills(tmp_path)
    assert (tmp_path / "skills" / ".." / "other" / "ignored").is_file()
    assert await p.load("../other/ignored") is None
