"""HubAgentSession: the real openai-agents ``Runner`` with an offline model, over an in-process
SessionManager (SQLite file and Postgres) and over a real hub through HubClient; and the same
operations on the SDK's own ``SQLiteSession`` and on ``HubAgentSession`` agree."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, Runner, Usage, function_tool, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import Session, SQLiteSession
from agents.models.interface import Model
from agents.run_context import RunContextWrapper
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from clients import HubClient
from clients.openai_agents import METADATA_KEY, HubAgentSession
from hub import SessionManager, Store
from protocol import Conflict, InvalidInput, SessionNotFound
from tests.support.frameworks import add_as_other_writers, import_without
from tests.support.hubtest import served

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key that could reach OpenAI, no tracing exporter, and no outgoing connection at all:
    any ``socket.connect`` to a non-loopback address fails the test."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-offline-dummy")
    set_tracing_disabled(True)
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access attempted: {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


class OfflineModel(Model):
    """Returns the canned responses in order and records every input it was given."""

    def __init__(self, responses: list[ModelResponse]) -> None:
        self.responses = list(responses)
        self.inputs: list[list[dict[str, Any]]] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        given = [{"role": "user", "content": input}] if isinstance(input, str) else input
        self.inputs.append(json.loads(json.dumps(given)))
        return self.responses.pop(0)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        # The SDK's Model interface has both; every test here runs Runner.run (no streaming),
        # so reaching this is a wrong test, said as a failure rather than left as a stub.
        raise AssertionError("these tests run the SDK without streaming; Runner.run_streamed is not scripted")


def says(text: str, item_id: str) -> ModelResponse:
    message = ResponseOutputMessage(
        id=item_id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )
    return ModelResponse(
        output=[message], usage=Usage(1, 20, output_tokens=7, total_tokens=27), response_id=None
    )


def calls(*specs: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    output = [
        ResponseFunctionToolCall(
            id=f"fc_{call_id}", type="function_call", call_id=call_id, name=name, arguments=json.dumps(args)
        )
        for call_id, name, args in specs
    ]
    return ModelResponse(
        output=list(output), usage=Usage(1, 11, output_tokens=3, total_tokens=14), response_id=None
    )


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def two_runs(session: Any) -> OfflineModel:
    """Run 1 calls the tool and answers; run 2 asks about run 1."""
    model = OfflineModel(
        [
            calls(("call_1", "get_weather", {"city": "Paris"})),
            says("It is sunny in Paris.", "msg_1"),
            says("You asked about the weather in Paris.", "msg_2"),
        ]
    )
    agent = Agent(name="assistant", instructions="Be brief.", model=model, tools=[get_weather])
    first = await Runner.run(agent, "What is the weather in Paris?", session=session)
    assert first.final_output == "It is sunny in Paris."
    second = await Runner.run(agent, "What did I ask before?", session=session)
    assert second.final_output == "You asked about the weather in Paris."
    return model


def assert_saw_history(model: OfflineModel) -> None:
    last = model.inputs[-1]
    assert last[0] == {"role": "user", "content": "What is the weather in Paris?"}
    call = next(i for i in last if i.get("type") == "function_call")
    assert call["call_id"] == "call_1" and json.loads(call["arguments"]) == {"city": "Paris"}
    result = next(i for i in last if i.get("type") == "function_call_output")
    assert result == {"call_id": "call_1", "output": "Sunny in Paris", "type": "function_call_output"}
    assert any(i.get("id") == "msg_1" for i in last)
    assert last[-1] == {"role": "user", "content": "What did I ask before?"}


async def sdk_items(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    """What the SDK's own SQLite session stores for the same two runs."""
    reference = SQLiteSession("reference", tmp_path / f"{name}.sqlite")
    try:
        await two_runs(reference)
        return cast(list[dict[str, Any]], await reference.get_items())
    finally:
        reference.close()


# -- the Runner over an in-process SessionManager ------------------------------------------


async def test_runner_second_run_sees_first_run(store: Store, tmp_path: Path) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "agent chat")
    model = await two_runs(session)
    assert_saw_history(model)
    # The model saw exactly what the SDK's own session would have given it.
    expected = await sdk_items(tmp_path, "two-runs")
    items = await session.get_items()
    assert items == expected
    # In the hub: readable messages, the call and its output in one tool part.
    history = await manager.get_history(session.session_id)
    assert [m.role for m in history] == ["user", "assistant", "assistant", "user", "assistant"]
    assert history[0].parts == [{"type": "text", "text": "What is the weather in Paris?"}]
    assert history[1].parts == [
        {
            "type": "tool-get_weather",
            "toolCallId": "call_1",
            "state": "output-available",
            "input": {"city": "Paris"},
            "output": "Sunny in Paris",
        }
    ]
    assert history[2].parts == [{"type": "text", "text": "It is sunny in Paris."}]
    metadata = history[1].metadata
    assert isinstance(metadata, dict)
    assert [i["type"] for i in metadata[METADATA_KEY]["items"]] == [
        "function_call",
        "function_call_output",
    ]


