"""hub/store/sqlite/packing.py: stored forms that read back byte for byte."""

from __future__ import annotations

import pytest

from hub.store.rows import message_json, text_of
from hub.store.sqlite.packing import (
    DEFLATE_AT,
    EVENT_TYPES,
    ROLES,
    appended_data,
    inflated,
    packed,
    role_code,
    role_name,
    stored_message,
    stored_text,
    type_code,
    type_name,
    unpacked,
)
from protocol import Message
from tests.support.hubtest import noise


@pytest.mark.parametrize(
    "message",
    [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello"}]},
        {"id": "m2", "role": "assistant", "parts": [{"type": "text", "text": ""}]},
        {"id": 'é"\\\n', "role": "x\u2028y", "parts": [{"type": "text", "text": 'a"}]}'}]},
        {"id": "m3", "role": "user", "parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"id": "m4", "role": "user", "parts": [{"type": "text", "text": "t", "extra": 1}]},
        {"id": "m5", "role": "tool", "parts": []},
        {"id": "m6", "role": "user", "parts": [{"type": "text", "text": "t"}], "metadata": {"a": 1}},
        {
            "id": "m7",
            "role": "user",
            "parts": [{"type": "text", "text": "t"}],
            "createdAt": "2025-01-01T00:00:00.000Z",
        },
    ],
)
def test_a_message_reads_back_byte_for_byte(message: dict[str, object]) -> None:
    m = Message.from_dict(message)
    content = message_json(m)
    stored = packed(content, m.id, m.role)
    assert len(stored) < len(content)
    assert stored[:1] in ('"', ",", "}")
    assert unpacked(stored, m.id, m.role) == content
    # The role as stored (a code for the usual ones) reads back the same.
    assert unpacked(stored, m.id, role_code(m.role)) == content
    assert stored_message(stored, m.id, role_code(m.role)) == m
    assert stored_text(stored, m.id, role_code(m.role)) == text_of(content) == m.text()


def test_the_common_message_keeps_only_its_text_string() -> None:
    m = Message.from_dict({"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi there"}]})
    assert packed(message_json(m), m.id, m.role) == '"hi there"'


@pytest.mark.parametrize(
    "content", ['{"id": "m1", "role": "user"}', "{not json", '{"role":"user","id":"m1"}']
)
def test_json_the_store_did_not_write_is_kept_whole(content: str) -> None:
    assert packed(content, "m1", "user") == content
    assert unpacked(content, "m1", "user") == content


def test_event_type_codes_keep_their_meaning() -> None:
    # Codes are on disk: the list only ever grows at the end.
    assert EVENT_TYPES[:5] == (
        "message.appended",
        "message.updated",
        "message.deleted",
        "messages.cleared",
        "compaction.added",
    )
    assert type_code("message.appended") == 0
    assert all(type_name(type_code(t)) == t for t in EVENT_TYPES)
    assert type_code("custom.thing") == "custom.thing" == type_name("custom.thing")


def test_role_codes_keep_their_meaning() -> None:
    assert ROLES[:2] == ("user", "assistant")
    assert role_code("user") == 0 and role_code("assistant") == 1
    assert all(role_name(role_code(r)) == r for r in ROLES)
    assert role_code("critic") == "critic" == role_name("critic")


PROSE = (
    "The hub keeps every conversation as a tree of messages, and a long answer from the "
    "model repeats the words of the question it answers. "
)


@pytest.mark.parametrize(
    "message",
    [
        {"id": "long", "role": "assistant", "parts": [{"type": "text", "text": PROSE * 20}]},
        {
            "id": "tools",
            "role": "assistant",
            "parts": [
                {"type": "text", "text": PROSE * 6},
                {
                    "type": "tool-search",
                    "toolCallId": "c1",
                    "state": "output-available",
                    "output": PROSE * 12,
                },
            ],
        },
        {"id": "ü", "role": "user", "parts": [{"type": "text", "text": "Grüße, 世界 🙂 " * 200}]},
    ],
)
def test_a_long_message_is_deflated_and_reads_back_byte_for_byte(message: dict[str, object]) -> None:
    m = Message.from_dict(message)
    content = message_json(m)
    stored = packed(content, m.id, m.role)
    assert isinstance(stored, bytes)
    assert len(stored) < len(content.encode()) / 2
    assert inflated(stored)[:1] in ('"', ",")
    assert unpacked(stored, m.id, role_code(m.role)) == content
    assert stored_message(stored, m.id, role_code(m.role)) == m
    assert stored_text(stored, m.id, role_code(m.role)) == m.text()
    parent = appended_data(stored, m.id, role_code(m.role), None, "p1")
    assert parent == {"message": m.to_dict(), "parent_id": "p1"}


def test_what_does_not_deflate_by_a_fifth_stays_text() -> None:
    m = Message.from_dict(
        {"id": "n", "role": "user", "parts": [{"type": "text", "text": noise(5000, seed=3)}]}
    )
    stored = packed(message_json(m), m.id, m.role)
    assert isinstance(stored, str)
    # Just under the bound nothing is deflated, however well it would.
    short = Message.from_dict(
        {"id": "s", "role": "user", "parts": [{"type": "text", "text": "a" * (DEFLATE_AT - 3)}]}
    )
    assert packed(message_json(short), short.id, short.role) == '"' + "a" * (DEFLATE_AT - 3) + '"'
