"""clients.langgraph: LangGraph's own conformance suite (``langgraph-checkpoint-conformance``
``validate()``) against ``HubCheckpointSaver`` in process on both stores and over a hub,
and a real ``StateGraph`` run with it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from clients import HubClient
from clients.errors import HubError
from clients.langgraph import TAIL, HubCheckpointSaver
from clients.lcmessages import ui_messages
from hub import SessionManager, SqliteStore, Store
from hub.auth import issue_token
from hub.dump import export_lines, import_lines
from hub.server import HubConfig
from protocol import InvalidInput, InvalidMessage
from protocol.graphstate import CheckpointRecord
from tests.support.graphs import approval_graph, chat_graph
from tests.support.hubtest import eventually, served

ROOT = Path(__file__).resolve().parents[2]


async def _conformance(make: Callable[[], HubCheckpointSaver]) -> None:
    @checkpointer_test(name="HubCheckpointSaver")
    async def factory() -> AsyncIterator[HubCheckpointSaver]:
        yield make()

    report = await validate(factory)
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    for name, result in results.items():
        assert result.detected, f"{name} not detected"
        assert result.passed, f"{name}: {result.failures}"
        assert result.tests_failed == 0 and result.tests_passed > 0, name


async def test_the_conformance_suite_passes_in_process(store: Store) -> None:
    """Every base capability and copy_thread, prune, delete_for_runs, on a real SQLite
    file and on Postgres."""
    manager = SessionManager(store)
    await _conformance(lambda: HubCheckpointSaver(manager))


async def test_the_conformance_suite_passes_over_a_hub(tmp_path: Path) -> None:
    """The same suite through a served hub: every call a ``checkpoint_*`` op of a
    ``HubClient``, the bytes base64 on the wire."""
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as client:
        await _conformance(lambda: HubCheckpointSaver(client))


def _user(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=text, id=f"u-{text}")]}


async def test_a_graph_run_shows_live_as_ui_messages_and_time_travel_branches(tmp_path: Path) -> None:
    """A StateGraph agent with a tool, checkpointed through a hub: a WebSocket subscriber
    sees the thread's messages arrive as UIMessages (the tool call completed by its result),
    and resuming an earlier checkpoint adds a branch to the session's tree."""
    call = {"name": "weather", "args": {"city": "Paris"}, "id": "call-1"}
    responses: list[BaseMessage] = [
        AIMessage(content="", tool_calls=[call], id="a-call"),
        AIMessage(content="It is sunny.", id="a-sunny"),
        AIMessage(content="Bye!", id="a-bye"),
        AIMessage(content="Hello again.", id="a-again"),
    ]
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url) as worker,
        HubClient(hub.ws_url) as ui,
    ):
        thread = (await ui.sessions.create("chat")).id  # a session the UI made, run as a thread
        seen: list[Any] = []

        async def watch() -> None:
            async for event in ui.subscribe(thread, after_seq=0):
                seen.append(event)

        watcher = asyncio.create_task(watch())
        graph = chat_graph(responses, HubCheckpointSaver(worker))
        config: RunnableConfig = {"configurable": {"thread_id": thread}}
        await graph.ainvoke(_user("weather?"), config)

        history = await ui.sessions.get_history(thread)
        assert [m.id for m in history] == ["u-weather?", "a-call", "a-sunny"]
        assert history[0].role == "user" and history[0].parts == [{"type": "text", "text": "weather?"}]
        (part,) = history[1].parts
        assert part == {
            "type": "tool-weather",
            "toolCallId": "call-1",
            "state": "output-available",
            "input": {"city": "Paris"},
            "output": "sunny in Paris",
        }
        assert history[2].parts == [{"type": "text", "text": "It is sunny."}]

        def live() -> bool:
            appended = [e.data["message"]["id"] for e in seen if e.type == "message.appended"]
            return appended == ["u-weather?", "a-call", "a-sunny"] and any(
                e.type == "message.updated" for e in seen
            )

        await eventually(live)
        assert any(e.type == "checkpoint.put" for e in seen)

        # A second turn, then time travel: resume from the checkpoint that ended the first.
        await graph.ainvoke(_user("bye"), config)
        ended_first = [
            s
            async for s in graph.aget_state_history(config)
            if not s.next and [m.id for m in s.values["messages"]][-1] == "a-sunny"
        ]
        first_turn = ended_first[0]
        await graph.ainvoke(_user("again"), first_turn.config)
        branches = await ui.sessions.get_branches(thread, "a-sunny")
        assert [m.id for m in branches] == ["u-bye", "u-again"]
        assert [m.id for m in await ui.sessions.get_history(thread)][-2:] == ["u-again", "a-again"]
        watcher.cancel()


