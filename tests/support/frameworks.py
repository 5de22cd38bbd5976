"""What the framework backends' tests (tests/clients/test_openai_agents.py,
test_pydantic_ai.py) share: the messages another writer (a person in the inspector, a chat
UI, an MCP client) adds, which each backend must read as its own records, and importing a
backend without its framework."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hub import SessionManager

ROOT = Path(__file__).resolve().parents[2]

#: A user's text, then an assistant message with a step marker, a tool call with its output,
#: and text.

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


def import_without(package: str, module: str) -> subprocess.CompletedProcess[str]:
    """Import ``module`` in a fresh interpreter where ``package`` is not installed (None in
    ``sys.modules`` is what Python does for a missing module)."""
    code = f"import sys; sys.modules[{package!r}] = None; import {module}"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ}
    )
