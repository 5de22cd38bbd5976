"""Compaction overlays against the real original's outputs (``compaction_overlay.json``).

``golden-exp.mjs::compactionOverlay()`` is replayed against our :class:`hub.Session`. The
original ran with deterministic UUIDs, so its n-th compaction has the id
``00000000-0000-4000-8000-00000000000n``; ours are random, so golden ids are mapped to the
ids our ``add_compaction`` returned, in the same creation order, before comparing. The
``getRecentHistory`` rows are not compared (not part of our API), nor ``compactionRow``
(the original's table layout).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from hub import Compaction, Message, Session, SqliteStore
from hub.store.overlays import COMPACTION_PREFIX
from tests.support.hubtest import text_message

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "compaction_overlay.json").read_text(
        encoding="utf-8"
    )
)


def golden_compaction_id(n: int) -> str:
    """The id the original's deterministic UUID generator gave its n-th compaction."""
    return f"00000000-0000-4000-8000-{n:012d}"


class Replay:
    """Our session plus the golden-id → our-id map of the compactions made so far."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.compactions: list[Compaction] = []
        self.id_map: dict[str, str] = {}

    async def add(self, summary: str, from_id: str, to_id: str) -> Compaction:
        c = await self.session.add_compaction(summary, from_id, to_id)
        self.compactions.append(c)
        golden_id = golden_compaction_id(len(self.compactions))
        self.id_map[golden_id] = c.id
        self.id_map[COMPACTION_PREFIX + golden_id] = COMPACTION_PREFIX + c.id
        return c

    def mapped(self, golden_ids: list[str]) -> list[str]:
        """Golden history ids with the original's compaction ids replaced by ours."""
        return [self.id_map.get(i, i) for i in golden_ids]

    async def history_ids(self, leaf_id: str | None = None) -> list[str]:
        return [m.id for m in await self.session.get_history(leaf_id)]


async def ten_messages(store: SqliteStore) -> Replay:
    s = Session.create(store)
    for i in range(1, 11):
        await s.append_message(text_message(f"m{i}", "user" if i % 2 else "assistant", f"message {i}"))
    return Replay(s)


async def full_replay(store: SqliteStore) -> Replay:
    """Every step of ``compactionOverlay()`` up to the b7 branch."""
    r = await ten_messages(store)
    await r.add("Summary of m2..m5", "m2", "m5")
    await r.add("Summary of m2..m7 (newer, same start)", "m2", "m7")
    await r.add("Nested m3..m4 (inside a span: never applies)", "m3", "m4")
    await r.add("m8..m9 (second, disjoint span)", "m8", "m9")
    await r.add("to before from (ignored)", "m10", "m9")
    await r.session.append_message(text_message("b7", "assistant", "branch off m6"), "m6")
    return r


def assert_compaction_matches(ours: Compaction, golden: dict[str, Any], r: Replay) -> None:
    assert ours.id == r.id_map[golden["id"]]
    assert ours.summary == golden["summary"]
    assert ours.from_message_id == golden["fromMessageId"]
    assert ours.to_message_id == golden["toMessageId"]
    # The original returns a timestamp (ISO string from addCompaction, SQLite
    # CURRENT_TIMESTAMP string from getCompactions); ours is a datetime.
    assert isinstance(golden["createdAt"], str)
    assert isinstance(ours.created_at, datetime)


async def test_add_compaction_return(store: SqliteStore) -> None:
    r = await ten_messages(store)
    c1 = await r.add("Summary of m2..m5", "m2", "m5")
    assert_compaction_matches(c1, GOLDEN["addCompactionReturn"], r)


async def test_first_overlay_history(store: SqliteStore) -> None:
    r = await ten_messages(store)
    await r.add("Summary of m2..m5", "m2", "m5")
    assert await r.history_ids() == r.mapped(GOLDEN["historyAfterC1"])


async def test_overlay_message_shape(store: SqliteStore) -> None:
    r = await ten_messages(store)
    c1 = await r.add("Summary of m2..m5", "m2", "m5")
    overlay: Message = (await r.session.get_history())[1]
    golden = GOLDEN["overlayMessage"]
    shape = GOLDEN["overlayMessageShape"]

    assert overlay.id == r.id_map[golden["id"]] == "compaction_" + c1.id
    assert overlay.role == golden["role"] == "assistant"
    assert overlay.parts == golden["parts"] == [{"type": "text", "text": "Summary of m2..m5"}]
    assert list(overlay.parts[0]) == shape["partKeys"]
    # createdAt is a Date in the original; ours is a datetime (the overlay's own creation
    # time, so two reads agree — the original stamps the read time).
    assert shape["createdAtIsDate"] is True
    assert isinstance(overlay.created_at, datetime)
    assert list(overlay.to_dict()) == shape["keys"] == ["id", "role", "parts", "createdAt"]
    assert overlay.metadata is None
    assert overlay.extra == {}


