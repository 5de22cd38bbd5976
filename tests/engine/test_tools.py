"""Tools in vendor formats, and `dispatch` as an agent loop uses it (design §4)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import ReadonlyText, Session, SqliteStore, StoreSearchProvider
from hub.tools import Tool, dispatch, to_anthropic, to_openai

SET_CONTEXT_DESCRIPTION = (
    "Write to a context block. Available blocks:\n"
    '- "memory" (writable): Learned facts\n'
    '- "skills" (skill collection, keyed entries): Playbooks\n'
    '- "knowledge" (searchable, keyed entries): Team wiki\n\n'
    "Writes are durable and persist across sessions.\n\n"
    "For keyed blocks (skill collections / searchable), pass `metadata: { title, description }` "
    "— title stabilises updates, description helps the model pick entries. Metadata is optional; "
    "short content rarely needs it, long loadable entries benefit most."
)


class Skills:
    """An in-memory skill collection (sync methods)."""

    def __init__(self) -> None:
        self.docs: dict[str, tuple[str, str | None]] = {"pirate": ("Arr, matey.", "Talk like a pirate")}

    def get(self) -> str | None:
        lines = [f"- {k}: {d}" if d else f"- {k}" for k, (_, d) in self.docs.items()]
        return "\n".join(lines) or None

    def load(self, key: str) -> str | None:
        doc = self.docs.get(key)
        return None if doc is None else doc[0]

    def set(self, key: str, content: str, description: str | None = None) -> None:
        self.docs[key] = (content, description)


def build(store: SqliteStore, session_id: str = "t1") -> Session:
    return (
        Session(store)
        .for_session(session_id)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", description="Learned facts", max_tokens=100)
        .with_context("skills", description="Playbooks", provider=Skills())
        .with_context("knowledge", description="Team wiki", provider=StoreSearchProvider(store))
    )


NAMES = ["set_context", "load_context", "unload_context", "search_context"]


# -- vendor formats ------------------------------------------------------------------------


async def test_to_openai_shape(store: SqliteStore) -> None:
    tools = await build(store).tools()
    rendered = to_openai(tools)
    assert [entry["function"]["name"] for entry in rendered] == NAMES
    for tool, entry in zip(tools, rendered, strict=True):
        assert set(entry) == {"type", "function"} and entry["type"] == "function"
        assert set(entry["function"]) == {"name", "description", "parameters"}
        assert entry["function"]["description"] == tool.description
        assert entry["function"]["parameters"] == tool.input_schema
        assert entry["function"]["parameters"]["type"] == "object"
        assert "$schema" not in entry["function"]["parameters"]
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", entry["function"]["name"])
    assert json.loads(json.dumps(rendered)) == rendered
    set_context = rendered[0]["function"]
    assert set_context["description"] == SET_CONTEXT_DESCRIPTION
    params = set_context["parameters"]
    assert params["required"] == ["label", "content"]
    assert params["properties"]["label"] == {
        "type": "string",
        "enum": ["memory", "skills", "knowledge"],
        "description": "Block label to write to",
    }
    assert params["properties"]["action"]["enum"] == ["replace", "append"]
    assert set(params["properties"]["metadata"]["properties"]) == {"title", "description"}


async def test_to_anthropic_shape(store: SqliteStore) -> None:
    tools = await build(store).tools()
    rendered = to_anthropic(tools)
    assert [entry["name"] for entry in rendered] == NAMES
    for tool, entry in zip(tools, rendered, strict=True):
        assert entry == {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }
        assert entry["input_schema"]["type"] == "object"
    assert json.loads(json.dumps(rendered)) == rendered
    by_name = {e["name"]: e for e in rendered}
    assert by_name["search_context"]["description"] == (
        "Search for information in a searchable context block. "
        'ONLY these blocks are searchable: "knowledge". Other blocks cannot be searched.'
    )
    assert by_name["search_context"]["input_schema"]["required"] == ["label", "query"]
    assert by_name["load_context"]["input_schema"]["required"] == ["label", "key"]


async def test_no_tools_render_as_empty_lists(store: SqliteStore) -> None:
    tools = await Session(store).with_context("soul", provider=ReadonlyText("x")).tools()
    assert tools == []
    assert to_openai(tools) == [] and to_anthropic(tools) == []


# -- dispatch ------------------------------------------------------------------------------


async def test_dispatch_raw_json_string(store: SqliteStore) -> None:
    tools = await build(store).tools()
    result = await dispatch(tools, "set_context", '{"label": "memory", "content": "User likes tea."}')
    assert result == "Written to memory. Usage: 4% (4/100 tokens)"
    assert await store.get_context_value("memory_t1") == "User likes tea."


@pytest.mark.parametrize(
    "arguments",
    [
        {"label": "memory", "content": "User likes tea."},
        MappingProxyType({"label": "memory", "content": "User likes tea."}),
    ],
)
async def test_dispatch_decoded_arguments(store: SqliteStore, arguments: Mapping[str, Any]) -> None:
    tools = await build(store).tools()
    assert await dispatch(tools, "set_context", arguments) == "Written to memory. Usage: 4% (4/100 tokens)"
    assert await store.get_context_value("memory_t1") == "User likes tea."


@pytest.mark.parametrize("raw", ['{"label": "memory", "content": ', "{label: memory}", "{'a': 1}", "nan("])
async def test_dispatch_invalid_json(store: SqliteStore, raw: str) -> None:
    tools = await build(store).tools()
    result = await dispatch(tools, "set_context", raw)
    assert result.startswith("Error: ") and "JSON" in result
    assert await store.get_context_value("memory_t1") is None


@pytest.mark.parametrize("raw", ["[1, 2]", '"memory"', "42", "true", "null"])
async def test_dispatch_non_object_json(store: SqliteStore, raw: str) -> None:
    tools = await build(store).tools()
    result = await dispatch(tools, "set_context", raw)
    assert result.startswith("Error: ")
    assert await store.get_context_value("memory_t1") is None


@pytest.mark.parametrize("arguments", [None, "", {}])
async def test_dispatch_without_arguments(store: SqliteStore, arguments: Any) -> None:
    tools = await build(store).tools()
    assert await dispatch(tools, "set_context", arguments) == 'Error: missing required argument "label"'


async def test_dispatch_unknown_tool(store: SqliteStore) -> None:
    tools = await build(store).tools()
    assert await dispatch(tools, "nope", "{}") == (
        'Error: unknown tool "nope". '
        "Available tools: set_context, load_context, unload_context, search_context"
    )
    assert await dispatch([], "nope", {}) == 'Error: unknown tool "nope". Available tools: none'


@pytest.mark.parametrize(
    ("name", "arguments", "missing"),
    [
        ("set_context", {"label": "memory"}, "content"),
        ("set_context", {"content": "x"}, "label"),
        ("set_context", {"label": None, "content": "x"}, "label"),
        ("load_context", {"label": "skills"}, "key"),
        ("unload_context", {"key": "pirate"}, "label"),
        ("search_context", {"label": "knowledge"}, "query"),
    ],
)
async def test_dispatch_missing_required(
    store: SqliteStore, name: str, arguments: dict[str, Any], missing: str
) -> None:
    tools = await build(store).tools()
    assert await dispatch(tools, name, arguments) == f'Error: missing required argument "{missing}"'


@pytest.mark.parametrize(
    ("name", "arguments", "field"),
    [
        ("set_context", {"label": "memory", "content": 5}, "content"),
        ("set_context", {"label": ["memory"], "content": "x"}, "label"),
        ("set_context", {"label": "memory", "content": "x", "action": 1}, "action"),
        ("set_context", {"label": "knowledge", "content": "x", "metadata": "title"}, "metadata"),
        ("load_context", {"label": "skills", "key": {"k": 1}}, "key"),
        ("search_context", {"label": "knowledge", "query": ["a"]}, "query"),
    ],
)
async def test_dispatch_wrong_types(
    store: SqliteStore, name: str, arguments: dict[str, Any], field: str
) -> None:
    tools = await build(store).tools()
    result = await dispatch(tools, name, json.dumps(arguments))
    assert result.startswith("Error: ") and f'"{field}"' in result
    assert await store.get_context_value("memory_t1") is None


async def test_dispatch_ignores_extra_keys(store: SqliteStore) -> None:
    tools = await build(store).tools()
    arguments = {"label": "memory", "content": "User likes tea.", "key": "zzz", "extra": [1, {"x": None}]}
    assert await dispatch(tools, "set_context", arguments) == "Written to memory. Usage: 4% (4/100 tokens)"
    assert (
        await dispatch(tools, "load_context", {"label": "skills", "key": "pirate", "x": 1}) == "Arr, matey."
    )


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
argument_keys = st.sampled_from(["label", "content", "action", "metadata", "key", "query"]) | st.text(
    max_size=8
)
label_values = st.sampled_from(["memory", "soul", "skills", "knowledge", "nope", ""])
arguments = st.dictionaries(argument_keys, label_values | json_values, max_size=5)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.sampled_from([*NAMES, "unknown"]), arguments | json_values, st.booleans())
async def test_execute_never_raises(store: SqliteStore, name: str, args: Any, as_string: bool) -> None:
    tools = await build(store, "fuzz").tools()
    payload: Any = json.dumps(args) if as_string else args
    result = await dispatch(tools, name, payload)
    assert isinstance(result, str)
    if isinstance(args, Mapping) and name != "unknown":
        tool = next(t for t in tools if t.name == name)
        assert isinstance(await tool.execute(args), str)


async def test_execute_rejects_non_mapping_without_raising(store: SqliteStore) -> None:
    tool: Tool = (await build(store).tools())[0]
    bad: Any = ["label", "memory"]
    result = await tool.execute(bad)
    assert result.startswith("Error: ")


# -- agent loops -----------------------------------------------------------------------------


def openai_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


async def test_openai_then_anthropic_agent_loop(store: SqliteStore) -> None:
    session = build(store, "loop")
    prompt = await session.freeze_system_prompt()
    tools = await session.tools()
    request: dict[str, Any] = {
        "model": "any",
        "tools": to_openai(tools),
        "messages": [{"role": "system", "content": prompt}],
    }
    declared = {t["function"]["name"] for t in request["tools"]}

    # What openai's `choices[0].message.model_dump()` looks like for a tool-calling turn.
    assistant: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            openai_call("call_1", "set_context", {"label": "memory", "content": "User likes tea."}),
            openai_call(
                "call_2",
                "set_context",
                {
                    "label": "knowledge",
                    "content": "Rollbacks take 2 minutes.",
                    "metadata": {"title": "Rollback policy"},
                },
            ),
            openai_call("call_3", "search_context", {"label": "knowledge", "query": "rollback"}),
            openai_call("call_4", "load_context", '{"label":"skills","key":"pirate"}'),
            openai_call("call_5", "set_context", {"label": "soul", "content": "Be rude."}),
            openai_call("call_6", "set_context", '{"label": "memory", "content": '),
            openai_call("call_7", "delete_everything", {}),
        ],
    }
    tool_messages = []
    for call in assistant["tool_calls"]:
        result = await dispatch(tools, call["function"]["name"], call["function"]["arguments"])
        tool_messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    results = [m["content"] for m in tool_messages]
    assert results[:5] == [
        "Written to memory. Usage: 4% (4/100 tokens)",
        'Indexed "rollback-policy" in knowledge.',
        "[rollback-policy]\nRollbacks take 2 minutes.",
        "Arr, matey.",
        'Error: Block "soul" is readonly',
    ]
    assert results[5].startswith("Error: ") and results[6].startswith(
        'Error: unknown tool "delete_everything"'
    )
    assert "delete_everything" not in declared
    json.dumps([*request["messages"], assistant, *tool_messages])  # ready for the next request

    # The frozen prompt did not move; the writes are stored.
    assert await session.freeze_system_prompt() == prompt
    assert await store.get_context_value("memory_loop") == "User likes tea."
    assert await session.get_loaded_skill_keys() == {"skills:pirate"}

    # Record the turn the way the AI SDK would, then continue with Anthropic-style blocks.
    await session.append_message({"id": "u1", "role": "user", "parts": [{"type": "text", "text": "Talk!"}]})
    await session.append_message(
        {
            "id": "a1",
            "role": "assistant",
            "parts": [
                {
                    "type": "dynamic-tool",
                    "toolName": call["function"]["name"],
                    "toolCallId": call["id"],
                    "state": "output-available",
                    "input": json.loads(call["function"]["arguments"]),
                    "output": result,
                }
                for call, result in zip(assistant["tool_calls"][:5], results, strict=False)
            ],
        }
    )
    content_blocks: list[dict[str, Any]] = [
        {"type": "text", "text": "Done with the pirate voice."},
        {
            "type": "tool_use",
            "id": "toolu_01",
            "name": "unload_context",
            "input": {"label": "skills", "key": "pirate"},
        },
        {
            "type": "tool_use",
            "id": "toolu_02",
            "name": "search_context",
            "input": {"label": "knowledge", "query": "nothing-here"},
        },
        {
            "type": "tool_use",
            "id": "toolu_03",
            "name": "load_context",
            "input": {"label": "memory", "key": "x"},
        },
    ]
    tool_results = []
    for block in content_blocks:
        if block["type"] != "tool_use":
            continue
        result = await dispatch(await session.tools(), block["name"], block["input"])
        tool_results.append(
            {
                "type": "tool_result",
                "tool_use_id": block["id"],
                "content": result,
                "is_error": result.startswith("Error:"),
            }
        )
    assert [(r["content"], r["is_error"]) for r in tool_results] == [
        ('Unloaded "pirate" from skills. Context reclaimed.', False),
        ("No results found.", False),
        ('Error: "memory" is not a skill block. Skill blocks: skills', True),
    ]
    assert await session.get_loaded_skill_keys() == set()
    # Unloading reclaimed the recorded load in the history.
    recorded = await session.get_message("a1")
    assert recorded is not None
    outputs = {p["toolCallId"]: p["output"] for p in recorded.parts}
    assert outputs["call_4"] == "[skill unloaded: pirate]"
    assert [outputs[f"call_{i}"] for i in (1, 2, 3, 5)] == [results[i] for i in (0, 1, 2, 4)]

    # A refresh shows what the tools wrote.
    refreshed = await session.refresh_system_prompt()
    assert "User likes tea." in refreshed and "1 entries indexed." in refreshed
