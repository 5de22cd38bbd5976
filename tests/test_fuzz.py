"""Fuzzing the hub over a real socket: every text frame gets a typed answer, never
``internal``, and the hub keeps serving others.

A seeded generator (deterministic in CI, a fixed budget of frames) against a real uvicorn
on 127.0.0.1:0 with raw ``websockets`` clients: wrong types for every field of every request
type, deep nesting, numbers beyond int64 and beyond a double, lone surrogates, dates outside
the calendar, broken messages, unknown ops, frames that are not JSON objects. Binary frames
and invalid UTF-8 are answered by a close (1003 / 1007): that is their defined answer.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import ReadonlyText, SessionManager, SqliteStore
from hub.server import HubConfig
from protocol.codec import FrameError, decode_request
from protocol.frames import ERROR_CODES, REQUEST_TYPES

from .hubtest import Client, Frame, Served, served, text
from .test_protocol import MSG, VALID

SEED = 20260112
#: Frames sent by the random part of the run (the systematic part adds ~2 per field).
RANDOM_FRAMES = 1500
BATCH = 50
#: A frame nested this deep is ~2 KB, as in the issue, and past the decoder's reach.
DEEP = 1000

#: Values of the wrong type (or out of range) for any field.
BAD_VALUES: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    -(2**63) - 1,
    2**64 + 5,
    10**30,
    1.5,
    1e308,
    -0.0,
    "",
    "x" * 300,
    "\ud800",  # a lone surrogate: json.dumps writes it as the escape \ud800
    "0001-01-01T00:30:00+01:00",
    [],
    [1, "a", None],
    {},
    {"a": {"b": [1]}},
]

#: Raw text frames: numbers no double holds, nesting, not objects, not JSON.
RAW_FRAMES: list[str] = [
    '{"op":"ping","id":1,"x":' + "[" * DEEP + "]" * DEEP + "}",
    '{"x":' + "[" * DEEP + "]" * DEEP + ',"op":"ping","id":1}',
    '{"op":"ping","id":' + "[" * DEEP + "]" * DEEP + "}",
    '{"op":"search","id":1,"query":"q","limit":1e400}',
    '{"op":"search","id":1,"query":"q","limit":' + "9" * 5000 + "}",
    '{"op":"add_usage","id":1,"session_id":"s","input_tokens":1,"output_tokens":1,"cost":-1e400}',
    '{"op":"ping","id":1e400}',
    '{"op":"ping","id":NaN}',
    '{"op":"ping","id":Infinity}',
    '{"op":"ping","id":1,}',
    '{"op":"ping","id":"\\ud800"}',
    '{"op":"create","id":1,"name":"\\udfff"}',
    "[" * DEEP + "]" * DEEP,
    "",
    "null",
    "[]",
    '"ping"',
    "{",
    "not json",
    '{"op":"ping"}',
    '{"id":1}',
    '{"op":null,"id":1}',
]


_DEEP = re.compile(r'"@@deep:(\d+)@@"')


def deep(depth: int) -> str:
    """A placeholder :func:`dumps` writes as ``depth`` nested arrays (json.dumps itself
    recurses, and would fail at the depths the hub must survive)."""
    return f"@@deep:{depth}@@"


def dumps(value: Any) -> str:
    return _DEEP.sub(lambda m: "[" * int(m[1]) + "]" * int(m[1]), json.dumps(value))


def bad_messages(rng: random.Random) -> Iterator[Any]:
    """Messages broken in one place each."""
    yield {**MSG, "createdAt": rng.choice(["0001-01-01T00:30:00+01:00", "9999-12-31T23:59:59-05:00", 5])}
    yield {**MSG, "parts": [{"type": "x", "v": deep(rng.randint(200, 400))}]}
    yield {**MSG, "parts": [{"type": "text", "text": "\ud800"}]}
    yield {**MSG, "parts": [{"type": "x", "n": 2**64 + rng.randint(0, 9)}]}
    yield {**MSG, "parts": [rng.choice(BAD_VALUES)]}
    yield {**MSG, "parts": [{"type": rng.choice(BAD_VALUES)}]}
    yield {**MSG, "id": rng.choice(BAD_VALUES)}
    yield {**MSG, "role": rng.choice(BAD_VALUES)}
    yield {**MSG, "metadata": {"m": rng.choice(BAD_VALUES)}}
    yield {k: v for k, v in MSG.items() if k != rng.choice(["id", "role", "parts"])}


def frames(session_id: str, rng: random.Random) -> Iterator[str]:
    """Every field of every request type with wrong values, then random mutations."""
    ops = sorted(REQUEST_TYPES)

    def base(op: str) -> dict[str, Any]:
        fields = dict(VALID.get(op, {}))
        if "session_id" in fields and fields["session_id"] is not None:
            fields["session_id"] = session_id
        return fields

    rid = 0

    def encode(op: Any, fields: dict[str, Any]) -> str:
        nonlocal rid
        rid += 1
        return dumps({"op": op, "id": rid, **fields})

    for op in ops:
        names = ["id", *(f.encode_name for f in msgspec.structs.fields(REQUEST_TYPES[op]))]
        for name in dict.fromkeys(names):
            for value in rng.sample(BAD_VALUES, 2):
                if name == "id":
                    yield dumps({"op": op, "id": value, **base(op)})
                else:
                    yield encode(op, {**base(op), name: value})
    for op in ("append", "upsert", "update_message"):
        for message in bad_messages(rng):
            yield encode(op, {**base(op), "message": message})
    for message in bad_messages(rng):
        yield encode("append_all", {**base("append_all"), "messages": [MSG, message]})
    yield from RAW_FRAMES
    for _ in range(RANDOM_FRAMES):
        kind = rng.random()
        op = rng.choice(ops)
        fields = base(op)
        if kind < 0.5 and fields:  # one field wrong
            fields[rng.choice(sorted(fields))] = rng.choice(BAD_VALUES)
        elif kind < 0.6 and fields:  # one field missing
            del fields[rng.choice(sorted(fields))]
        elif kind < 0.7:  # an unknown field
            fields["extra_" + str(rng.randint(0, 9))] = rng.choice(BAD_VALUES)
        elif kind < 0.8:  # an unknown op
            op = rng.choice(["nope", "PING", "append ", "", "__class__", "get_history\x00"])
        elif kind < 0.9:  # a deep value somewhere
            fields[rng.choice([*sorted(fields), "x"])] = deep(rng.randint(100, 1500))
        else:  # a huge number somewhere
            name = rng.choice([*sorted(fields), "id"]) if fields else "id"
            value = rng.choice(["1e999", "-1e999", "9" * rng.randint(19, 5000), "18446744073709551616"])
            body = {"op": op, "id": 1, **fields}
            body.pop(name, None)
            yield dumps(body)[:-1] + f', "{name}": {value}}}'
            continue
        yield encode(op, fields)


async def answer_to(client: Client, frame: str) -> Frame:
    """Send one frame and take the first reply, error (or, to a subscribe, reset) after it."""
    await client.send_raw(frame)
    return await client.take(lambda f: f["frame"] in ("reply", "error", "reset"))


async def responsive(observer: Client) -> None:
    assert (await observer.request("ping"))["frame"] == "reply"


@pytest.fixture
async def hub(tmp_path: Path) -> Any:
    store = await SqliteStore.open(tmp_path / "fuzz.db")
    manager = (
        SessionManager(store)
        .with_context("soul", provider=ReadonlyText("You are helpful."))
        .with_context("memory", max_tokens=50)
    )
    try:
        async with served(manager=manager) as h:
            yield h
    finally:
        await store.close()


async def test_every_text_frame_gets_a_typed_answer(hub: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    rng = random.Random(SEED)
    started = time.perf_counter()
    codes: dict[str, int] = {}
    sent = 0
    async with hub.client() as fuzzer, hub.client() as observer:
        session = await fuzzer.call("create", name="fuzzed")
        await fuzzer.call("append", session_id=session["id"], message=text("m1", "hello"))
        for i, frame in enumerate(frames(session["id"], rng)):
            answer = await answer_to(fuzzer, frame)
            sent += 1
            if answer["frame"] == "error":
                assert answer["code"] in ERROR_CODES and answer["code"] != "internal", (frame[:300], answer)
                codes[answer["code"]] = codes.get(answer["code"], 0) + 1
            else:
                codes[answer["frame"]] = codes.get(answer["frame"], 0) + 1
            if i % BATCH == BATCH - 1:
                await responsive(observer)
        await responsive(fuzzer)  # the fuzzed connection itself survived every frame
        await responsive(observer)
    elapsed = time.perf_counter() - started
    # Nothing the hub logged as a failure (an "op ... failed" traceback is an internal error).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sent > 500 and codes.get("invalid", 0) > 100, codes
    assert elapsed < 30, f"{sent} frames took {elapsed:.1f}s"
    print(f"{sent} frames in {elapsed:.2f}s: {codes}")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"op": "search", "query": "hello", "limit": 2**63}, "limit"),
        ({"op": "session_search", "query": "hello", "limit": 2**64 + 1}, "limit"),
        ({"op": "add_usage", "input_tokens": 2**63, "output_tokens": 0, "cost": 0.0}, "input_tokens"),
        ({"op": "add_usage", "input_tokens": 0, "output_tokens": 0, "cost": 1e308}, "nothing was added"),
        ({"op": "append", "message": {**MSG, "createdAt": "0001-01-01T00:30:00+01:00"}}, "createdAt"),
    ],
)
async def test_out_of_range_values_are_invalid_over_the_wire(
    hub: Served, caplog: pytest.LogCaptureFixture, fields: dict[str, Any], problem: str
) -> None:
    """Each was `internal` with a server traceback (issue 12, item 10)."""
    caplog.set_level(logging.ERROR)
    async with hub.client() as c:
        session = await c.call("create", name="s")
        await c.call("add_usage", session_id=session["id"], input_tokens=1, output_tokens=1, cost=1e308)
        await c.call("append", session_id=session["id"], message=text("m0", "hello"))
        op = fields.pop("op")
        if op != "search":
            fields["session_id"] = session["id"]
        answer = await c.request(op, **fields)
        assert answer["frame"] == "error" and answer["code"] == "invalid", answer
        assert problem in answer["message"]
        # The registry still reads for everyone.
        listed = await c.call("list")
        assert [s["estimated_cost"] for s in listed] == [1e308]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_deeply_nested_frame_is_invalid_and_the_connection_survives(hub: Served) -> None:
    """The issue's 2 KB frame closed the socket with 1006, before auth, without an answer."""
    async with hub.client() as c:
        await c.send_raw('{"op":"ping","id":1,"x":' + "[" * DEEP + "]" * DEEP + "}")
        answer = await c.take(lambda f: f["frame"] == "error")
        assert answer["code"] == "invalid"
        assert (await c.request("ping"))["frame"] == "reply"
        assert c.close_code is None


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b'{"op":"ping","id":1}', 1003),  # a binary frame
        (b"\x00\xff\xfe", 1003),
    ],
)
async def test_binary_frames_close_with_1003(hub: Served, payload: bytes, code: int) -> None:
    async with hub.client() as observer, hub.client() as c:
        await c.ws.send(payload)
        assert (await c.wait_closed())[0] == code
        await responsive(observer)


