"""Session templates in the engine: chosen at create, recorded in the store (so a restarted
manager builds the session alike), kept by forks, deleted with the session."""

from __future__ import annotations

import pytest

from hub import ReadonlyText, SessionManager, Store
from hub.templates import Template, TemplateBlock
from protocol.errors import ContextError, InvalidInput

TEMPLATES = [
    Template(
        "assistant",
        (
            TemplateBlock("soul", provider=ReadonlyText("You are terse.")),
            TemplateBlock("memory", max_tokens=50, content="Likes tea."),
        ),
        cached_prompt=True,
    ),
    Template("notes", (TemplateBlock("scratch"),)),
]


def manager(store: Store) -> SessionManager:
    return SessionManager(store).with_templates(TEMPLATES, default="assistant")


async def labels(m: SessionManager, session_id: str) -> list[str]:
    return [b.label for b in await m.get_session(session_id).get_context_blocks()]


async def test_create_picks_the_template_and_a_restart_keeps_it(store: Store) -> None:
    m = manager(store)
    default = await m.create("a")
    notes = await m.create("b", template="notes")
    assert await labels(m, default.id) == ["soul", "memory"]
    assert await labels(m, notes.id) == ["scratch"]
    block = await m.get_session(default.id).get_context_block("memory")
    assert block is not None and block.content == "Likes tea."  # the first content
    with pytest.raises(ContextError):
        await m.get_session(default.id).replace_context_block("soul", "x")
    again = manager(store)  # a restart: the choice is read back from the store
    assert await labels(again, notes.id) == ["scratch"]
    assert await labels(again, default.id) == ["soul", "memory"]


async def test_an_unknown_template_creates_nothing(store: Store) -> None:
    m = manager(store)
    with pytest.raises(InvalidInput, match="unknown template 'nope'; this hub's templates: assistant, notes"):
        await m.create("x", template="nope")
    with pytest.raises(InvalidInput, match="this hub has no templates"):
        await SessionManager(store).create("x", template="notes")
    assert await m.list() == []


async def test_fork_keeps_the_template_and_delete_removes_its_rows(store: Store) -> None:
    m = manager(store)
    info = await m.create("b", template="notes")
    await m.append(info.id, {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]})
    await m.get_session(info.id).replace_context_block("scratch", "draft")
    fork = await m.fork(info.id, "u1", "fork")
    assert await labels(manager(store), fork.id) == ["scratch"]
    await m.delete(info.id)
    assert await store.get_context_value(f"scratch_{info.id}") is None
    assert await store.get_context_value(f"_template_{info.id}") is None


async def test_a_session_without_a_recorded_template_gets_the_default(store: Store) -> None:
    info = await SessionManager(store).create("before the templates")
    assert await labels(manager(store), info.id) == ["soul", "memory"]
    with pytest.raises(InvalidInput, match="default template 'x' is not one of the templates"):
        SessionManager(store).with_templates(TEMPLATES, default="x")
