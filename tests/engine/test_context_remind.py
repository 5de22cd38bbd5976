"""Context blocks with ``when_changed="remind"`` and ``reminder()`` (hub/context.py), against
agents 0.32.0's own output for the same script (tests/fixtures/make_v032_remind.mjs runs the
package's ``ContextBlocks``; tests/fixtures/golden/v032_context_remind.json is what it
printed): the frozen prompt stays, and a changed block reaches the model as a reminder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hub import SessionManager, SqliteStore
from hub.context import ContextBlocks, ContextConfig
from protocol import ContextError

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "v032_context_remind.json").read_text("utf-8")
)


class Value:
    def __init__(self, text: str) -> None:
        self.text = text

    async def get(self) -> str:
        return self.text


class Memory:
    async def get(self) -> str:
        return "m"

    async def set(self, content: str) -> None:
        pass


class PromptStore:
    def __init__(self) -> None:
        self.value: str | None = None

    async def get(self) -> str | None:
        return self.value

    async def set(self, value: str) -> None:
        self.value = value


async def test_reminder_gives_what_agents_0_32_gives() -> None:
    soul, today, notes = Value("You are terse."), Value("2026-12-03"), Value("")
    blocks = ContextBlocks(
        [
            ContextConfig("soul", provider=soul),
            ContextConfig("date", "Today", provider=today, when_changed="remind"),
            ContextConfig("notes", provider=notes, when_changed="remind"),
            ContextConfig("memory", "Learned facts", 100, Memory()),
        ],
        PromptStore(),
    )
    got: dict[str, Any] = {"beforeFreeze": await blocks.reminder()}
    got["frozen"] = await blocks.freeze_system_prompt()
    got["unchanged"] = await blocks.reminder()
    today.text, soul.text = "2026-12-04", "You are verbose."  # soul waits: no reminder
    got["afterDate"] = await blocks.reminder()
    notes.text = "buy milk"
    got["afterNotes"] = await blocks.reminder()
    got["frozenStill"] = await blocks.freeze_system_prompt()
    got["refreshed"] = await blocks.refresh_system_prompt()
    got["afterRefresh"] = await blocks.reminder()
    assert got == GOLDEN


async def test_a_session_block_reminds_and_a_bad_mode_is_refused(tmp_path: Path) -> None:
    today = Value("Monday")
    async with await SqliteStore.open(tmp_path / "a.db") as store:
        manager = SessionManager(store).with_context("date", provider=today, when_changed="remind")
        session = manager.get_session("s1")
        frozen = await session.freeze_system_prompt()
        today.text = "Tuesday"
        assert await session.freeze_system_prompt() == frozen  # the prefix cache stays warm
        reminder = await session.reminder()
        assert reminder is not None and reminder.endswith("Tuesday") and "Monday" in frozen
    with pytest.raises(ContextError):
        SessionManager(store).with_context("x", when_changed="sometimes")  # type: ignore[arg-type]
