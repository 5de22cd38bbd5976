"""System prompts against the real original's outputs (``prompts.json``, ``prompt_freeze.json``).

``golden-exp.mjs::prompts()`` rendered 14 block configurations with ``freezeSystemPrompt()``
and recorded ``getContextBlocks()`` after each; then it recorded the cached-prompt
lifecycle (freeze, write, freeze again, stored rows, refresh, a woken session, and the same
without a cached prompt). Each is replayed against :class:`hub.Session`; prompts must match
to the character and the blocks field for field.

Mapping of the original's objects: the ``soul`` object → ``ReadonlyText("You are a helpful
assistant.")``, ``emptyReadonly`` → ``ReadonlyText(None)``, an ``AgentContextProvider``
pre-filled with ``set`` → the store row written first (default session: key = label) and
a store-backed block, ``AgentSearchProvider`` → ``StoreSearchProvider``, and the fake R2
bucket under ``skills/`` → a :class:`FileSkillProvider` folder (``other/ignored`` lies
outside it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub import (
    ContextBlock,
    FileSkillProvider,
    ReadonlyText,
    Session,
    SqliteStore,
    StoreSearchProvider,
)
from hub.context import SEPARATOR

FIXTURES = Path(__file__).parent.parent / "fixtures" / "golden"
GOLDEN: dict[str, Any] = json.loads((FIXTURES / "prompts.json").read_text(encoding="utf-8"))
FREEZE: dict[str, Any] = json.loads((FIXTURES / "prompt_freeze.json").read_text(encoding="utf-8"))
CASES: dict[str, dict[str, Any]] = {c["name"]: c for c in GOLDEN["cases"]}

SOUL_TEXT = "You are a helpful assistant."


def soul() -> ReadonlyText:
    return ReadonlyText(SOUL_TEXT)


def empty_readonly() -> ReadonlyText:
    return ReadonlyText(None)


def block_dict(block: ContextBlock) -> dict[str, Any]:
    """Our block in the original's ``getContextBlocks()`` shape (camelCase, no
    ``description`` / ``maxTokens`` when unset)."""
    raw: dict[str, Any] = msgspec.to_builtins(block)
    renames = {"max_tokens": "maxTokens", "is_skill": "isSkill", "is_searchable": "isSearchable"}
    out = {renames.get(k, k): v for k, v in raw.items()}
    for key in ("description", "maxTokens"):
        if out.get(key) is None:
            out.pop(key, None)
    return out


async def knowledge(store: SqliteStore) -> StoreSearchProvider:
    """The recorder's ``knowledge()``: a searchable provider pre-filled through its own set."""
    p = StoreSearchProvider(store)
    p.init("knowledge")
    await p.set("deploy-guide", "Deployments use blue/green rollouts.")
    await p.set("oncall", "Pager rotation is weekly.")
    return p


async def skill_folder(tmp_path: Path) -> Path:
    """The recorder's ``skillBucket()`` as a folder; ``other/ignored`` is outside it."""
    directory = tmp_path / "skills"
    p = FileSkillProvider(directory)
    await p.set(
        "code-review", "# Code review\nCheck tests first, then naming.", "How to review a pull request"
    )
    await p.set("debugging", "# Debugging\nReproduce, bisect, fix.")
    await FileSkillProvider(tmp_path / "other").set("ignored", "not a skill", "outside prefix")
    return directory


Builder = Callable[[SqliteStore, Path], Awaitable[Session]]


