"""HubMessageHistory: a real ``pydantic_ai.Agent`` (offline ``FunctionModel`` / ``TestModel``,
tool calls included) keeps its history in the hub: across two worker processes over a real
``sessionhub serve``, watched live by a subscriber; in process over a SQLite file; and the
messages read back dump (``ModelMessagesTypeAdapter``) exactly as they were saved."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, BinaryContent, ImageUrl, ModelRetry, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserContent,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from clients import HubClient, HubError
from clients.operator import describe
from clients.pydantic_ai import METADATA_KEY, HubMessageHistory
from hub import SessionManager, SqliteStore, Store
from hub.auth import issue_token
from hub.server.config import HubConfig
from protocol import Event, Forbidden, InvalidInput, SessionNotFound
from tests.clients.pydantic_ai_worker import get_weather, weather_model
from tests.support.frameworks import add_as_other_writers, import_without
from tests.support.hubtest import served
from tests.support.nodes import Node

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pydantic-ai-test-secret-of-32-bytes-or-more"


def dump(messages: list[ModelMessage]) -> bytes:
    return ModelMessagesTypeAdapter.dump_json(messages)


def agent(history: HubMessageHistory | None = None) -> Agent[None, str]:
    capabilities = [history.capability()] if history is not None else []
    return Agent(FunctionModel(weather_model), tools=[get_weather], capabilities=capabilities)


def worker(url: str, token: str, session_id: str, prompt: str) -> bytes:
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-m",
            "tests.clients.pydantic_ai_worker",
            url,
            token,
            session_id,
            prompt,
        ],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


def tool_step(parts: list[dict[str, Any]]) -> dict[str, Any]:
    (tool,) = [p for p in parts if p["type"] == "tool-get_weather"]
    return tool


# -- two processes over a real hub ---------------------------------------------------------


async def test_two_worker_processes_share_the_history_and_a_subscriber_watches(tmp_path: Path) -> None:
    admin = issue_token(SECRET, {"*": "admin"})
    node = Node(str(tmp_path / "hub.db"), None, None, "--auth-secret", SECRET)
    async with node, HubClient(node.ws_url, token=admin) as hub:
        session = await HubMessageHistory.create(hub, "pydantic ai")
        # Each worker holds a token for this one session.
        token = issue_token(SECRET, {session.session_id: "write"})
        seen: list[Event] = []

        async def watch() -> None:
            async for event in hub.subscribe(session.session_id, after_seq=0):
                seen.append(event)
                if sum(e.type == "message.appended" for e in seen) == 6:
                    return

        watcher = asyncio.create_task(watch())
        first = await asyncio.to_thread(worker, node.ws_url, token, session.session_id, "Weather in Paris?")
        second = await asyncio.to_thread(worker, node.ws_url, token, session.session_id, "And before?")
        async with asyncio.timeout(10):
            await watcher

        # The second process saw the first one's turn, and the hub holds both, losslessly.
        messages = ModelMessagesTypeAdapter.validate_json(second)
        assert messages[-1].parts[0].content == "Seen: Weather in Paris? | And before?"  # type: ignore[union-attr]
        assert dump(messages[: len(ModelMessagesTypeAdapter.validate_json(first))]) == first
        assert dump(await session.load()) == second

        # Each turn is three hub messages: the prompt, the tool step (call and result in one
        # tool part), the answer; the subscriber saw them appear, and the result land.
        appended = [e.data["message"] for e in seen if e.type == "message.appended"]
        assert [m["role"] for m in appended] == ["user", "assistant", "assistant"] * 2
        assert appended[0]["parts"] == [{"type": "text", "text": "Weather in Paris?"}]
        assert [p["type"] for p in appended[1]["parts"]] == ["reasoning", "tool-get_weather"]
        assert tool_step(appended[1]["parts"])["state"] == "input-available"
        assert appended[2]["parts"] == [{"type": "text", "text": "Seen: Weather in Paris?"}]
        updated = [e.data["message"] for e in seen if e.type == "message.updated"]
        assert len(updated) == 2
        assert tool_step(updated[0]["parts"])["output"] == "Sunny in Paris"
        assert tool_step(updated[0]["parts"])["state"] == "output-available"
        # What `sessionhub tail` prints for them: readable lines.
        lines = [describe(e) for e in seen if e.type == "message.appended"]
        assert '(user): "Weather in Paris?"' in lines[0]
        assert lines[1].endswith("+reasoning,tool-get_weather ← " + appended[0]["id"])
        # Searchable like any session.
        found = await hub.sessions.search("Paris")
        assert session.session_id in {r.session_id for r in found}


async def test_a_read_only_token_cannot_save_and_nothing_is_written(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as server:
        writer = issue_token(SECRET, {"*": "admin"})
        async with HubClient(server.ws_url, token=writer) as hub:
            history = await HubMessageHistory.create(hub, "read only")
            result = await agent().run("Weather in Paris?")
            assert await history.save(result.new_messages()) == 4
        reader = issue_token(SECRET, {history.session_id: "read"})
        async with HubClient(server.ws_url, token=reader) as hub:
            readonly = HubMessageHistory(hub, history.session_id)
            assert dump(await readonly.load()) == dump(result.all_messages())
            more = await agent().run("again", message_history=result.all_messages())
            with pytest.raises(HubError) as refused:
                await readonly.save(more.all_messages())
            assert refused.value.code == Forbidden.code == "forbidden"
            assert dump(await readonly.load()) == dump(result.all_messages())
            assert len(await hub.sessions.get_history(history.session_id)) == 3


# -- in process ------------------------------------------------------------------------------


async def test_in_process_on_a_sqlite_file_round_trips_and_resaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    async with await SqliteStore.open(path) as store:
        manager = SessionManager(store)
        history = await HubMessageHistory.create(manager, "in process")
        first = await agent(history).run("Weather in Paris?", message_history=await history.load())
        second = await agent(history).run("And before?", message_history=await history.load())
        assert dump(await history.load()) == dump(second.all_messages())
        events = len(await manager.get_session(history.session_id).read_events())
        # Saving what it holds again writes nothing: all_messages(), new_messages(), an older run.
        for again in (second.all_messages(), second.new_messages(), first.new_messages()):
            assert await history.save(again) == 0
        assert len(await manager.get_session(history.session_id).read_events()) == events
        stored = await manager.get_history(history.session_id)
        assert [m.role for m in stored] == ["user", "assistant", "assistant"] * 2
        metadata = stored[1].metadata
        assert isinstance(metadata, dict)
        assert [m["kind"] for m in metadata[METADATA_KEY]["messages"]] == ["response", "request"]
    # Another process opening the same file reads the same history.
    async with await SqliteStore.open(path) as store:
        reopened = HubMessageHistory(SessionManager(store), history.session_id)
        assert dump(await reopened.load()) == dump(second.all_messages())


async def test_every_store_and_the_test_model(store: Store) -> None:
    manager = SessionManager(store)
    history = await HubMessageHistory.create(manager, "test model")
    model_agent = Agent(TestModel(), tools=[get_weather], instructions="Be brief.")
    result = await model_agent.run("Weather?", message_history=await history.load())
    assert await history.save(result.all_messages()) == 4
    assert dump(await history.load()) == dump(result.all_messages())
    stored = await manager.get_history(history.session_id)
    assert tool_step(stored[1].parts)["output"] == "Sunny in a"


async def test_messages_from_other_writers_and_summaries_load_as_prompts(store: Store) -> None:
    manager = SessionManager(store)
    history = await HubMessageHistory.create(manager, "mixed")
    await add_as_other_writers(manager, history.session_id)
    loaded = await history.load()
    assert [m.kind for m in loaded] == ["request", "response", "request"]
    assert isinstance(loaded[0], ModelRequest) and isinstance(loaded[0].parts[0], UserPromptPart)
    assert loaded[0].parts[0].content == "typed in the inspector"
    response = loaded[1]
    assert isinstance(response, ModelResponse)
    assert [(p.part_kind, getattr(p, "tool_name", None)) for p in response.parts] == [
        ("tool-call", "lookup"),
        ("text", None),
    ]
    assert loaded[2].parts[0].content == {"n": 2}  # type: ignore[union-attr]
    # A run given that history saves only its own messages (the loaded ones are held).
    result = await agent().run("Weather in Paris?", message_history=loaded)
    assert await history.save(result.all_messages()) == 4
    assert dump(await history.load()) == dump(result.all_messages())
    # A compacted range loads as one user prompt carrying the summary.
    stored = await manager.get_history(history.session_id)
    await manager.add_compaction(history.session_id, "Earlier: a lookup.", stored[0].id, stored[1].id)
    compacted = await history.load()
    assert isinstance(compacted[0], ModelRequest)
    assert compacted[0].parts[0].content == "Earlier: a lookup."  # type: ignore[union-attr]
    assert dump(compacted[1:]) == dump(result.new_messages())
    assert await history.save(result.all_messages()) == 0


async def test_bad_input_is_a_typed_error_and_writes_nothing(store: Store) -> None:
    manager = SessionManager(store)
    history = await HubMessageHistory.create(manager, "bad")
    with pytest.raises(InvalidInput, match="message 0 must be a ModelRequest or ModelResponse"):
        await history.save(["not a message"])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        await history.save({"kind": "request"})  # type: ignore[arg-type]
    assert await manager.get_history(history.session_id) == []
    with pytest.raises(InvalidInput, match="SessionManager or a connected"):
        HubMessageHistory(object(), history.session_id)
    with pytest.raises(InvalidInput):
        HubMessageHistory(manager, "")
    with pytest.raises(SessionNotFound):
        await HubMessageHistory(manager, "no-such-session").load()


def test_import_without_the_package_names_the_extra() -> None:
    done = import_without("pydantic_ai", "clients.pydantic_ai")
    assert done.returncode != 0
    assert 'pip install "sessionhub[pydantic-ai]"' in done.stderr


async def test_a_tool_retry_shows_as_an_error_then_the_answer(store: Store) -> None:
    manager = SessionManager(store)
    history = await HubMessageHistory.create(manager, "retry")
    tries: list[str] = []

    def flaky(city: str) -> str:
        """The weather in a city, once asked twice."""
        tries.append(city)
        if len(tries) == 1:
            raise ModelRetry("the weather service is busy, call again")
        return f"Rain in {city}"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        parts = [part for message in messages for part in message.parts]
        if any(isinstance(part, ToolReturnPart) and part.outcome == "success" for part in parts):
            return ModelResponse(parts=[TextPart("Rain, after a retry.")])
        return ModelResponse(
            parts=[ToolCallPart("flaky", {"city": "Oslo"}, tool_call_id=f"c{len(messages)}")]
        )

    flaky_agent = Agent(
        FunctionModel(model), tools=[Tool(flaky, max_retries=2)], capabilities=[history.capability()]
    )
    result = await flaky_agent.run("Weather in Oslo?", message_history=await history.load())
    assert dump(await history.load()) == dump(result.all_messages())
    stored = await manager.get_history(history.session_id)
    assert [m.role for m in stored] == ["user", "assistant", "assistant", "assistant"]
    failed, succeeded = (tool for m in stored[1:3] for tool in m.parts if tool["type"] == "tool-flaky")
    assert failed["state"] == "output-error" and "busy" in failed["errorText"]
    assert succeeded["state"] == "output-available" and succeeded["output"] == "Rain in Oslo"
    assert stored[3].parts == [{"type": "text", "text": "Rain, after a retry."}]


async def test_images_and_files_in_a_prompt_round_trip_and_are_named(store: Store) -> None:
    manager = SessionManager(store)
    history = await HubMessageHistory.create(manager, "files")
    prompt: list[UserContent] = [
        "Look:",
        BinaryContent(b"\x89PNG\r\n\x1a\n", media_type="image/png"),
        ImageUrl("https://example.com/a.png"),
    ]
    result = await Agent(TestModel()).run(prompt)
    await history.save(result.new_messages())
    assert dump(await history.load()) == dump(result.all_messages())
    (asked, _) = await manager.get_history(history.session_id)
    assert [p["type"] for p in asked.parts] == [
        "text",
        "data-pydantic-ai-binary",
        "data-pydantic-ai-image-url",
    ]
    assert asked.parts[1]["data"]["media_type"] == "image/png" and "data" not in asked.parts[1]["data"]
    assert asked.parts[2]["data"]["url"] == "https://example.com/a.png"