@pytest.mark.parametrize("payload", [b'{"op":"ping","id":1,"x":"\xff"}', b"\xc3\x28", b"\xed\xa0\x80"])
async def test_invalid_utf8_text_frames_close_with_1007(hub: Served, payload: bytes) -> None:
    async with hub.client() as observer, hub.client() as c:
        await c.ws.send(payload, text=True)  # a text frame whose bytes are not UTF-8
        assert (await c.wait_closed())[0] == 1007
        await responsive(observer)


# -- stream ops and junk after JSON (issue 24, items 9 and 10) ---------------------------------

#: What may follow (or precede) a valid frame in one text frame; each once made the hub's
#: fallback parse raise past every handler (1006, no answer) when validation failed first.
JUNK = ["x", " x", "}", "{}", "[]", ",", "\x00", "\ufeff", "null", '"', "\\", "1e999", "\u2028", "/*"]


def _junky(rng: random.Random, frame: str) -> str:
    junk = rng.choice(JUNK) * rng.randint(1, 3)
    return rng.choice([frame + junk, junk + frame, "\ufeff" + frame, frame[: rng.randint(1, len(frame))]])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(sorted(REQUEST_TYPES)),
    prefix=st.sampled_from(["", "\ufeff", " ", "x", "[", "{}"]),
    suffix=st.one_of(st.sampled_from(JUNK), st.text(max_size=8)),
    fields=st.dictionaries(
        st.sampled_from(["id", "session_id", "message_id", "kind", "text", "part", "turn_id", "x"]),
        st.one_of(
            st.none(),
            st.integers(),
            st.text(max_size=4),
            st.just("@@deep:1500@@"),
            st.lists(st.integers(), max_size=2),
        ),
        max_size=4,
    ),
    as_bytes=st.booleans(),
)
def test_decode_request_answers_every_frame_with_a_frame_error(
    op: str, prefix: str, suffix: str, fields: dict[str, Any], as_bytes: bool
) -> None:
    """Whatever surrounds a frame, the decoder returns a request or raises FrameError with a
    known code: never another exception (the socket loop reads those as a dead socket)."""
    frame = prefix + dumps({"op": op, **fields}) + suffix
    data: str | bytes = frame.encode("utf-8", "surrogatepass") if as_bytes else frame
    code: str | None = None
    try:
        decode_request(data)
    except FrameError as exc:
        code = exc.frame.code
    assert code is None or (code in ERROR_CODES and code != "internal"), (frame[:200], code)


