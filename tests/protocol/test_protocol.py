"""The sans-I/O protocol: decoding requests, the error answers, connection state on both
sides, and the committed JSON schema. No sockets here."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub.auth import Grant
from protocol.clientconn import (
    ClientConnection,
    Delivered,
    Failed,
    Ignored,
    Reset,
    Resolved,
)
from protocol.codec import FrameError, decode_frame, decode_request, encode
from protocol.frames import (
    ERROR_CODES,
    REQUEST_TYPES,
    Append,
    ErrorFrame,
    EventFrame,
    ReplyFrame,
    ResetFrame,
    RunTool,
    Subscribe,
)
from protocol.serverconn import Refused, ServerConnection

ROOT = Path(__file__).resolve().parents[2]

MSG = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}

#: A valid frame for every op: the fields besides ``op`` and ``id``.
CHECKPOINT: dict[str, Any] = {
    "thread_id": "s1",
    "ns": "",
    "checkpoint_id": "c1",
    "parent_id": None,
    "type": "msgpack",
    "data": "AP8=",
    "metadata": {"step": 0},
    "writes": [],
}

VALID: dict[str, dict[str, Any]] = {
    "create": {"name": "chat", "parent_session_id": None, "model": "m", "source": "s"},
    "get": {"session_id": "s1"},
    "list": {},
    "rename": {"session_id": "s1", "name": "new"},
    "delete": {"session_id": "s1"},
    "end": {"session_id": "s1", "reason": "done"},
    "append": {"session_id": "s1", "message": MSG, "parent_id": None},
    "upsert": {"session_id": "s1", "message": MSG, "parent_id": "m0"},
    "append_all": {"session_id": "s1", "messages": [MSG, {**MSG, "id": "m2"}]},
    "get_history": {"session_id": "s1", "leaf_id": "m1"},
    "get_branches": {"session_id": "s1", "message_id": "m1"},
    "get_message_count": {"session_id": "s1"},
    "clear_messages": {"session_id": "s1"},
    "delete_messages": {"session_id": "s1", "ids": ["m1", "m2"]},
    "fork": {"session_id": "s1", "at_message_id": "m1", "name": "fork"},
    "add_compaction": {"session_id": "s1", "summary": "sum", "from_id": "m1", "to_id": "m2"},
    "get_compactions": {"session_id": "s1"},
    "compact_and_split": {"session_id": "s1", "summary": "sum", "name": None},
    "add_usage": {"session_id": "s1", "input_tokens": 10, "output_tokens": 5, "cost": 0.25},
    "search": {"query": "hello world", "limit": 5},
    "get_message": {"session_id": "s1", "message_id": "m1"},
    "get_latest_leaf": {"session_id": "s1"},
    "get_path_length": {"session_id": "s1", "leaf_id": None},
    "update_message": {"session_id": "s1", "message": MSG},
    "session_search": {"session_id": "s1", "query": "hi", "limit": 3},
    "get_context_blocks": {"session_id": "s1"},
    "get_context_block": {"session_id": "s1", "label": "memory"},
    "replace_context_block": {"session_id": "s1", "label": "memory", "content": "x"},
    "append_context_block": {"session_id": "s1", "label": "memory", "content": "y"},
    "freeze_system_prompt": {"session_id": "s1"},
    "refresh_system_prompt": {"session_id": "s1"},
    "tools": {"session_id": None},
    "run_tool": {"session_id": "s1", "name": "set_context", "arguments": {"label": "memory"}},
    "compact": {"session_id": "s1", "leaf_id": "m2"},
    "estimate_tokens": {"session_id": "s1", "leaf_id": None},
    "read_events": {"session_id": None, "after_seq": 3, "limit": 10},
    "prune_events": {"older_than": 86400.0, "keep_per_session": 100, "batch": 500},
    "subscribe": {"session_id": "s1", "after_seq": 4, "epoch": "e1"},
    "unsubscribe": {"session_id": None},
    "ping": {},
    "hello": {"name": "worker-1", "role": "worker", "sessions": ["s1"]},
    "presence": {"session_id": "s1"},
    "summary": {"request_id": "r1", "summary": "the summary"},
    "auth": {"token": "a.new.token"},
    "stream_start": {"session_id": "s1", "message_id": "a1", "role": "assistant", "parent_id": None},
    "stream_delta": {"session_id": "s1", "message_id": "a1", "kind": "text", "text": "Hel"},
    "stream_end": {"session_id": "s1", "message_id": "a1", "status": "aborted"},
    "take_turns": {},
    "start_turn": {"session_id": "s1", "message_id": "m1", "trigger": "regenerate-message"},
    "get_turn": {"session_id": "s1"},
    "stop_turn": {"session_id": "s1", "turn_id": "t1"},
    "answer_tool": {"session_id": "s1", "approval_id": "a1", "approved": True},
    "steer_turn": {"session_id": "s1", "message": {"id": "m1", "role": "user", "parts": []}},
    "turn_failed": {"turn_id": "t1", "error": "no model"},
    "export": {"session_ids": ["s1"]},
    "import": {"lines": ['{"sessionhub_dump": 1, "sessions": 0}'], "final": True, "replace": False},
    # A checkpoint record's bytes travel base64 (compared as msgspec renders them back).
    "checkpoint_put": {"session_id": "s1", "checkpoint": CHECKPOINT, "messages": [MSG]},
    "checkpoint_writes": {
        "session_id": "s1",
        "ns": "",
        "checkpoint_id": "c1",
        "writes": [
            {
                "task_id": "t",
                "idx": -1,
                "channel": "__error__",
                "type": "msgpack",
                "value": "AP8=",
                "task_path": "",
            }
        ],
        "replace": True,
    },
    "checkpoint_get": {"session_id": "s1", "ns": "child:1", "checkpoint_id": "c1"},
    "checkpoint_list": {"session_id": None, "ns": "", "before": "c9", "limit": 5, "filter": {"step": 1}},
    "checkpoint_delete": {"session_id": "s1"},
    "checkpoint_prune": {"session_id": "s1", "keep_latest": False},
    "checkpoint_delete_runs": {"run_ids": ["r1", "r2"]},
}


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def error_of(data: str | bytes, max_bytes: int = 1 << 20) -> ErrorFrame:
    with pytest.raises(FrameError) as caught:
        decode_request(data, max_bytes)
    result = caught.value.frame
    assert result.code in ERROR_CODES
    assert result.message
    return result


# -- decode_request: every op --------------------------------------------------------------


def test_the_table_covers_every_op() -> None:
    assert set(VALID) == set(REQUEST_TYPES)


@pytest.mark.parametrize("op", sorted(VALID))
def test_decode_every_op(op: str) -> None:
    fields = VALID[op]
    request = decode_request(frame(op=op, id=f"r-{op}", **fields))
    assert type(request) is REQUEST_TYPES[op]
    assert request.id == f"r-{op}"
    for name, value in fields.items():
        assert msgspec.to_builtins(getattr(request, name)) == value, name


@pytest.mark.parametrize("rid", [0, 7, -3, 2**53, "", "abc", "ü-ключ"])
def test_ids_are_strings_or_integers(rid: str | int) -> None:
    assert decode_request(frame(op="ping", id=rid)).id == rid


def test_bytes_frames_decode_too() -> None:
    request = decode_request(frame(op="get", id=1, session_id="s").encode())
    assert request.id == 1


def test_optional_fields_default() -> None:
    append = decode_request(frame(op="append", id=1, session_id="s", message=MSG))
    assert isinstance(append, Append)
    assert append.parent_id is msgspec.UNSET  # left out: the latest leaf
    explicit_root = decode_request(frame(op="append", id=1, session_id="s", message=MSG, parent_id=None))
    assert isinstance(explicit_root, Append) and explicit_root.parent_id is None
    subscribe = decode_request(frame(op="subscribe", id=2, session_id=None))
    assert isinstance(subscribe, Subscribe)
    assert (subscribe.session_id, subscribe.after_seq, subscribe.epoch) == (None, 0, None)
    run = decode_request(frame(op="run_tool", id=3, session_id=None, name="t", arguments='{"a": 1}'))
    assert isinstance(run, RunTool) and run.arguments == '{"a": 1}'


# -- decode_request: the error answers -----------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        "{",
        "",
        '{"op": "ping", "id": 1',
        b"\xff\xfe",
    ],
)
def test_not_json_is_a_bad_frame(data: str | bytes) -> None:
    error = error_of(data)
    assert error.code == "bad_frame"
    assert error.id is None


@pytest.mark.parametrize("data", ["[]", '[{"op": "ping", "id": 1}]', "5", '"ping"', "null", "true"])
def test_not_an_object_is_a_bad_frame(data: str) -> None:
    error = error_of(data)
    assert error.code == "bad_frame"
    assert error.id is None


def test_missing_op_is_a_bad_frame_with_the_id() -> None:
    error = error_of(frame(id=12, session_id="s"))
    assert (error.code, error.id) == ("bad_frame", 12)
    assert "op" in error.message


@pytest.mark.parametrize("op", [5, None, ["ping"], {"x": 1}, True])
def test_op_of_wrong_type_is_a_bad_frame(op: Any) -> None:
    error = error_of(frame(op=op, id="x"))
    assert (error.code, error.id) == ("bad_frame", "x")


def test_missing_id_is_a_bad_frame() -> None:
    error = error_of(frame(op="ping"))
    assert (error.code, error.id) == ("bad_frame", None)
    assert "id" in error.message


@pytest.mark.parametrize("rid", [1.5, True, False, None, [1], {"a": 1}])
def test_id_of_wrong_type_is_a_bad_frame(rid: Any) -> None:
    error = error_of(frame(op="get", id=rid, session_id="s"))
    assert error.code == "bad_frame"
    assert error.id is None  # never echo something that is not a valid id
    assert "id" in error.message


@pytest.mark.parametrize("rid", [99, "req-9"])
def test_unknown_op_echoes_the_id(rid: str | int) -> None:
    error = error_of(frame(op="launch_missiles", id=rid))
    assert (error.code, error.id) == ("unknown_op", rid)
    assert "launch_missiles" in error.message


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"op": "get", "session_id": 5}, "session_id"),
        ({"op": "get"}, "session_id"),
        ({"op": "append", "session_id": "s", "message": "hello"}, "message"),
        ({"op": "append_all", "session_id": "s", "messages": {"id": "m"}}, "messages"),
        ({"op": "add_usage", "session_id": "s", "input_tokens": "1", "output_tokens": 1, "cost": 0}, "input"),
        ({"op": "search", "query": "q", "limit": "ten"}, "limit"),
        ({"op": "subscribe", "session_id": "s", "after_seq": "3"}, "after_seq"),
        ({"op": "subscribe", "session_id": "s", "after_seq": 1.5}, "after_seq"),
        ({"op": "delete_messages", "session_id": "s", "ids": "m1"}, "ids"),
        ({"op": "tools"}, "session_id"),
    ],
)
def test_wrong_field_types_are_invalid_with_the_id(fields: dict[str, Any], names: str) -> None:
    error = error_of(frame(id="r1", **fields))
    assert (error.code, error.id) == ("invalid", "r1")
    assert names in error.message


@pytest.mark.parametrize("op", sorted(VALID))
def test_unknown_extra_fields_are_invalid(op: str) -> None:
    error = error_of(frame(op=op, id=41, **VALID[op], surprise=1))
    assert (error.code, error.id) == ("invalid", 41)
    assert "surprise" in error.message


def test_too_large_echoes_a_readable_id() -> None:
    big = frame(op="append", id="big-1", session_id="s", message={**MSG, "pad": "x" * 500})
    error = error_of(big, max_bytes=200)
    assert (error.code, error.id) == ("too_large", "big-1")
    assert "200" in error.message
    # At the limit exactly, the frame is read.
    exact = frame(op="ping", id=1)
    assert decode_request(exact, max_bytes=len(exact)).id == 1
    assert error_of(exact, max_bytes=len(exact) - 1).code == "too_large"


def test_too_large_counts_bytes_not_characters() -> None:
    raw = '{"op": "ping", "id": "' + "é" * 50 + '"}'  # 72 characters, 122 bytes in UTF-8
    assert len(raw) < 80 < len(raw.encode())
    error = error_of(raw, max_bytes=80)
    assert (error.code, error.id) == ("too_large", "é" * 50)
    assert decode_request(raw, max_bytes=200).id == "é" * 50


def test_too_large_without_a_readable_id() -> None:
    error = error_of("[" + "1," * 200 + "1]", max_bytes=100)
    assert (error.code, error.id) == ("too_large", None)
    error = error_of('{"op": "ping", "id": 1, "x": "' + "y" * 300, max_bytes=100)  # not even JSON
    assert (error.code, error.id) == ("too_large", None)


# -- ClientConnection -----------------------------------------------------------------------


def event(seq: int, session_id: str = "s", epoch: str = "e1", stream: str = "session") -> bytes:
    return encode(
        EventFrame(
            stream=stream,  # type: ignore[arg-type]
            session_id=session_id,
            seq=seq,
            epoch=epoch,
            type="message.appended",
            data={"n": seq},
            created_at="2025-01-01T00:00:00+00:00",
        )
    )


def test_client_numbers_requests_and_matches_replies() -> None:
    client = ClientConnection()
    first, data = client.request("get", session_id="s")
    second, _ = client.request("ping")
    assert first != second
    assert json.loads(data) == {"op": "get", "id": first, "session_id": "s"}
    assert decode_request(data).id == first  # the server reads what the client writes
    assert client.pending == {first, second}
    effect = client.receive_text(encode(ReplyFrame(id=second, result="pong")))
    assert effect == Resolved(second, "pong")
    effect = client.receive_text(encode(ErrorFrame(id=first, code="not_found", message="no")))
    assert effect == Failed(first, "not_found", "no")
    assert client.pending == set()
    # A reply nobody asked for (or a second one) is ignored.
    assert isinstance(client.receive_text(encode(ReplyFrame(id=second, result=1))), Ignored)
    # An error about an unreadable frame has no id.
    assert client.receive_text(encode(ErrorFrame(id=None, code="bad_frame", message="x"))) == Failed(
        None, "bad_frame", "x"
    )


def test_client_positions_follow_events_and_drop_duplicates() -> None:
    client = ClientConnection()
    client.subscribe("s")
    client.subscribe(None, after_seq=10, epoch="r1")
    delivered = [client.receive_text(event(seq)) for seq in (1, 2, 3)]
    assert [d.event.seq for d in delivered if isinstance(d, Delivered)] == [1, 2, 3]
    assert all(isinstance(d, Delivered) and d.key == "s" for d in delivered)
    assert (client.positions["s"].epoch, client.positions["s"].seq) == ("e1", 3)
    # Replayed after a reconnect: already delivered.
    assert isinstance(client.receive_text(event(2)), Ignored)
    assert isinstance(client.receive_text(event(3)), Ignored)
    assert isinstance(client.receive_text(event(4)), Delivered)
    assert client.positions["s"].seq == 4
    # Registry events are keyed by None whatever session they are about.
    registry = client.receive_text(event(11, session_id="other", epoch="r1", stream="registry"))
    assert isinstance(registry, Delivered) and registry.key is None
    assert isinstance(client.receive_text(event(11, session_id="x", epoch="r1", stream="registry")), Ignored)
    assert client.positions[None].seq == 11
    # A stream nobody follows.
    assert isinstance(client.receive_text(event(1, session_id="zzz")), Ignored)


def test_client_resubscribes_from_the_last_seq() -> None:
    client = ClientConnection()
    client.subscribe("a")
    client.subscribe("b", after_seq=7)
    client.subscribe(None)
    for seq in (1, 2, 3):
        client.receive_text(event(seq, session_id="a", epoch="ea"))
    client.receive_text(event(8, session_id="b", epoch="eb"))
    client.request("ping")
    frames = client.resubscribe()
    requests = [decode_request(data) for _, data in frames]
    assert all(isinstance(r, Subscribe) for r in requests)
    by_key = {r.session_id: (r.after_seq, r.epoch) for r in requests if isinstance(r, Subscribe)}
    assert by_key == {"a": (3, "ea"), "b": (8, "eb"), None: (0, None)}
    # The old connection's requests are forgotten; the new subscribes are pending.
    assert client.pending == {rid for rid, _ in frames}
    # Unsubscribe forgets the position for good.
    client.unsubscribe("b")
    assert {decode_request(d).session_id for _, d in client.resubscribe()} == {"a", None}  # type: ignore[union-attr]


def test_client_reset_drops_the_position() -> None:
    client = ClientConnection()
    client.subscribe("s")
    client.receive_text(event(1))
    client.receive_text(event(2))
    reset = ResetFrame(session_id="s", after_seq=2, epoch="e2", first_seq=5, last_seq=9, message="reload")
    effect = client.receive_text(encode(reset))
    assert isinstance(effect, Reset) and effect.key == "s" and effect.frame == reset
    assert "s" not in client.positions
    assert isinstance(client.receive_text(event(3)), Ignored)  # no longer followed
    assert client.resubscribe() == []
    # Following again starts from wherever the caller says (the snapshot's last_seq).
    _, data = client.subscribe("s", after_seq=9, epoch="e2")
    again = decode_request(data)
    assert isinstance(again, Subscribe) and (again.after_seq, again.epoch) == (9, "e2")


def test_client_takes_a_new_epoch() -> None:
    client = ClientConnection()
    client.subscribe("s", after_seq=5, epoch="old")
    # The same seq in another epoch is a different event: delivered, and the position moves.
    effect = client.receive_text(event(3, epoch="new"))
    assert isinstance(effect, Delivered)
    assert (client.positions["s"].epoch, client.positions["s"].seq) == ("new", 3)


def test_decode_frame_reads_every_server_frame() -> None:
    frames: list[Any] = [
        ReplyFrame(id=1, result={"a": [1, 2]}),
        ErrorFrame(id="x", code="invalid", message="m"),
        msgspec.json.decode(event(3)),
        ResetFrame(session_id=None, after_seq=1, epoch="e", first_seq=2, last_seq=3, message="m"),
    ]
    for f in frames:
        data = f if isinstance(f, dict) else msgspec.to_builtins(f)
        assert msgspec.to_builtins(decode_frame(json.dumps(data))) == data


# -- the committed schema -------------------------------------------------------------------


def _load_generator() -> Callable[[], str]:
    spec = importlib.util.spec_from_file_location("gen_schema", ROOT / "scripts" / "gen_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    render: Callable[[], str] = module.render
    return render


def test_committed_schema_is_current() -> None:
    expected = _load_generator()()
    committed = (ROOT / "protocol" / "schema.json").read_text(encoding="utf-8")
    assert committed == expected, "protocol/schema.json is stale: run scripts/gen_schema.py"


def test_schema_names_every_request_and_frame() -> None:
    schema = json.loads((ROOT / "protocol" / "schema.json").read_text(encoding="utf-8"))
    refs = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["request"]["anyOf"]}
    ops = {schema["$defs"][name]["properties"]["op"]["enum"][0] for name in refs}
    assert ops == set(REQUEST_TYPES)
    for name in refs:
        assert schema["$defs"][name]["additionalProperties"] is False  # unknown fields are refused
    frame_refs = {ref["$ref"].rsplit("/", 1)[1] for ref in schema["server_frame"]["anyOf"]}
    tags = {schema["$defs"][name]["properties"]["frame"]["enum"][0] for name in frame_refs}
    assert tags == {
        "reply",
        "error",
        "event",
        "reset",
        "unsubscribed",
        "presence",
        "summarize",
        "stream",
        "turn",
        "turn_stopped",
        "tool_answer",
        "steering",
        "dump",
    }
    assert set(schema["$defs"]["ErrorFrame"]["properties"]["code"]["enum"]) == set(ERROR_CODES)


# -- nesting the decoder cannot follow (issue 12) -------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        '{"op":"ping","id":1,"x":' + "[" * 1000 + "]" * 1000 + "}",  # the issue's 2 KB frame
        '{"x":' + "[" * 1000 + "]" * 1000 + ',"op":"ping","id":1}',
        '{"op":"append","id":1,"session_id":"s","message":{"id":"m","role":"user","parts":['
        + "[" * 2000
        + "]" * 2000
        + "]}}",
    ],
)
def test_deep_nesting_is_invalid_not_a_recursion_error(data: str) -> None:
    connection: ServerConnection[Grant] = ServerConnection()
    answer = connection.receive_text(data, 0.0)
    assert isinstance(answer, Refused) and answer.frame.code == "invalid", answer
    # The same connection serves the next frame.
    assert not isinstance(connection.receive_text(frame(op="ping", id=2), 0.0), Refused)
