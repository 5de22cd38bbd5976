"""protocol.Message: UIMessage dicts go in and come back equal; bad input names its field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import InvalidMessage, Message, coerce_message
from protocol.message import format_js_iso, message_from_stored

RICH: dict[str, Any] = {
    "id": "m1",
    "role": "assistant",
    "parts": [
        {"type": "step-start"},
        {"type": "reasoning", "text": "thinking", "providerMetadata": {"x": {"y": 1}}},
        {"type": "text", "text": "Hello", "state": "done"},
        {
            "type": "tool-weather",
            "toolCallId": "c1",
            "state": "output-available",
            "input": {"city": "Paris"},
            "output": {"temp": 21.5, "unit": "C", "nested": [1, None, True]},
        },
        {
            "type": "dynamic-tool",
            "toolName": "calc",
            "toolCallId": "c2",
            "state": "input-available",
            "input": {},
        },
        {
            "type": "file",
            "mediaType": "image/png",
            "url": "data:image/png;base64,AAAA",
            "filename": "a.png",
        },
        {"type": "data-weather", "id": "w1", "data": {"anything": ["goes"]}},
        {"type": "source-url", "sourceId": "s", "url": "https://example.com"},
    ],
    "createdAt": "2026-01-02T03:04:05.678Z",
    "metadata": {"model": "gpt-x", "usage": {"in": 3}},
    "annotations": [{"unknown": "top-level key"}],
    "experimental_attachments": None,
}


def test_rich_dict_round_trips_equal() -> None:
    message = Message.from_dict(RICH)
    assert message.to_dict() == RICH
    assert message.created_at == datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    assert message.extra == {
        "annotations": [{"unknown": "top-level key"}],
        "experimental_attachments": None,
    }


def test_snake_case_created_at_and_datetime_are_accepted() -> None:
    when = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    m = Message.from_dict({"id": "a", "role": "user", "parts": [], "created_at": when})
    assert m.created_at == datetime(2026, 5, 6, 5, 8, 9, 123000, tzinfo=UTC)
    assert m.to_dict()["createdAt"] == "2026-05-06T05:08:09.123Z"


def test_naive_datetime_is_utc() -> None:
    m = Message(id="a", role="user", parts=[], created_at=datetime(2026, 1, 1))
    assert format_js_iso(m.created_at or datetime.now()) == "2026-01-01T00:00:00.000Z"


def test_absent_optional_keys_stay_absent() -> None:
    d = {"id": "a", "role": "user", "parts": [{"type": "text", "text": "x"}]}
    assert Message.from_dict(d).to_dict() == d


def test_coerce_accepts_message_and_dict() -> None:
    m = Message(id="a", role="user", parts=[])
    assert coerce_message(m) is m
    assert coerce_message({"id": "a", "role": "user", "parts": []}) == m


def test_text_joins_text_parts_only() -> None:
    m = Message.from_dict(
        {
            "id": "a",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "hidden"},
                {"type": "text", "text": "First."},
                {"type": "tool-x", "toolCallId": "1", "input": "tool text"},
                {"type": "text", "text": "Second."},
            ],
        }
    )
    assert m.text() == "First. Second."


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"role": "user", "parts": []}, "id"),
        ({"id": "a", "parts": []}, "role"),
        ({"id": "a", "role": "user"}, "parts"),
        ({"id": 1, "role": "user", "parts": []}, "id"),
        ({"id": "", "role": "user", "parts": []}, "id"),
        ({"id": "a", "role": None, "parts": []}, "role"),
        ({"id": "a", "role": "user", "parts": "text"}, "parts"),
        ({"id": "a", "role": "user", "parts": ["text"]}, "parts[0]"),
        (
            {"id": "a", "role": "user", "parts": [{"type": "text"}, {"text": "no type"}]},
            "parts[1].type",
        ),
        ({"id": "a", "role": "user", "parts": [], "createdAt": "yesterday"}, "createdAt"),
        ({"id": "a", "role": "user", "parts": [], "createdAt": 1234}, "createdAt"),
    ],
)
def test_bad_messages_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        Message.from_dict(data)
    assert info.value.field == field
    assert field in str(info.value)
    assert info.value.code == "invalid"


def test_non_dict_message_is_rejected() -> None:
    with pytest.raises(InvalidMessage) as info:
        Message.from_dict(["not", "a", "dict"])  # type: ignore[arg-type]
    assert info.value.field == "message"


def test_reserved_keys_cannot_hide_in_extra() -> None:
    with pytest.raises(InvalidMessage):
        Message(id="a", role="user", parts=[], extra={"createdAt": "x"})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
parts = st.lists(
    st.dictionaries(st.text(max_size=8).filter(lambda k: k != "type"), json_values, max_size=4).flatmap(
        lambda d: st.text(max_size=12).map(lambda t: {"type": t, **d})
    ),
    max_size=5,
)
extras = st.dictionaries(
    st.text(max_size=10).filter(
        lambda k: k not in {"id", "role", "parts", "createdAt", "created_at", "metadata"}
    ),
    json_values,
    max_size=3,
)


@given(
    id_=st.text(min_size=1, max_size=20),
    role=st.text(min_size=1, max_size=10),
    parts=parts,
    extra=extras,
)
def test_any_uimessage_round_trips(
    id_: str, role: str, parts: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    data = {"id": id_, "role": role, "parts": parts, **extra}
    assert Message.from_dict(data).to_dict() == data


# -- what JSON cannot carry (issue 12) -----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (float("nan"), "parts[0].v"),
        (float("inf"), "parts[0].v"),
        (-float("inf"), "parts[0].v"),
        ([1.0, {"deep": float("nan")}], "parts[0].v[1].deep"),
    ],
)
def test_nan_and_infinity_are_refused_not_stored_as_null(value: Any, field: str) -> None:
    with pytest.raises(InvalidMessage, match="JSON has no NaN or Infinity") as info:
        coerce_message({"id": "m", "role": "user", "parts": [{"type": "data-x", "v": value}]})
    assert info.value.field == field


def test_nan_in_metadata_extra_and_a_message_instance_is_refused() -> None:
    base: dict[str, Any] = {"id": "m", "role": "user", "parts": []}
    for data, field in (
        ({**base, "metadata": {"score": float("nan")}}, "metadata.score"),
        ({**base, "custom": [float("inf")]}, "message.custom[0]"),
    ):
        with pytest.raises(InvalidMessage) as info:
            coerce_message(data)
        assert info.value.field == field
    built = Message(id="m", role="user", parts=[{"type": "x", "v": float("nan")}])
    with pytest.raises(InvalidMessage, match=r"parts\[0\]\.v"):
        coerce_message(built)


def test_a_self_referencing_part_is_invalid_not_a_recursion_error() -> None:
    part: dict[str, Any] = {"type": "text", "text": "loop"}
    part["self"] = part
    with pytest.raises(InvalidMessage, match="nests deeper than 128 levels") as info:
        coerce_message({"id": "m", "role": "user", "parts": [part]})
    assert info.value.field.startswith("parts[0].self.self")
    assert len(info.value.field) < 100  # not a thousand ".self"s


def test_nesting_is_bounded_below_what_a_decoder_reads_back() -> None:
    def nested(depth: int) -> Any:
        value: Any = []
        for _ in range(depth):
            value = [value]
        return value

    # The message is level 1, its parts list 2, the part 3: 125 more fit under 128.
    ok = {"id": "m", "role": "user", "parts": [{"type": "x", "v": nested(124)}]}
    assert coerce_message(ok).parts == ok["parts"]
    too_deep = {"id": "m", "role": "user", "parts": [{"type": "x", "v": nested(125)}]}
    with pytest.raises(InvalidMessage, match="nests deeper"):
        coerce_message(too_deep)


def test_non_string_keys_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="has a key of type int") as info:
        coerce_message({"id": "m", "role": "user", "parts": [{"type": "x", "v": {1: "a"}}]})
    assert info.value.field == "parts[0].v"


@pytest.mark.parametrize(
    "created",
    [
        "0001-01-01T00:30:00+01:00",  # before datetime.min once in UTC
        "9999-12-31T23:30:00-01:00",  # after datetime.max once in UTC
        datetime(1, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_out_of_range_dates_are_invalid_not_overflow(created: Any) -> None:
    with pytest.raises(InvalidMessage, match=r"outside the years 1\.\.9999") as info:
        coerce_message({"id": "m", "role": "user", "parts": [], "createdAt": created})
    assert info.value.field == "createdAt"


@pytest.mark.parametrize("year", [1, 5, 999])
def test_early_years_render_with_four_digits_and_read_back(year: int) -> None:
    # strftime("%Y") gave "5" on glibc, which fromisoformat refuses: stored, never read.
    when = datetime(year, 3, 4, 5, 6, 7, 8000, tzinfo=UTC)
    rendered = format_js_iso(when)
    assert rendered == f"{year:04d}-03-04T05:06:07.008Z"
    data = Message.from_dict({"id": "m", "role": "user", "parts": [], "createdAt": rendered}).to_dict()
    assert data["createdAt"] == rendered
    assert message_from_stored(data) is not None
