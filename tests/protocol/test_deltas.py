"""The one rule by which a streamed message grows, shared by the hub, its mirrors of other
nodes' streams and the Python client."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import InvalidInput
from protocol.deltas import GrowingParts, apply_delta

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


_DELTA = st.one_of(
    st.tuples(st.sampled_from(["text", "reasoning"]), st.text(max_size=5), st.none()),
    st.tuples(
        st.just("tool"),
        st.none(),
        st.fixed_dictionaries(
            {"type": st.just("tool-x"), "toolCallId": st.sampled_from(["c1", "c2"]), "n": st.integers(0, 9)}
        ),
    ),
    st.tuples(st.just("text"), st.none(), st.none()),  # malformed: refused, changes nothing
)


@given(st.lists(_DELTA, max_size=30))
def test_growing_parts_apply_the_same_rule_as_apply_delta(deltas: list[tuple[Any, Any, Any]]) -> None:
    """The hub's amortized accumulator and the one-delta rule give the same parts, and its
    byte count is what the parts hold."""
    plain: list[dict[str, Any]] = []
    grown = GrowingParts()
    for kind, text, part in deltas:
        expected_size = grown.size_after(kind, text, part)
        try:
            apply_delta(plain, kind, text, part)
        except InvalidInput:
            with pytest.raises(InvalidInput):
                grown.apply(kind, text, part)
            continue
        grown.apply(kind, text, part)
        assert grown.bytes == expected_size
    assert grown.parts() == plain
    held = sum(len(p["text"].encode()) if "text" in p else len(msgspec.json.encode(p)) for p in plain)
    assert grown.bytes == held
