"""clients.langgraph: LangGraph's own conformance suite (``langgraph-checkpoint-conformance``
``validate()``) against ``HubCheckpointSaver`` in process on both stores and over a hub,
and a real ``StateGraph`` run with it."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from clients import HubClient
from clients.langgraph import HubCheckpointSaver
from hub import SessionManager, Store
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
