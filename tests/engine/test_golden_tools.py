"""Context tools against the real original's outputs (``tools.json``).

``golden-exp.mjs::toolsGolden()`` built 8 block combinations and recorded, per tool, its
description and the JSON Schema the AI SDK v6 sends (``asSchema(inputSchema).jsonSchema``).
Ours must give the same tools in the same order (the golden is a name → tool dict; ours a
list), the same descriptions to the character, and ``input_schema`` equal to that schema
minus its ``"$schema"`` key.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hub import FileSkillProvider, ReadonlyText, Session, SqliteStore, StoreSearchProvider, Tool

GOLDEN: dict[str, dict[str, dict[str, Any]]] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "tools.json").read_text(encoding="utf-8")
)


def soul() -> ReadonlyText:
    return ReadonlyText("You are a helpful assistant.")


async def skills(tmp_path: Path) -> FileSkillProvider:
    """The recorder's ``R2SkillProvider(skillBucket(), {prefix: "skills/"})`` as a folder."""
    p = FileSkillProvider(tmp_path / "skills")
    await p.set(
        "code-review", "# Code review\nCheck tests first, then naming.", "How to review a pull request"
    )
    await p.set("debugging", "# Debugging\nReproduce, bisect, fix.")
    await FileSkillProvider(tmp_path / "other").set("ignored", "not a skill", "outside prefix")
    return p


class GetLoadOnly:
    """A skill provider without ``set``: ``{get, load}`` in the recorder."""

    async def get(self) -> str:
        return "- a: first"

    async def load(self, key: str) -> str | None:
        return "A body" if key == "a" else None


Builder = Callable[[SqliteStore, Path], Awaitable[Session]]


async def readonly_only(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("soul", provider=soul())


async def writable_memory(store: SqliteStore, tmp_path: Path) -> Session:
    return (
        Session(store)
        .with_context("soul", provider=soul())
        .with_context("memory", description="Learned facts", max_tokens=1100)
    )


async def two_writable_one_without_description(store: SqliteStore, tmp_path: Path) -> Session:
    return (
        Session(store)
        .with_context("memory", description="Learned facts", max_tokens=1100)
        .with_context("scratch")
    )


async def searchable_only(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context(
        "knowledge", description="Team wiki", provider=StoreSearchProvider(store)
    )


async def writable_plus_searchable(store: SqliteStore, tmp_path: Path) -> Session:
    return (
        Session(store)
        .with_context("memory", description="Learned facts")
        .with_context("knowledge", description="Team wiki", provider=StoreSearchProvider(store))
    )


async def skills_only_readonly_bucket_provider_has_set(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("skills", description="Playbooks", provider=await skills(tmp_path))


async def skills_without_set(store: SqliteStore, tmp_path: Path) -> Session:
    return Session(store).with_context("skills", provider=GetLoadOnly())


async def all_blocks(store: SqliteStore, tmp_path: Path) -> Session:
    return (
        Session(store)
        .with_context("soul", provider=soul())
        .with_context("memory", description="Learned facts", max_tokens=1100)
        .with_context("knowledge", description="Team wiki", provider=StoreSearchProvider(store))
        .with_context("skills", description="Playbooks", provider=await skills(tmp_path))
    )


BUILDERS: dict[str, Builder] = {
    "readonly_only": readonly_only,
    "writable_memory": writable_memory,
    "two_writable_one_without_description": two_writable_one_without_description,
    "searchable_only": searchable_only,
    "writable_plus_searchable": writable_plus_searchable,
    "skills_only_readonly_bucket_provider_has_set": skills_only_readonly_bucket_provider_has_set,
    "skills_without_set": skills_without_set,
    "all": all_blocks,
}

TOOL_CASES = [(combo, name) for combo, tools in GOLDEN.items() for name in tools]


def aisdk_schema(golden_tool: dict[str, Any]) -> dict[str, Any]:
    schema = dict(golden_tool["inputSchema_aisdk_v6_asSchema"])
    assert schema.pop("$schema") == "http://json-schema.org/draft-07/schema#"
    return schema


async def tools_of(combo: str, store: SqliteStore, tmp_path: Path) -> list[Tool]:
    return await (await BUILDERS[combo](store, tmp_path)).tools()


def test_every_recorded_combination_is_replayed() -> None:
    assert list(BUILDERS) == list(GOLDEN)
    assert len(GOLDEN) == 8


@pytest.mark.parametrize("combo", list(GOLDEN))
async def test_tool_names_and_order(store: SqliteStore, tmp_path: Path, combo: str) -> None:
    tools = await tools_of(combo, store, tmp_path)
    assert [t.name for t in tools] == list(GOLDEN[combo])


@pytest.mark.parametrize(("combo", "name"), TOOL_CASES)
async def test_tool_description(store: SqliteStore, tmp_path: Path, combo: str, name: str) -> None:
    tools = {t.name: t for t in await tools_of(combo, store, tmp_path)}
    assert tools[name].description == GOLDEN[combo][name]["description"]


@pytest.mark.parametrize(("combo", "name"), TOOL_CASES)
async def test_tool_input_schema(store: SqliteStore, tmp_path: Path, combo: str, name: str) -> None:
    tools = {t.name: t for t in await tools_of(combo, store, tmp_path)}
    assert tools[name].input_schema == aisdk_schema(GOLDEN[combo][name])


@pytest.mark.parametrize(("combo", "name"), TOOL_CASES)
def test_zod_and_aisdk_schemas_agree(combo: str, name: str) -> None:
    """The two recorded renderings differ only by their ``$schema`` dialect."""
    golden = GOLDEN[combo][name]
    zod = dict(golden["inputSchema_zod_toJSONSchema"])
    assert zod.pop("$schema") == "https://json-schema.org/draft/2020-12/schema"
    assert zod == aisdk_schema(golden)
    assert golden["toolObjectKeys"] == ["description", "inputSchema", "execute"]


async def test_readonly_only_has_no_tools(store: SqliteStore, tmp_path: Path) -> None:
    assert GOLDEN["readonly_only"] == {}
    assert await tools_of("readonly_only", store, tmp_path) == []
