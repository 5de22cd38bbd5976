"""AG-UI's state as context blocks (hub/adapters/aguistate.py): RFC 6902 on a document, the
input state as a patch, and block events as STATE_DELTA. The door itself, with the real
client applying the deltas, is tests/js7/agui.test.mjs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from hub.adapters.aguistate import StateTracker, patch_document, pointer, state_patch
from protocol import InvalidInput
from protocol.records import Event

DOC = {"foo": ["bar", "baz"], "a/b": 1, "m~n": 2}


@pytest.mark.parametrize(
    ("patch", "after"),
    [
        # RFC 6902, appendix A, on a smaller document.
        ([{"op": "add", "path": "/foo/1", "value": "qux"}], {**DOC, "foo": ["bar", "qux", "baz"]}),
        ([{"op": "add", "path": "/foo/-", "value": "end"}], {**DOC, "foo": ["bar", "baz", "end"]}),
        ([{"op": "remove", "path": "/foo/0"}], {**DOC, "foo": ["baz"]}),
        ([{"op": "replace", "path": "/a~1b", "value": 9}], {**DOC, "a/b": 9}),
        ([{"op": "replace", "path": "/m~0n", "value": 3}], {**DOC, "m~n": 3}),
        ([{"op": "move", "from": "/a~1b", "path": "/c"}], {"foo": ["bar", "baz"], "m~n": 2, "c": 1}),
        ([{"op": "copy", "from": "/foo/0", "path": "/d"}], {**DOC, "d": "bar"}),
        ([{"op": "test", "path": "/foo", "value": ["bar", "baz"]}], DOC),
        ([{"op": "replace", "path": "", "value": {"x": 1}}], {"x": 1}),
    ],
)
def test_every_operation_applies_to_a_copy(patch: list[dict[str, Any]], after: Any) -> None:
    before = {"foo": ["bar", "baz"], "a/b": 1, "m~n": 2}
    assert patch_document(before, patch) == after
    assert before == DOC


@pytest.mark.parametrize(
    "patch",
    [
        {"op": "add"},
        [{"op": "add", "path": "/x"}],
        [{"op": "remove", "path": "/nope"}],
        [{"op": "replace", "path": "/nope", "value": 1}],
        [{"op": "add", "path": "/foo/9", "value": 1}],
        [{"op": "add", "path": "no-slash", "value": 1}],
        [{"op": "test", "path": "/a~1b", "value": 2}],
        [{"op": "move", "from": "/foo", "path": "/foo/0"}],
        [{"op": "frobnicate", "path": "/foo"}],
        [{"op": "add", "path": "/x", "value": 1}, {"op": "remove", "path": "/nope"}],
        ["add"],
    ],
)
def test_a_bad_patch_is_invalid_and_changes_nothing(patch: Any) -> None:
    doc = {"foo": ["bar", "baz"], "a/b": 1, "m~n": 2}
    with pytest.raises(InvalidInput):
        patch_document(doc, patch)
    assert doc == DOC


def test_the_input_state_is_a_patch_against_the_snapshot() -> None:
    current = {"contextBlocks": {"memory": "tea", "a/b": "x"}}
    assert state_patch(current, None) == []
    assert state_patch(current, {}) == []  # what HttpAgent sends by default
    assert state_patch(current, {"contextBlocks": {"memory": "tea"}}) == []
    assert state_patch(current, {"contextBlocks": {"memory": "coffee", "a/b": "y", "new": "z"}}) == [
        {"op": "replace", "path": "/contextBlocks/memory", "value": "coffee"},
        {"op": "replace", "path": "/contextBlocks/a~1b", "value": "y"},
        {"op": "add", "path": "/contextBlocks/new", "value": "z"},
    ]
    for bad in ("text", {"contextBlocks": ["memory"]}):
        with pytest.raises(InvalidInput):
            state_patch(current, bad)


def _event(kind: str, **data: Any) -> Event:
    return Event(session_id="s", seq=1, type=kind, data=data, epoch="e", created_at=datetime.now(UTC))


def test_block_events_are_deltas_the_snapshot_accepts() -> None:
    snapshot = {"contextBlocks": {"memory": "tea"}}
    tracker = StateTracker(snapshot)
    added = {"label": "notes", "content": "n", "is_skill": False, "is_searchable": False}
    skill = {"label": "skills", "content": "", "is_skill": True, "is_searchable": False}
    events = [
        _event("context.updated", label="memory", content="coffee"),
        _event("context.updated", label="memory", content="coffee"),  # no change: no delta
        _event("context.added", block=added),
        _event("context.added", block=skill),  # a keyed store: not in the state
        _event("context.removed", label="memory"),
        _event("context.entry_set", label="skills", key="k", content="x"),
    ]
    deltas = [tracker.delta(e) for e in events]
    assert deltas == [
        [{"op": "replace", "path": pointer("memory"), "value": "coffee"}],
        None,
        [{"op": "add", "path": pointer("notes"), "value": "n"}],
        None,
        [{"op": "remove", "path": pointer("memory")}],
        None,
    ]
    state: Any = snapshot
    for delta in deltas:
        if delta:
            state = patch_document(state, delta)
    assert state == {"contextBlocks": {"notes": "n"}}
