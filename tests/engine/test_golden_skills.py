"""Skill restore and reclaim against the real original's outputs (``skill_reclaim.json``).

``golden-exp.mjs::skillReclaim()``: a session loads ``code-review`` and ``debugging`` through
``load_context``, then stores an assistant message recording both loads — ``debugging`` as
the AI SDK's static ``tool-load_context`` part (no ``toolName``), ``code-review`` as a
``dynamic-tool`` part with ``toolName``. A fresh session over the same storage (a
hibernation wake) restores the loaded keys from that message; ``unloadSkill`` rewrites the
recorded output to ``[skill unloaded: <key>]``.

KNOWN DEPARTURE (spec §10.3, ``hub.session._tool_name``). The original matches tool parts by
``part.toolName`` only, so the static ``tool-load_context`` part is neither restored on
wake nor reclaimed on unload (the recorder's own ``fact``). Ours also reads the tool name
from the ``tool-<name>`` type: the wake restores both skills, and unloading ``debugging``
rewrites that part too. Every other value matches the golden exactly. Our reclaim is
awaited inside ``unload_skill``, so the recorder's 20 ms sleeps are not needed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hub import FileSkillProvider, Session, SqliteStore, Tool

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "skill_reclaim.json").read_text(encoding="utf-8")
)

CODE_REVIEW = "# Code review\nCheck tests first, then naming."
DEBUGGING = "# Debugging\nReproduce, bisect, fix."


async def skill_folder(tmp_path: Path) -> Path:
    """The recorder's ``skillBucket()`` under ``skills/``, as a folder."""
    p = FileSkillProvider(tmp_path / "skills")
    await p.set("code-review", CODE_REVIEW, "How to review a pull request")
    await p.set("debugging", DEBUGGING)
    await FileSkillProvider(tmp_path / "other").set("ignored", "not a skill", "outside prefix")
    return p.directory


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


class Replay:
    def __init__(self, store: SqliteStore, folder: Path) -> None:
        self.store = store
        self.folder = folder
        self.s = self.mk()
        self.body = ""

    def mk(self) -> Session:
        return Session(self.store).with_context("skills", provider=FileSkillProvider(self.folder))

    async def load_and_record(self) -> None:
        tools = by_name(await self.s.tools())
        self.body = await tools["load_context"].execute({"label": "skills", "key": "code-review"})
        await tools["load_context"].execute({"label": "skills", "key": "debugging"})
        await self.s.append_message(
            {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "review my PR"}]}
        )
        await self.s.append_message(
            {
                "id": "a1",
                "role": "assistant",
                "parts": [
                    # AI SDK static-tool part shape (no toolName field)
                    {
                        "type": "tool-load_context",
                        "toolCallId": "c1",
                        "state": "output-available",
                        "input": {"label": "skills", "key": "debugging"},
                        "output": DEBUGGING,
                    },
                    # dynamic-tool shape (has toolName)
                    {
                        "type": "dynamic-tool",
                        "toolName": "load_context",
                        "toolCallId": "c2",
                        "state": "output-available",
                        "input": {"label": "skills", "key": "code-review"},
                        "output": self.body,
                    },
                ],
            }
        )

    async def message(self) -> dict[str, Any]:
        m = await self.s.get_message("a1")
        assert m is not None
        return m.to_dict()


async def replayed(store: SqliteStore, tmp_path: Path) -> Replay:
    r = Replay(store, await skill_folder(tmp_path))
    await r.load_and_record()
    return r


async def test_load_result_body(store: SqliteStore, tmp_path: Path) -> None:
    r = await replayed(store, tmp_path)
    assert r.body == GOLDEN["loadResultBody"] == CODE_REVIEW


async def test_message_before(store: SqliteStore, tmp_path: Path) -> None:
    r = await replayed(store, tmp_path)
    assert await r.message() == GOLDEN["messageBefore"]
    assert await r.s.get_loaded_skill_keys() == {"skills:code-review", "skills:debugging"}


async def test_restored_loaded_keys_on_wake(store: SqliteStore, tmp_path: Path) -> None:
    """DEPARTURE. The original restores only ``skills:code-review`` (the ``toolName`` part);
    ours also restores ``skills:debugging`` from the typed ``tool-load_context`` part."""
    r = await replayed(store, tmp_path)
    restored = r.mk()  # fresh Session over the same storage (hibernation wake)
    ours = await restored.get_loaded_skill_keys()
    assert GOLDEN["restoredLoadedKeysOnWake"] == ["skills:code-review"]
    assert ours == {"skills:debugging", "skills:code-review"}
    assert set(GOLDEN["restoredLoadedKeysOnWake"]) < ours


async def test_unload_code_review_rewrites_its_part(store: SqliteStore, tmp_path: Path) -> None:
    r = await replayed(store, tmp_path)
    returned = await r.s.unload_skill("skills", "code-review")
    assert returned is GOLDEN["unloadSkill_codeReview_returned"] is True
    # The reclaim is awaited by unload_skill: no sleep needed.
    assert await r.message() == GOLDEN["messageAfterUnloadCodeReview"]
    assert GOLDEN["messageAfterUnloadCodeReview"]["parts"][1]["output"] == "[skill unloaded: code-review]"


async def test_unload_debugging_rewrites_the_typed_part(store: SqliteStore, tmp_path: Path) -> None:
    """DEPARTURE. The original leaves the typed ``tool-load_context`` part untouched (its
    message after the unload equals the one before); ours rewrites its output. Everything
    else in the message is the golden's."""
    r = await replayed(store, tmp_path)
    await r.s.unload_skill("skills", "code-review")
    returned = await r.s.unload_skill("skills", "debugging")
    assert returned is GOLDEN["unloadSkill_debugging_returned"] is True

    golden = GOLDEN["messageAfterUnloadDebugging"]
    assert golden == GOLDEN["messageAfterUnloadCodeReview"]  # the original changed nothing
    assert golden["parts"][0]["output"] == DEBUGGING
    want = copy.deepcopy(golden)
    want["parts"][0]["output"] = "[skill unloaded: debugging]"
    assert await r.message() == want


async def test_unload_returns_false_when_not_loaded(store: SqliteStore, tmp_path: Path) -> None:
    r = await replayed(store, tmp_path)
    assert await r.s.unload_skill("skills", "code-review") is True
    assert await r.s.unload_skill("skills", "code-review") is False
    assert await r.s.get_loaded_skill_keys() == {"skills:debugging"}


async def test_restored_loaded_keys_after_unload(store: SqliteStore, tmp_path: Path) -> None:
    """The same as the original's (nothing), though for a different reason: the original
    never restored ``debugging``; ours sees both recorded loads rewritten as unloaded."""
    r = await replayed(store, tmp_path)
    await r.s.unload_skill("skills", "code-review")
    await r.s.unload_skill("skills", "debugging")
    restored2 = r.mk()
    assert await restored2.get_loaded_skill_keys() == set(GOLDEN["restoredLoadedKeysAfterUnload"]) == set()


def test_recorded_fact() -> None:
    assert "toolName === 'load_context' only" in GOLDEN["fact"]