async def test_usage_is_recorded(store: Store) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "usage")
    model = OfflineModel([says("hi", "msg_u")])
    result = await Runner.run(Agent(name="a", model=model), "hello", session=session)
    info = await session.add_usage(result.context_wrapper.usage, cost=0.001)
    assert (info.input_tokens, info.output_tokens) == (20, 7)
    assert info.estimated_cost == pytest.approx(0.001)


async def test_parallel_calls_share_one_message_and_keep_their_order(store: Store, tmp_path: Path) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "parallel")
    script = [
        calls(("c1", "get_weather", {"city": "Oslo"}), ("c2", "get_weather", {"city": "Rome"})),
        says("Oslo sunny, Rome sunny.", "msg_p"),
    ]
    result = await Runner.run(
        Agent(name="a", model=OfflineModel(script), tools=[get_weather]), "Oslo and Rome?", session=session
    )
    assert result.final_output == "Oslo sunny, Rome sunny."
    reference = SQLiteSession("ref", tmp_path / "parallel.sqlite")
    try:
        script = [
            calls(("c1", "get_weather", {"city": "Oslo"}), ("c2", "get_weather", {"city": "Rome"})),
            says("Oslo sunny, Rome sunny.", "msg_p"),
        ]
        await Runner.run(
            Agent(name="a", model=OfflineModel(script), tools=[get_weather]),
            "Oslo and Rome?",
            session=reference,
        )
        assert await session.get_items() == await reference.get_items()
    finally:
        reference.close()
    history = await manager.get_history(session.session_id)
    tool_message = history[1]
    assert [(p["toolCallId"], p["output"]) for p in tool_message.parts] == [
        ("c1", "Sunny in Oslo"),
        ("c2", "Sunny in Rome"),
    ]


async def test_compaction_returns_one_summary_item(store: Store) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "compacted")
    await two_runs(session)
    history = await manager.get_history(session.session_id)
    # Compact the first run (user question .. the answer): it comes back as one item.
    await manager.add_compaction(
        session.session_id, "The user asked about Paris weather: sunny.", history[0].id, history[2].id
    )
    items = await session.get_items()
    assert items[0] == {"role": "user", "content": "The user asked about Paris weather: sunny."}
    assert len(items) == 3 and items[1] == user("What did I ask before?")
    assert cast(dict[str, Any], items[2])["id"] == "msg_2"
    assert len(await session.get_items(limit=2)) == 2
    # The tail is not the summary: popping works; a summary at the tail cannot be popped.
    await session.pop_item()
    await session.pop_item()
    with pytest.raises(Conflict):
        await session.pop_item()


async def test_messages_from_other_writers_read_as_items(store: Store) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "mixed")
    await add_as_other_writers(manager, session.session_id)
    assert await session.get_items() == [
        {"role": "user", "content": "typed in the inspector"},
        {"type": "function_call", "call_id": "t9", "name": "lookup", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "t9", "output": '{"n": 2}'},
        {"role": "assistant", "content": "done"},
    ]


async def test_bad_input_is_a_typed_error_and_writes_nothing(store: Store) -> None:
    manager = SessionManager(store)
    session = await HubAgentSession.create(manager, "bad")
    with pytest.raises(InvalidInput, match="item 1 must be an object"):
        await session.add_items([user("ok"), "not an item"])  # type: ignore[list-item]
    assert await session.get_items() == []
    with pytest.raises(SessionNotFound):
        await HubAgentSession("no-such-session", sessions=manager).add_items([user("x")])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        HubAgentSession("", sessions=manager)


# -- parity with the SDK's SQLiteSession ---------------------------------------------------

SCRIPT: list[tuple[str, Any]] = [
    (
        "add",
        [
            user("one"),
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "two", "annotations": []}],
                "type": "message",
                "id": "m2",
                "status": "completed",
            },
        ],
    ),
    ("get", None),
    ("add", [{"type": "function_call", "call_id": "k1", "name": "f", "arguments": "{}", "id": "fc1"}]),
    ("add", [{"type": "function_call_output", "call_id": "k1", "output": "r1"}]),
    ("get", 2),
    ("add", [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]}]),
    (
        "add",
        [
            {"type": "function_call", "call_id": "k2", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "k3", "name": "g", "arguments": "not json"},
        ],
    ),
    (
        "add",
        [{"type": "function_call_output", "call_id": "k3", "output": [{"type": "input_text", "text": "r3"}]}],
    ),
    ("get", 3),
    ("pop", None),
    ("get", None),
    (
        "add",
        [
            {"type": "function_call_output", "call_id": "k3", "output": "r3 again"},
            {"type": "function_call_output", "call_id": "k2", "output": "r2"},
        ],
    ),
    ("get", 0),
    ("get", -1),
    ("get", 100),
    ("pop", None),
    ("pop", None),
    ("pop", None),
    ("get", None),
    (
        "add",
        [
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "x"},
            },
            user("after"),
        ],
    ),
    ("get", None),
    ("clear", None),
    ("get", None),
    ("pop", None),
    ("add", [user("fresh")]),
    ("get", None),
]