def stream_frames(session_id: str, rng: random.Random) -> Iterator[str]:
    """stream_start / stream_delta / stream_end with bad ids, unknown streams, fields that are
    not theirs, deltas over the frame and the stream limits, and junk after the JSON."""
    mid = "fz-1"
    rid = 10_000

    def frame(op: str, **fields: Any) -> str:
        nonlocal rid
        rid += 1
        return dumps({"op": op, "id": rid, **fields})

    ok = {"session_id": session_id, "message_id": mid}
    yield frame("stream_start", **ok)
    # Decodable, but deeper than a stored message may nest: refused like an appended one.
    yield frame("stream_delta", **ok, kind="tool", part={"type": "tool-x", "toolCallId": "d", "v": deep(200)})
    for value in BAD_VALUES:
        yield frame("stream_start", session_id=session_id, message_id=value)
        yield frame("stream_delta", **{**ok, "message_id": value}, kind="text", text="x")
        yield frame("stream_delta", **ok, kind="text", text=value)
        yield frame("stream_delta", **ok, kind="tool", part=value)
        yield frame("stream_end", **ok, status=value)
        yield frame("stream_start", session_id=session_id, message_id="fz-t", turn_id=value)
    for _ in range(40):
        choice = rng.random()
        if choice < 0.3:
            yield frame("stream_delta", **ok, kind="text", text="y" * rng.choice([1, 700, 1500]))
        elif choice < 0.4:
            yield frame("stream_delta", **ok, kind="text", text="z" * (2 << 20))  # over the frame limit
        elif choice < 0.5:
            yield frame("stream_delta", **ok, kind="text", text="t", index=rng.choice([-1, 0, 2**63]))
        elif choice < 0.6:
            yield frame("stream_delta", session_id="no-such", message_id=mid, kind="text", text="x")
        elif choice < 0.7:
            yield frame("stream_delta", **ok, kind="tool", part={"type": "tool-x", "v": deep(1500)})
        else:
            yield _junky(rng, frame(rng.choice(["stream_delta", "stream_end", "stream_start"]), **ok))
    yield frame("stream_end", **ok)