async def test_interrupt_and_resume_in_another_worker_process(tmp_path: Path) -> None:
    """One worker runs the graph to its ``interrupt()``; another process, sharing only the
    hub, finds the pending interrupt and resumes the thread to the end."""
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as worker:
        graph = approval_graph(HubCheckpointSaver(worker))
        config: RunnableConfig = {"configurable": {"thread_id": "approval-1"}}
        await graph.ainvoke(_user("deploy?"), config)
        paused = await graph.aget_state(config)
        assert paused.next == ("ask",) and paused.interrupts[0].value == "approve?"

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.graphs", "resume", hub.ws_url, "approval-1", "yes",
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert json.loads(out) == {"next": ["ask"], "messages": ["deploy?", "approved: yes"]}

        done = await graph.aget_state(config)
        assert not done.next and done.values["messages"][-1].content == "approved: yes"
        history = await worker.sessions.get_history("approval-1")
        assert [m.id for m in history] == ["u-deploy?", "approval"]


async def _run_chat(manager: SessionManager, thread: str) -> Any:
    responses: list[BaseMessage] = [
        AIMessage(content="Hi!", id="a-hi"),
        AIMessage(content="Again.", id="a-2"),
    ]
    graph = chat_graph(responses, HubCheckpointSaver(manager))
    config: RunnableConfig = {"configurable": {"thread_id": thread}}
    await graph.ainvoke(_user("hello"), config)
    return graph, config


async def test_retention_keeps_checkpoints_and_export_import_carries_them(
    store: Store, tmp_path: Path
) -> None:
    """``prune_events`` empties the log but not a thread's checkpoints; an export carries
    them (bytes and writes alike), and the imported thread resumes where it stopped."""
    manager = SessionManager(store)
    graph, config = await _run_chat(manager, "kept")
    before = await graph.aget_state(config)
    pruned = await manager.prune_events(keep_per_session=0)
    assert pruned.events > 0
    assert (await graph.aget_state(config)).values == before.values

    lines = [line async for line in export_lines(store, ["kept"])]
    kinds = [json.loads(line).get("type") for line in lines[1:]]
    assert kinds.count("checkpoint") == len([s async for s in graph.aget_state_history(config)])
    async with await SqliteStore.open(tmp_path / "copy.db") as other:
        await import_lines(other, lines)
        again = [line async for line in export_lines(other, ["kept"])]
        assert again == lines  # byte for byte
        copy = SessionManager(other)
        graph2 = chat_graph([AIMessage(content="Resumed.", id="a-r")], HubCheckpointSaver(copy))
        assert (await graph2.aget_state(config)).values == before.values
        await graph2.ainvoke(_user("more"), config)
        assert [m.id for m in await copy.get_history("kept")] == ["u-hello", "a-hi", "u-more", "a-r"]
    # An import over the session replaces its checkpoints too.
    await import_lines(store, lines, replace=True)
    assert (await graph.aget_state(config)).values == before.values


async def test_bad_input_is_a_typed_error_and_writes_nothing(store: Store) -> None:
    manager = SessionManager(store)
    saver = HubCheckpointSaver(manager)
    config: RunnableConfig = {"configurable": {"thread_id": "t-bad", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [{"role": "user", "content": "hi"}, {"role": "bogus"}]}
    with pytest.raises(InvalidInput, match=r"messages\[1\] is not a message"):
        await saver.aput(config, checkpoint, {"source": "input", "step": -1, "parents": {}}, {})
    with pytest.raises(InvalidInput, match="not JSON"):
        await saver.aput(config, empty_checkpoint(), {"step": 0, "when": object()}, {})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(InvalidInput, match="thread_id"):
        await saver.aget_tuple({"configurable": {}})
    with pytest.raises(InvalidInput, match="strategy"):
        await saver.aprune(["t-bad"], strategy="everything")
    bad = msgspec.structs.replace(
        CheckpointRecord(thread_id="t-bad", ns="", checkpoint_id="c", parent_id=None, type="json", data=b"{}",
                         metadata={}),
    )  # fmt: skip
    with pytest.raises(InvalidMessage):
        await manager.threads.put(bad, [{"id": "m", "role": "user", "parts": "not a list"}])
    assert await manager.get("t-bad") is None  # the put rolled back whole: no session either
    assert await saver.aget_tuple(config) is None


async def test_a_put_over_a_hub_checks_the_token_and_its_thread(tmp_path: Path) -> None:
    secret = "s" * 32
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=secret)) as hub:
        reader = issue_token(secret, {"t-1": "read"})
        writer = issue_token(secret, {"t-1": "write"})
        async with HubClient(hub.ws_url, token=writer) as client:
            saver = HubCheckpointSaver(client)
            config: RunnableConfig = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
            stored = await saver.aput(
                config, empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {}
            )
            other: RunnableConfig = {"configurable": {"thread_id": "t-2", "checkpoint_ns": ""}}
            with pytest.raises(HubError, match="forbidden"):
                await saver.aput(other, empty_checkpoint(), {"step": 0}, {})
            with pytest.raises(HubError, match="forbidden"):
                await saver.adelete_for_runs(["r"])  # runs span threads: "*" only
            held = msgspec.to_builtins(await client.threads.get("t-1"))
            with pytest.raises(InvalidInput, match="thread_id"):
                await client.request(
                    "checkpoint_put", session_id="t-1", checkpoint=held | {"thread_id": "t-2"}
                )
        async with HubClient(hub.ws_url, token=reader) as client:
            saver = HubCheckpointSaver(client)
            assert (await saver.aget_tuple(stored)) is not None
            with pytest.raises(HubError, match="forbidden"):
                await saver.adelete_thread("t-1")