async def readonly_soul(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("soul", provider=soul())


async def readonly_soul_with_description(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("soul", description="Who you are", provider=soul())


async def empty_readonly_is_skipped(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("empty", provider=empty_readonly())


async def empty_writable_autowired(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("memory")


async def empty_writable_with_desc_and_max(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("memory", description="Learned facts", max_tokens=1100)


async def writable_memory_with_content(store: SqliteStore, tmp_path: Path) -> Session:
    await store.set_context_value("memory", "User prefers TypeScript.\nUser deploys on Fridays.")
    return (
        Session(store)
        .with_context("soul", provider=soul())
        .with_context("memory", description="Learned facts", max_tokens=1100)
    )


async def percentage_rounding(store: SqliteStore, tmp_path: Path) -> Session:
    # 7 tokens of 9 -> 77.8 -> 78%
    await store.set_context_value("memory", "one two three four five")
    return Session(store).with_context("memory", max_tokens=9)


async def over_budget_content_renders_over_100_percent(store: SqliteStore, tmp_path: Path) -> Session:
    # stored directly: set_context would refuse it
    await store.set_context_value("memory", "x" * 100)
    return Session(store).with_context("memory", max_tokens=10)


async def searchable_with_entries(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("knowledge", description="Team wiki", provider=await knowledge(store))


async def searchable_empty(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("knowledge", provider=StoreSearchProvider(store))


async def skill_provider_r2_fake_bucket(store: SqliteStore, tmp_path: Path) -> Session:
    provider = FileSkillProvider(await skill_folder(tmp_path))
    return Session(store).with_context("skills", description="Playbooks", provider=provider)


async def skill_provider_empty(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("skills", provider=FileSkillProvider(tmp_path / "no-skills"))


async def all_kinds_in_declaration_order(store: SqliteStore, tmp_path: Path) -> Session:
    await store.set_context_value("memory", "Likes tea.")
    return (
        Session(store)
        .with_context("soul", provider=soul())
        .with_context("empty", provider=empty_readonly())
        .with_context("memory", description="Learned facts", max_tokens=1100)
        .with_context("scratch")
        .with_context("knowledge", description="Team wiki", provider=await knowledge(store))
        .with_context("skills", provider=FileSkillProvider(await skill_folder(tmp_path)))
    )


async def no_blocks(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store)


BUILDERS: dict[str, Builder] = {
    f.__name__: f
    for f in (
        readonly_soul,
        readonly_soul_with_description,
        empty_readonly_is_skipped,
        empty_writable_autowired,
        empty_writable_with_desc_and_max,
        writable_memory_with_content,
        percentage_rounding,
        over_budget_content_renders_over_100_percent,
        searchable_with_entries,
        searchable_empty,
        skill_provider_r2_fake_bucket,
        skill_provider_empty,
        all_kinds_in_declaration_order,
        no_blocks,
    )
}


def test_every_recorded_case_is_replayed() -> None:
    assert list(BUILDERS) == list(CASES)
    assert len(CASES) == 14


def test_separator() -> None:
    assert SEPARATOR == GOLDEN["separator"] == "═" * 46
    assert GOLDEN["separatorCodepoint"] == "U+2550 x46"
    assert {ord(c) for c in SEPARATOR} == {0x2550}


@pytest.mark.parametrize("name", list(CASES))
async def test_prompt(store: SqliteStore, tmp_path: Path, name: str) -> None:
    golden = CASES[name]
    s = await BUILDERS[name](store, tmp_path)
    prompt = await s.freeze_system_prompt()
    assert prompt == golden["prompt"]
    if "promptLines" in golden:
        assert prompt.split("\n") == golden["promptLines"]


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if "contextBlocks" in c])
async def test_context_blocks(store: SqliteStore, tmp_path: Path, name: str) -> None:
    golden = CASES[name]
    s = await BUILDERS[name](store, tmp_path)
    await s.freeze_system_prompt()
    assert [block_dict(b) for b in await s.get_context_blocks()] == golden["contextBlocks"]


async def test_no_blocks_has_no_context_blocks(store: SqliteStore, tmp_path: Path) -> None:
    """The recorder did not record blocks for ``no_blocks``; there are none."""
    assert "contextBlocks" not in CASES["no_blocks"]
    s = await no_blocks(store, tmp_path)
    assert await s.freeze_system_prompt() == ""
    assert await s.get_context_blocks() == []


# -- the frozen / cached prompt lifecycle (prompt_freeze.json) -------------------------------


def cached(store: SqliteStore) -> Session:
    return (
        Session(store)
        .with_context("soul", provider=soul())
        .with_context("memory", description="Learned facts", max_tokens=100)
        .with_cached_prompt()
    )


async def test_prompt_freeze_lifecycle(store: SqliteStore) -> None:
    s = cached(store)
    p1 = await s.freeze_system_prompt()
    assert p1 == FREEZE["firstFreeze"]

    set_context = {t.name: t for t in await s.tools()}["set_context"]
    written = await set_context.execute({"label": "memory", "content": "User is Ada."})
    assert written == FREEZE["setContextResult"]

    p2 = await s.freeze_system_prompt()
    assert p2 == FREEZE["freezeAfterWrite_unchanged"]
    assert (p1 == p2) is FREEZE["equal_p1_p2"] is True

    # The original dumped cf_agents_context_blocks; ours are rows keyed the same way.
    assert FREEZE["promptStoreKey"].startswith("_system_prompt")
    stored = {row["label"]: row["content"] for row in FREEZE["storedRows"]}
    assert list(stored) == ["_system_prompt", "memory"]
    for key, content in stored.items():
        assert await store.get_context_value(key) == content, key

    p3 = await s.refresh_system_prompt()
    assert p3 == FREEZE["refreshAfterWrite"]

    woken = cached(store)  # a new Session over the same storage
    p4 = await woken.freeze_system_prompt()
    assert p4 == FREEZE["newSessionSameStorage_freeze"]
    assert (p3 == p4) is FREEZE["equal_p3_p4"] is True


async def test_prompt_freeze_without_cached_prompt(store: SqliteStore) -> None:
    # The recorder ran this on the storage left by the lifecycle above (memory = "User is Ada.").
    await store.set_context_value("memory", "User is Ada.")
    golden = FREEZE["withoutCachedPrompt"]
    nc = Session(store).with_context("soul", provider=soul()).with_context("memory", max_tokens=100)
    first = await nc.freeze_system_prompt()
    assert first == golden["first"]
    await nc.replace_context_block("memory", "changed")
    after = await nc.freeze_system_prompt()
    assert after == golden["afterReplace"]
    assert (first == after) is golden["unchanged"] is True
    assert await store.get_context_value("memory") == "changed"