async def test_stream_ops_get_typed_answers_and_a_stream_ends_too_large(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    rng = random.Random(SEED)
    codes: dict[str, int] = {}
    store = await SqliteStore.open(tmp_path / "streams.db")
    try:
        config = HubConfig(max_stream_bytes=4096)
        async with (
            served(manager=SessionManager(store), config=config) as h,
            h.client() as fuzzer,
            h.client() as watcher,
        ):
            session = await fuzzer.call("create", name="streams")
            await watcher.call("subscribe", session_id=session["id"])
            for data in stream_frames(session["id"], rng):
                answer = await answer_to(fuzzer, data)
                if answer["frame"] == "error":
                    assert answer["code"] in ERROR_CODES and answer["code"] != "internal", (
                        data[:200],
                        answer,
                    )
                    codes[answer["code"]] = codes.get(answer["code"], 0) + 1
                else:
                    codes[answer["frame"]] = codes.get(answer["frame"], 0) + 1
            await responsive(fuzzer)
            end = await watcher.take(lambda f: f["frame"] == "stream" and f["action"] == "end")
            stored = await SessionManager(store).get_session(session["id"]).get_message("fz-1")
        assert end["status"] == "too_large", end
        assert stored is not None and 0 < len(stored.text()) <= 4096
        assert stored.to_dict()["parts"] == end["message"]["parts"]
        assert all(p.get("toolCallId") != "d" for p in stored.parts), (
            "a part deeper than 128 levels was stored"
        )
    finally:
        await store.close()
    assert {"too_large", "invalid", "bad_frame"} <= codes.keys(), codes
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    print(f"stream ops: {sum(codes.values())} frames: {codes}")