async def test_the_sync_methods_run_on_the_savers_loop(store: Store) -> None:
    saver = HubCheckpointSaver(SessionManager(store))
    config: RunnableConfig = {"configurable": {"thread_id": "t-sync", "checkpoint_ns": ""}}

    def in_a_thread() -> list[str]:
        stored = saver.put(config, empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {})
        saver.put_writes(stored, [("ch", 1)], "task-1")
        found = saver.get_tuple(stored)
        assert found is not None and found.pending_writes == [("task-1", "ch", 1)]
        return [t.checkpoint["id"] for t in saver.list(config)]

    assert len(await asyncio.to_thread(in_a_thread)) == 1
    with pytest.raises(asyncio.InvalidStateError, match="async methods"):
        saver.get_tuple(config)


def test_langchain_messages_as_ui_messages() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        AIMessage(
            content=[{"type": "reasoning", "reasoning": "look it up"}, {"type": "text", "text": "Checking."}],
            tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "c1"}],
            id="a1",
        ),
        ToolMessage(content="boom", tool_call_id="c1", status="error"),
    ]
    ui = ui_messages(messages)
    assert ui[0]["role"] == "user" and ui[0]["id"].startswith("lc-")
    assert ui_messages(messages)[0]["id"] == ui[0]["id"]  # the same id on every put
    assert ui[1] == {
        "id": "a1",
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "text": "look it up"},
            {"type": "text", "text": "Checking."},
            {"type": "tool-weather", "toolCallId": "c1", "state": "output-error", "input": {"city": "Oslo"},
             "errorText": "boom"},
        ],
    }  # fmt: skip
    assert len(ui) == 2  # the tool's result is part of the call, not a message


def test_import_without_the_package_names_the_extra() -> None:
    code = "import sys; sys.modules['langgraph'] = None; import clients.langgraph"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert 'pip install "sessionhub[langgraph]"' in done.stderr


@pytest.mark.parametrize("over_hub", [False, True], ids=["in_process", "hub"])
async def test_a_long_conversation_projects_its_tail(tmp_path: Path, over_hub: bool) -> None:
    """Past TAIL messages a put sends only the newest ones; a tree that holds none of them
    (the thread's first put, or a tree cleared meanwhile) refuses that put whole and the
    saver sends the whole conversation."""

    async def run(saver: HubCheckpointSaver, manager_or_hub: Any) -> None:
        config: RunnableConfig = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
        chat: list[BaseMessage] = []
        for i in range(TAIL * 2 + 3):
            chat.append((HumanMessage if i % 2 == 0 else AIMessage)(content=f"message {i}", id=f"m{i}"))
            if i < TAIL * 2:
                continue  # the first put already holds more than a tail
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": list(chat)}
            config = await saver.aput(config, checkpoint, {"source": "loop", "step": i, "parents": {}}, {})
        sessions = manager_or_hub.sessions if over_hub else manager_or_hub
        assert [m.id for m in await sessions.get_history("long")] == [m.id for m in chat]
        await sessions.clear_messages("long")
        checkpoint = empty_checkpoint()
        chat.append(HumanMessage(content="after the clear", id="last"))
        checkpoint["channel_values"] = {"messages": chat}
        await saver.aput(config, checkpoint, {"source": "loop", "step": 99, "parents": {}}, {})
        assert [m.id for m in await sessions.get_history("long")] == [m.id for m in chat]

    if over_hub:
        async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as client:
            await run(HubCheckpointSaver(client), client)
    else:
        async with await SqliteStore.open(tmp_path / "hub.db") as store:
            manager = SessionManager(store)
            await run(HubCheckpointSaver(manager), manager)
