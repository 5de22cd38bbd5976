"""Shared fixtures: every test gets a real SQLite file in its own temporary directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hub import SqliteStore


def text_message(message_id: str, role: str, text: str) -> dict[str, Any]:
    """A UIMessage dict with one text part (the original tests' ``T(...)``)."""
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}]}


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessionhub.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(db_path)
    try:
        yield s
    finally:
        await s.close()