async def test_get_compactions_after_first(store: SqliteStore) -> None:
    r = await ten_messages(store)
    await r.add("Summary of m2..m5", "m2", "m5")
    ours = await r.session.get_compactions()
    golden = GOLDEN["getCompactions"]
    assert len(ours) == len(golden) == 1
    assert_compaction_matches(ours[0], golden[0], r)


async def test_path_length_ignores_overlays(store: SqliteStore) -> None:
    r = await ten_messages(store)
    await r.add("Summary of m2..m5", "m2", "m5")
    assert await r.session.get_path_length() == GOLDEN["pathLengthIgnoresOverlay"] == 10


async def test_histories_step_by_step(store: SqliteStore) -> None:
    r = await ten_messages(store)
    await r.add("Summary of m2..m5", "m2", "m5")
    assert await r.history_ids() == r.mapped(GOLDEN["historyAfterC1"])

    await r.add("Summary of m2..m7 (newer, same start)", "m2", "m7")
    assert await r.history_ids() == r.mapped(GOLDEN["historyAfterC2_sameStartNewerWins"])

    await r.add("Nested m3..m4 (inside a span: never applies)", "m3", "m4")
    assert await r.history_ids() == r.mapped(GOLDEN["historyAfterNested"])

    await r.add("m8..m9 (second, disjoint span)", "m8", "m9")
    assert await r.history_ids() == r.mapped(GOLDEN["historyTwoSpans"])

    await r.add("to before from (ignored)", "m10", "m9")
    assert await r.history_ids() == r.mapped(GOLDEN["historyReversedIgnored"])

    await r.session.append_message(text_message("b7", "assistant", "branch off m6"), "m6")
    assert await r.history_ids("b7") == r.mapped(GOLDEN["branch_b7_history"])
    assert await r.history_ids("m10") == r.mapped(GOLDEN["main_m10_history"])
    # b7 is now the latest leaf, so the default history is the branch's.
    assert await r.history_ids() == r.mapped(GOLDEN["branch_b7_history"])


async def test_mapped_golden_ids_are_the_expected_overlays(store: SqliteStore) -> None:
    """Sanity check of the id mapping: the ids in the golden lists are the overlays the
    replay says they are (c2 hides c1 and the nested c3; c4 is the disjoint span)."""
    r = await full_replay(store)
    c1, c2, _c3, c4, _c5 = r.compactions
    assert r.mapped(GOLDEN["main_m10_history"]) == [
        "m1",
        "compaction_" + c2.id,
        "compaction_" + c4.id,
        "m10",
    ]
    assert r.mapped(GOLDEN["branch_b7_history"]) == ["m1", "compaction_" + c1.id, "m6", "b7"]
    history = await r.session.get_history("m10")
    assert [m.parts[0]["text"] for m in history[1:3]] == [
        "Summary of m2..m7 (newer, same start)",
        "m8..m9 (second, disjoint span)",
    ]


async def test_get_compactions_order_and_fields(store: SqliteStore) -> None:
    r = await full_replay(store)
    ours = await r.session.get_compactions()
    assert [c.id for c in ours] == [c.id for c in r.compactions]
    assert [(c.summary, c.from_message_id, c.to_message_id) for c in ours] == [
        ("Summary of m2..m5", "m2", "m5"),
        ("Summary of m2..m7 (newer, same start)", "m2", "m7"),
        ("Nested m3..m4 (inside a span: never applies)", "m3", "m4"),
        ("m8..m9 (second, disjoint span)", "m8", "m9"),
        ("to before from (ignored)", "m10", "m9"),
    ]
    assert ours == r.compactions
    assert len({c.id for c in ours}) == 5


async def test_search_still_finds_compacted_messages(store: SqliteStore) -> None:
    r = await full_replay(store)
    hits = await r.session.search("message 3")
    assert [{"id": h.id, "role": h.role, "content": h.content} for h in hits] == GOLDEN[
        "searchStillFindsCompacted"
    ]
    assert all(h.session_id == "" for h in hits)
