"""What agents 0.32 (``agents/sessions``) does with odd writes, and the port with them
(docs/engine.md, "Client writes"): the golden file is the original's own output
(tests/fixtures/golden/v032_sessions_tree.json, recorded by
shared/reference/original-node/golden-v032.mjs::tree()); the reserved metadata keys and the
import of an overlay id are read from its source (dist/sessions-*.js:
``stripReservedMetadata``, ``Session.appendMessage``, ``importMessage``), which the golden
run does not exercise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hub import Session, SqliteStore, session_stream
from hub.dump import import_lines
from hub.server import HubConfig
from hub.store.clientwrites import WRITER
from protocol import coerce_message
from tests.support import dumps
from tests.support.hubtest import served

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "v032_sessions_tree.json").read_text("utf-8")
)


def T(id_: str, role: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"id": id_, "role": role, "parts": [{"type": "text", "text": text}], **extra}


async def test_an_echoed_overlay_id_is_dropped_silently_as_the_original_does(tmp_path: Path) -> None:
    async with await SqliteStore.open(tmp_path / "a.db") as store:
        chat = Session(store).for_session("chat")
        await chat.append_message(T("r1", "user", "Plan the deployment"))
        before = await store.stream_position(session_stream("chat"))
        inserted = await chat.append_message(T("compaction_x", "assistant", "overlay"))
        # The original: {"inserted": false, ...} and no change-feed entry.
        assert GOLDEN["appendCompactionIdDropped"]["inserted"] is False
        assert [e.get("id") for e in GOLDEN["changeFeed"]].count("compaction_x") == 0
        assert inserted is False
        assert [m.id for m in await chat.get_history()] == ["r1"]
        assert await store.stream_position(session_stream("chat")) == before  # no event
        # In a chain (a chat UI posting its transcript back), the rest goes in after r1.
        chain = [
            coerce_message(m)
            for m in (T("r1", "user", "x"), T("compaction_y", "user", "o"), T("u2", "user", "go"))
        ]
        await store.append_messages("chat", chain)
        assert [m.id for m in await chat.get_history()] == ["r1", "u2"]
        assert await store.update_message("chat", coerce_message(T("compaction_x", "user", "z"))) is False


async def test_an_import_keeps_an_overlay_id_as_import_message_does(tmp_path: Path) -> None:
    lines = dumps.session("s", messages=1)
    line = json.loads(lines[1])
    line["message"]["id"] = "compaction_old"
    lines[1] = json.dumps(line)
    async with await SqliteStore.open(tmp_path / "a.db") as store:
        await import_lines(store, dumps.dump(lines))
        assert [m.id for m in await store.get_path("s")] == ["compaction_old"]


async def test_an_unknown_parent_makes_a_root_as_the_original_does(tmp_path: Path) -> None:
    async with await SqliteStore.open(tmp_path / "a.db") as store:
        chat = Session(store).for_session("chat")
        for m in (T("r1", "user", "a"), T("a1", "assistant", "b")):
            await chat.append_message(m)
        assert await chat.append_message(T("orphan", "user", "x"), parent_id="ghost") is True
        assert GOLDEN["missingParent"]["inserted"] is True
        assert GOLDEN["missingParentRow"]["parent_id"] is None  # a root, not an error
        assert [m.id for m in await store.get_path("chat", "orphan")] == ["orphan"]
        assert [m.id for m in await store.get_path("chat", "a1")] == ["r1", "a1"]


async def test_a_client_cannot_set_a_reserved_metadata_key(tmp_path: Path) -> None:
    """``stripReservedMetadata`` on ``source: "client"`` writes: here every door's writes."""
    config = HubConfig(reserved_metadata_keys=("usage", "server"))
    async with served(db=tmp_path / "hub.db", config=config) as h, h.client() as ws:
        await h.hub.store.create_session("one", session_id="s1")
        forged = T("u1", "user", "hi", metadata={"usage": {"cost": 0}, "server": 1, "mine": True})
        await ws.call("append", session_id="s1", message=forged)
        stored = await h.hub.store.get_message("s1", "u1")
        assert stored is not None and stored.metadata == {"mine": True}
        only = T("u2", "user", "hi", metadata={"usage": 1})
        await ws.call("append", session_id="s1", message=only)
        stored = await h.hub.store.get_message("s1", "u2")
        assert stored is not None and stored.metadata is None  # emptied: gone, as the original
        # The engine's own writes (no door) keep them.
        assert WRITER.get() is None
        await h.hub.store.append_messages(
            "s1", [coerce_message(T("a1", "assistant", "x", metadata={"usage": 2}))]
        )
        kept = await h.hub.store.get_message("s1", "a1")
        assert kept is not None and kept.metadata == {"usage": 2}
