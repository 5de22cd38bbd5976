"""Laying compaction overlays over a root-to-leaf path (the original's ``applyCompactions``).

Pure functions, shared by every store, so SQLite and Postgres cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol import Compaction, Message

__all__ = ["COMPACTION_PREFIX", "apply_compactions", "overlay_message", "visible_compactions"]

COMPACTION_PREFIX = "compaction_"


def overlay_message(compaction: Compaction) -> Message:
    """The synthetic assistant message that stands for a compacted span.

    Departure: ``created_at`` is the overlay's own creation time, not the time of the read,
    so two reads of the same history are equal.
    """
    return Message(
        id=COMPACTION_PREFIX + compaction.id,
        role="assistant",
        parts=[{"type": "text", "text": compaction.summary}],
        created_at=compaction.created_at,
    )


def _chosen(path_ids: Sequence[str], compactions: Sequence[Compaction]) -> list[tuple[int, int, Compaction]]:
    """Which overlays apply, as ``(start, end, overlay)`` in path order.

    ``compactions`` must be in insertion order. At each position the newest overlay that
    starts there and ends at or after it on this same path wins; the span it covers hides
    every overlay that starts inside it. Overlays whose end lies on another branch (or
    before their start) never apply.
    """
    index = {mid: i for i, mid in enumerate(path_ids)}
    by_start: dict[int, list[Compaction]] = {}
    for c in compactions:
        start = index.get(c.from_message_id)
        if start is not None:
            by_start.setdefault(start, []).append(c)
    if not by_start:
        return []
    chosen: list[tuple[int, int, Compaction]] = []
    i, n = 0, len(path_ids)
    while i < n:
        best: tuple[int, Compaction] | None = None
        for c in by_start.get(i, ()):
            end = index.get(c.to_message_id, -1)
            if end >= i:
                best = (end, c)
        if best is None:
            i += 1
        else:
            chosen.append((i, best[0], best[1]))
            i = best[0] + 1
    return chosen


def apply_compactions(path: Sequence[Message], compactions: Sequence[Compaction]) -> list[Message]:
    """The path with every applicable overlay replacing the span it summarizes."""
    if not compactions:
        return list(path)
    chosen = _chosen([m.id for m in path], compactions)
    if not chosen:
        return list(path)
    out: list[Message] = []
    i = 0
    for start, end, c in chosen:
        out.extend(path[i:start])
        out.append(overlay_message(c))
        i = end + 1
    out.extend(path[i:])
    return out


def visible_compactions(path_ids: Sequence[str], compactions: Sequence[Compaction]) -> list[Compaction]:
    """Overlays whose whole span lies on this path in order (what a fork carries along)."""
    index = {mid: i for i, mid in enumerate(path_ids)}
    out = []
    for c in compactions:
        start = index.get(c.from_message_id)
        end = index.get(c.to_message_id)
        if start is not None and end is not None and end >= start:
            out.append(c)
    return out
