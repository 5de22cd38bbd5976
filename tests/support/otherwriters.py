"""What another writer (a person in the inspector, a chat UI, an MCP client) adds to a session,
for the framework backends' tests (tests/clients/test_openai_agents.py, test_pydantic_ai.py):
a user's text, then an assistant message with a step marker, a tool call with its output,
and text. Each backend must read these as its own records."""

from __future__ import annotations

from typing import Any

from hub import SessionManager

OTHER_WRITERS: list[dict[str, Any]] = [
    {"id": "h1", "role": "user", "parts": [{"type": "text", "text": "typed in the inspector"}]},
    {
        "id": "h2",
        "role": "assistant",
        "parts": [
            {"type": "step-start"},
            {
                "type": "tool-lookup",
                "toolCallId": "t9",
                "state": "output-available",
                "input": {"q": 1},
                "output": {"n": 2},
            },
            {"type": "text", "text": "done"},
        ],
    },
]


async def add_as_other_writers(manager: SessionManager, session_id: str) -> None:
    for message in OTHER_WRITERS:
        await manager.append(session_id, message)
