"""The one rule by which a streamed message grows, shared by the hub, its mirrors of other
nodes' streams and the Python client."""

from __future__ import annotations

from typing import Any

import pytest

from protocol import InvalidInput
from protocol.deltas import apply_delta

TOOL = {"type": "tool-weather", "toolCallId": "c1", "state": "input-available"}


def test_text_and_reasoning_extend_the_last_part_of_their_kind() -> None:
    parts: list[dict[str, Any]] = []
    apply_delta(parts, "reasoning", "think", None)
    apply_delta(parts, "reasoning", "ing", None)
    apply_delta(parts, "text", "Hel", None)
    apply_delta(parts, "text", "lo", None)
    assert parts == [{"type": "reasoning", "text": "thinking"}, {"type": "text", "text": "Hello"}]


def test_a_tool_part_replaces_its_call_or_is_added() -> None:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "x"}]
    apply_delta(parts, "tool", None, TOOL)
    apply_delta(parts, "tool", None, {**TOOL, "state": "output-available", "output": 21})
    apply_delta(parts, "tool", None, {**TOOL, "toolCallId": "c2"})
    assert [p.get("toolCallId") for p in parts] == [None, "c1", "c2"]
    assert parts[1]["output"] == 21


@pytest.mark.parametrize(
    ("kind", "text", "part"),
    [("text", None, None), ("reasoning", 3, None), ("tool", None, None), ("tool", None, {"type": "file"})],
)
def test_a_bad_delta_raises_and_changes_nothing(kind: str, text: Any, part: Any) -> None:
    parts = [{"type": "text", "text": "kept"}]
    with pytest.raises(InvalidInput, match="delta needs"):
        apply_delta(parts, kind, text, part)
    assert parts == [{"type": "text", "text": "kept"}]
