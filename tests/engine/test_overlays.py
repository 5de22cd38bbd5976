"""The overlay algorithm against a direct transcription of the original's loop."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from hub.store.overlays import COMPACTION_PREFIX, apply_compactions, visible_compactions
from protocol import Compaction, Message

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def path_of(n: int) -> list[Message]:
    return [Message(id=f"m{i}", role="user", parts=[]) for i in range(n)]


def overlay(n: int, start: str, end: str) -> Compaction:
    return Compaction(id=str(n), summary=f"s{n}", from_message_id=start, to_message_id=end, created_at=NOW)


def reference(path: list[Message], compactions: list[Compaction]) -> list[str]:
    """Spec §5.4 verbatim: quadratic, obviously right."""
    ids = [m.id for m in path]

    def index_of(mid: str) -> int:
        return ids.index(mid) if mid in ids else -1

    out: list[str] = []
    i = 0
    while i < len(ids):
        matching = [c for c in compactions if c.from_message_id == ids[i] and index_of(c.to_message_id) >= i]
        if matching:
            c = matching[-1]
            out.append(COMPACTION_PREFIX + c.id)
            i = index_of(c.to_message_id) + 1
        else:
            out.append(ids[i])
            i += 1
    return out


@given(
    n=st.integers(0, 12),
    spans=st.lists(st.tuples(st.integers(-1, 13), st.integers(-1, 13)), max_size=8),
)
def test_matches_the_original_algorithm(n: int, spans: list[tuple[int, int]]) -> None:
    path = path_of(n)
    # Index -1 / 13 stand for ids on another branch.
    compactions = [
        overlay(k, f"m{a}" if a >= 0 else "x", f"m{b}" if b >= 0 else "y") for k, (a, b) in enumerate(spans)
    ]
    assert [m.id for m in apply_compactions(path, compactions)] == reference(path, compactions)


def test_overlay_message_shape() -> None:
    history = apply_compactions(path_of(3), [overlay(7, "m0", "m1")])
    m = history[0]
    assert m.id == "compaction_7" and m.role == "assistant"
    assert m.parts == [{"type": "text", "text": "s7"}]
    assert m.created_at == NOW


def test_visible_compactions_need_both_ends_in_order() -> None:
    ids = ["a", "b", "c"]
    cs = [overlay(1, "a", "b"), overlay(2, "b", "x"), overlay(3, "c", "a"), overlay(4, "b", "b")]
    assert [c.id for c in visible_compactions(ids, cs)] == ["1", "4"]