async def run_script(session: Any, **keywords: Any) -> list[Any]:
    """SCRIPT on ``session``; ``keywords`` (the SDK's ``wrapper=``) go to every call."""
    results: list[Any] = []
    for op, argument in SCRIPT:
        if op == "add":
            results.append(await session.add_items(argument, **keywords))
        elif op == "get":
            limit = {} if argument is None else {"limit": argument}
            results.append(await session.get_items(**limit, **keywords))
        elif op == "pop":
            results.append(await session.pop_item(**keywords))
        else:
            results.append(await session.clear_session(**keywords))
    return results


async def test_parity_with_sqlite_session(store: Store, tmp_path: Path) -> None:
    reference = SQLiteSession("parity", tmp_path / "parity.sqlite")
    try:
        expected = await run_script(reference)
    finally:
        reference.close()
    session = await HubAgentSession.create(SessionManager(store), "parity")
    assert isinstance(session, Session)  # the SDK's runtime-checkable protocol
    assert await run_script(session) == expected
    # The same with the run's wrapper on every call, as the Runner passes it (SQLiteSession
    # takes none: the results must not depend on it).
    with_wrapper = await HubAgentSession.create(SessionManager(store), "parity, wrapper")
    assert await run_script(with_wrapper, wrapper=RunContextWrapper(context={"tenant": "acme"})) == expected
    # session_settings.limit is the default limit, as in the SDK.
    limited = HubAgentSession(
        session.session_id, sessions=SessionManager(store), session_settings={"limit": 1}
    )
    assert limited.session_settings is not None and limited.session_settings.limit == 1
    assert await limited.get_items() == [user("fresh")]


class RecordingSession(HubAgentSession):
    """Records the wrapper each call gets, to see what the Runner passes."""

    wrappers: list[tuple[str, Any]]

    async def get_items(
        self, limit: int | None = None, *, wrapper: RunContextWrapper[Any] | None = None
    ) -> list[TResponseInputItem]:
        self.wrappers.append(("get_items", wrapper and wrapper.context))
        return await super().get_items(limit, wrapper=wrapper)

    async def add_items(
        self, items: list[TResponseInputItem], *, wrapper: RunContextWrapper[Any] | None = None
    ) -> None:
        self.wrappers.append(("add_items", wrapper and wrapper.context))
        await super().add_items(items, wrapper=wrapper)


async def test_the_runner_passes_its_context_wrapper(store: Store) -> None:
    manager = SessionManager(store)
    created = await HubAgentSession.create(manager, "tenant")
    session = RecordingSession(created.session_id, sessions=manager)
    session.wrappers = []
    tenant = {"tenant": "acme"}
    await Runner.run(
        Agent(name="a", model=OfflineModel([says("ok", "msg_t")])), "hi", session=session, context=tenant
    )
    assert session.wrappers and all(context is tenant for _, context in session.wrappers)
    assert {name for name, _ in session.wrappers} == {"get_items", "add_items"}


async def test_session_settings_limit_drives_the_runner(store: Store) -> None:
    manager = SessionManager(store)
    created = await HubAgentSession.create(manager, "limited")
    await created.add_items([user("old 1"), user("old 2"), user("old 3")])  # type: ignore[list-item]
    session = HubAgentSession(created.session_id, sessions=manager, session_settings={"limit": 1})
    model = OfflineModel([says("ok", "msg_l")])
    await Runner.run(Agent(name="a", model=model), "new", session=session)
    assert model.inputs[0] == [user("old 3"), user("new")]


# -- over a real hub -----------------------------------------------------------------------


@pytest.fixture
async def hub_client(tmp_path: Path) -> AsyncIterator[HubClient]:
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as client:
        yield client


async def test_runner_over_hub_client(hub_client: HubClient, tmp_path: Path) -> None:
    session = await HubAgentSession.create(hub_client.sessions, "over the hub")
    events: list[str] = []

    async def watch() -> None:
        async for event in hub_client.subscribe(session.session_id, after_seq=0):
            events.append(event.type)
            if events.count("message.appended") == 5:
                return

    watcher = asyncio.create_task(watch())
    model = await two_runs(session)
    assert_saw_history(model)
    assert await session.get_items() == await sdk_items(tmp_path, "over-hub")
    async with asyncio.timeout(5):
        await watcher
    # Every item reached the subscriber live, as it was saved.
    assert events == ["session.created"] + ["message.appended"] * 5
    history = await hub_client.sessions.get_history(session.session_id)
    assert history[1].parts[0]["state"] == "output-available"
    assert isinstance(await session.pop_item(), dict)
    await session.clear_session()
    assert await session.get_items() == []


def test_import_without_the_package_names_the_extra() -> None:
    done = import_without("agents", "clients.openai_agents")
    assert done.returncode != 0
    assert 'pip install "sessionhub[openai-agents]"' in done.stderr
