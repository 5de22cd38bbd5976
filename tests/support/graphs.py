"""Real LangGraph graphs for tests/clients/test_langgraph.py (no network: langchain-core's
fake chat model), and a second worker process: ``python -m tests.support.graphs resume
WS_URL THREAD_ID ANSWER`` resumes an interrupted approval graph through the hub and prints
its final state as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, interrupt

__all__ = ["approval_graph", "chat_graph"]


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def chat_graph(
    responses: list[BaseMessage], checkpointer: BaseCheckpointSaver[Any]
) -> CompiledStateGraph[Any]:
    """An agent: the model (answering ``responses`` in turn) and a tool node."""
    model = FakeMessagesListChatModel(responses=responses)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def approval_graph(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any]:
    """Asks a human (``interrupt``) before it answers."""

    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"approved: {answer}", id="approval")]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=checkpointer)


async def _resume(url: str, thread_id: str, answer: str) -> None:
    from clients import HubClient
    from clients.langgraph import HubCheckpointSaver

    async with HubClient(url) as hub:
        graph = approval_graph(HubCheckpointSaver(hub))
        config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        pending = await graph.aget_state(config)
        state = await graph.ainvoke(Command(resume=answer), config)
        print(json.dumps({"next": list(pending.next), "messages": [m.content for m in state["messages"]]}))


if __name__ == "__main__":
    if sys.argv[1] == "resume":
        asyncio.run(_resume(sys.argv[2], sys.argv[3], sys.argv[4]))
