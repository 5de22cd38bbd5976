"""One worker process of tests/clients/test_pydantic_ai.py: a real Pydantic AI agent, with an
offline ``FunctionModel`` that calls a tool, keeping its history in a hub over ``HubClient``.

``python -m tests.clients.pydantic_ai_worker WS_URL TOKEN SESSION_ID PROMPT`` loads the
session's history, runs one turn with the capability saving as it goes, and prints the run's
``all_messages()`` as ``ModelMessagesTypeAdapter`` JSON on stdout.
"""

from __future__ import annotations

import asyncio
import sys

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from clients import HubClient
from clients.pydantic_ai import HubMessageHistory


def prompts(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


def weather_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls ``get_weather`` once per turn, then answers naming every prompt it was sent (so a
    second turn shows that it saw the first)."""
    parts = [part for message in messages if isinstance(message, ModelRequest) for part in message.parts]
    turn = max(i for i, part in enumerate(parts) if isinstance(part, UserPromptPart))
    if any(isinstance(part, ToolReturnPart) for part in parts[turn:]):
        return ModelResponse(parts=[TextPart("Seen: " + " | ".join(prompts(messages)))])
    return ModelResponse(
        parts=[
            ThinkingPart("The user wants the weather."),
            ToolCallPart("get_weather", {"city": "Paris"}, tool_call_id=f"call_{len(messages)}"),
        ]
    )


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


async def main(url: str, token: str, session_id: str, prompt: str) -> None:
    async with HubClient(url, token=token) as hub:
        history = HubMessageHistory(hub, session_id)
        agent = Agent(FunctionModel(weather_model), tools=[get_weather], capabilities=[history.capability()])
        result = await agent.run(prompt, message_history=await history.load())
        sys.stdout.write(ModelMessagesTypeAdapter.dump_json(result.all_messages()).decode())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
