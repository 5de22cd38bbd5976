"""``sessionhub import --from openai-agents`` (hub/apps/importers.py): an OpenAI Agents SDK
``SQLiteSession`` database read back as the client maps the items it saves, and a database
of another kind refused in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hub import SessionManager, SqliteStore
from tests.apps.test_cli import one_line, run


async def test_import_from_an_openai_agents_sqlite_session(tmp_path: Path) -> None:
    from agents import SQLiteSession

    from clients.openai_agents import HubAgentSession

    file = tmp_path / "agents.db"
    items = [
        {"role": "user", "content": "What is the weather?"},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
    ]
    sdk = SQLiteSession("conv-1", str(file))
    await sdk.add_items(items)  # type: ignore[arg-type]
    sdk.close()
    done = await asyncio.to_thread(
        run, "import", str(file), "--from", "openai-agents", "--db", str(tmp_path / "h.db")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "imported 1 sessions, 3 messages"
    async with await SqliteStore.open(tmp_path / "h.db") as s:
        back = await HubAgentSession("conv-1", sessions=SessionManager(s)).get_items()
        assert back == items
    not_agents = tmp_path / "other.db"
    async with await SqliteStore.open(not_agents):
        pass
    refused = await asyncio.to_thread(
        run, "import", str(not_agents), "--from", "openai-agents", "--db", str(tmp_path / "h.db")
    )
    assert refused.returncode == 2 and "not an OpenAI Agents SQLiteSession database" in one_line(refused)
