"""The hub over a real socket: every op against the in-process engine on the same store,
the error answers, limits, concurrency, HTTP endpoints and graceful shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed, InvalidStatus

from hub import Message, ReadonlyText, SessionHubError, SessionManager, SqliteStore
from hub.server import HubConfig
from hub.tools import dispatch
from protocol.frames import REQUEST_TYPES
from tests.support.hubtest import Client, HubError, eventually, served, text

Summary = Callable[[list[Message], Any], Awaitable[dict[str, str] | None]]


def configured(store: SqliteStore, compact: Summary | None = None) -> SessionManager:
    """The manager the hub serves, or (called again) an independent in-process twin."""
    manager = (
        SessionManager(store)
        .with_context("soul", provider=ReadonlyText("x"))
        .with_context("memory", max_tokens=50)
    )
    if compact is not None:
        manager.on_compaction(compact)
    return manager


async def summarize(history: list[Message], _ctx: Any) -> dict[str, str] | None:
    """Lay a summary over everything but the newest message."""
    if len(history) < 2:
        return None
    return {
        "from_message_id": history[0].id,
        "to_message_id": history[-2].id,
        "summary": f"summary of {len(history) - 1} messages",
    }


def builtins(value: Any) -> Any:
    return msgspec.to_builtins(value)


def dicts(messages: list[Message]) -> list[dict[str, Any]]:
    return [m.to_dict() for m in messages]


def tool_dicts(tools: list[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


async def same_error(client: Client, call: Callable[[], Awaitable[Any]], op: str, **fields: Any) -> HubError:
    """The op over the socket fails with the code and message the engine raises in-process."""
    with pytest.raises(SessionHubError) as in_process:
        await call()
    with pytest.raises(HubError) as remote:
        await client.call(op, **fields)
    assert remote.value.code == in_process.value.code
    assert remote.value.message == str(in_process.value)
    return remote.value


# -- every op against the in-process result ------------------------------------------------


async def test_every_op_matches_in_process(store: SqliteStore) -> None:
    manager = configured(store, summarize)
    async with served(manager=manager) as h, h.client() as c:
        assert await c.call("ping") == "pong"
        hello = await c.call("hello", name="tester", role="observer", sessions=["somewhere"])
        assert isinstance(hello["connection_id"], str)
        assert await c.call("presence", session_id="somewhere") == [
            {"connection_id": hello["connection_id"], "name": "tester", "role": "observer", "streaming": []}
        ]
        unasked = await c.request("summary", request_id="nobody-asked", summary="x")
        assert (unasked["frame"], unasked["code"]) == ("error", "not_found")
        # Without a secret a token is not checked: auth is accepted and changes nothing.
        assert await c.call("auth", token="anything") == {"sub": None, "exp": None, "ended": []}
        streamed = (await c.call("create", name="streamed"))["id"]
        assert await c.call("stream_start", session_id=streamed, message_id="a1") == {"index": 0}
        assert await c.call("stream_delta", session_id=streamed, message_id="a1", kind="text", text="Hi") == 1
        assert await c.call("stream_end", session_id=streamed, message_id="a1") is None
        assert (await c.call("get_message", session_id=streamed, message_id="a1"))["parts"] == [
            {"type": "text", "text": "Hi"}
        ]
        # Turns (tests/server/test_turns.py has the rest): this socket answers turns; one nobody
        # was given is refused; a session with nothing to answer cannot start one.
        assert await c.call("take_turns") is None
        assert await c.call("get_turn", session_id=streamed) is None
        refused = await c.request("turn_failed", turn_id="nobody-gave-it", error="x")
        assert (refused["frame"], refused["code"]) == ("error", "not_found")
        empty = (await c.call("create", name="empty"))["id"]
        nothing = await c.request("start_turn", session_id=empty)
        assert (nothing["frame"], nothing["code"]) == ("error", "invalid")
        idle = await c.request("stop_turn", session_id=empty)
        assert (idle["frame"], idle["code"]) == ("error", "not_found")  # no turn in flight
        # The user's word to a turn (tests/adapters/test_answers.py has the rest): nothing
        # is in flight to answer or steer.
        unanswered = await c.request("answer_tool", session_id=empty, approval_id="a1", approved=True)
        assert (unanswered["frame"], unanswered["code"]) == ("error", "not_found")
        unsteered = await c.request(
            "steer_turn", session_id=empty, message={"id": "m1", "role": "user", "parts": []}
        )
        assert (unsteered["frame"], unsteered["code"]) == ("error", "not_found")
        await _registry_and_messages(c, store)
        await _context_tools_and_compaction(c, store)
        await _subscriptions(c, store)
        await _endings(c, store)
        await _event_logs(c, store)
        await _checkpoints(c, store)
        missing = set(REQUEST_TYPES) - c.sent_ops
        assert not missing, f"ops never sent over the socket: {sorted(missing)}"


async def _checkpoints(c: Client, store: SqliteStore) -> None:
    """LangGraph checkpoints as raw frames (tests/clients/test_langgraph.py drives them with
    LangGraph's own suite): the bytes base64 both ways, the session made by the first put."""

    def record(checkpoint_id: str, run_id: str) -> dict[str, Any]:
        return {"thread_id": "lg-1", "ns": "", "checkpoint_id": checkpoint_id, "parent_id": None,
                "type": "msgpack", "data": "AP8=", "metadata": {"step": 0, "run_id": run_id}}  # fmt: skip

    put = await c.call(
        "checkpoint_put", session_id="lg-1", checkpoint=record("c1", "r1"), messages=[text("q1", "hi")]
    )
    assert put is None
    assert [m.id for m in await configured(store).get_history("lg-1")] == ["q1"]
    write = {"task_id": "t", "idx": 0, "channel": "ch", "type": "msgpack", "value": "AQ==", "task_path": ""}
    assert (
        await c.call("checkpoint_writes", session_id="lg-1", ns="", checkpoint_id="c1", writes=[write])
        is None
    )
    got = await c.call("checkpoint_get", session_id="lg-1")
    assert got == record("c1", "r1") | {"writes": [write]}
    assert (await store.get_checkpoint("lg-1", "", "c1")).data == b"\x00\xff"  # type: ignore[union-attr]
    await c.call("checkpoint_put", session_id="lg-1", checkpoint=record("c2", "r2"))
    listed = await c.call("checkpoint_list", session_id="lg-1", filter={"run_id": "r1"})
    assert [r["checkpoint_id"] for r in listed] == ["c1"]
    assert await c.call("checkpoint_prune", session_id="lg-1") == 1
    assert await c.call("checkpoint_delete_runs", run_ids=["r2"]) == 1
    assert await c.call("checkpoint_delete", session_id="lg-1") == 0
    bad = await c.request(
        "checkpoint_put", session_id="lg-1", checkpoint=record("c3", "r") | {"data": "not base64!"}
    )
    assert (bad["frame"], bad["code"]) == ("error", "invalid")  # a field of the wrong type
    other = await c.request("checkpoint_put", session_id="lg-2", checkpoint=record("c3", "r"))
    assert (other["frame"], other["code"]) == ("error", "invalid")
    assert await store.get_session("lg-2") is None


async def _event_logs(c: Client, store: SqliteStore) -> None:
    twin = configured(store)
    sid = (await c.call("create", name="logs"))["id"]
    await c.call("append", session_id=sid, message=text("e1", "one two three"))
    await c.call("append", session_id=sid, message=text("e2", "four five", "assistant"))
    events = await c.call("read_events", session_id=sid)
    assert events == builtins(await twin.get_session(sid).read_events())
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert await c.call("read_events", session_id=sid, after_seq=1, limit=1) == builtins(
        await twin.get_session(sid).read_events(1, 1)
    )
    assert await c.call("read_events", session_id=None) == builtins(await twin.read_registry_events())
    lost = await c.request("read_events", session_id=sid, after_seq=99)
    assert (lost["frame"], lost["code"]) == ("error", "not_found")
    assert lost["detail"]["last_seq"] == len(events) and lost["detail"]["after_seq"] == 99
    assert await c.call("estimate_tokens", session_id=sid) == await twin.get_session(sid).estimate_tokens()
    assert await c.call("estimate_tokens", session_id=sid, leaf_id="e1") == (
        await twin.get_session(sid).estimate_tokens("e1")
    )
    # Nothing is an hour old: a pass that prunes nothing, answered as the engine's result.
    assert await c.call("prune_events", older_than=3600) == builtins(
        await twin.prune_events(older_than=timedelta(hours=1))
    )
    refused = await c.request("prune_events")
    assert (refused["frame"], refused["code"]) == ("error", "invalid")


async def _registry_and_messages(c: Client, store: SqliteStore) -> None:
    twin = configured(store)
    info = await c.call("create", name="chat", model="gpt-x", source="test")
    sid = info["id"]
    assert info["name"] == "chat" and info["model"] == "gpt-x" and info["source"] == "test"
    assert info == builtins(await twin.get(sid))
    assert await c.call("get", session_id=sid) == builtins(await twin.get(sid))
    assert await c.call("get", session_id="no-such-session") is None
    renamed = await c.call("rename", session_id=sid, name="renamed")
    assert renamed["name"] == "renamed" and renamed == builtins(await twin.get(sid))

    # Messages: append (latest leaf, explicit parent), upsert both ways, a chain.
    assert await c.call("append", session_id=sid, message=text("m1", "hello world")) == "m1"
    assert await c.call("append", session_id=sid, message=text("m2", "hi there", "assistant")) == "m2"
    assert await c.call("append", session_id=sid, message=text("m3", "a branch"), parent_id="m1") == "m3"
    assert await c.call("upsert", session_id=sid, message=text("m2", "hi again", "assistant")) == "m2"
    assert await c.call("upsert", session_id=sid, message=text("m4", "more"), parent_id="m2") == "m4"
    last = await c.call(
        "append_all", session_id=sid, messages=[text("m5", "five"), text("m6", "six", "assistant")]
    )
    assert last == "m6"
    assert await c.call("append_all", session_id=sid, messages=[], parent_id="m3") == "m3"
    root = await c.call("append", session_id=sid, message=text("r1", "new root"), parent_id=None)
    assert root == "r1"

    session = twin.get_session(sid)
    assert await c.call("get_history", session_id=sid) == dicts(await twin.get_history(sid))
    assert await c.call("get_history", session_id=sid, leaf_id="m6") == dicts(
        await twin.get_history(sid, "m6")
    )
    assert [m["id"] for m in await c.call("get_history", session_id=sid, leaf_id="m6")] == [
        "m1",
        "m2",
        "m4",
        "m5",
        "m6",
    ]
    branches = await c.call("get_branches", session_id=sid, message_id="m1")
    assert branches == dicts(await twin.get_branches(sid, "m1"))
    assert {m["id"] for m in branches} == {"m2", "m3"}
    assert await c.call("get_message_count", session_id=sid) == await twin.get_message_count(sid)
    got = await c.call("get_message", session_id=sid, message_id="m2")
    expected = await session.get_message("m2")
    assert expected is not None and got == expected.to_dict()
    assert got["parts"][0]["text"] == "hi again"
    assert await c.call("get_message", session_id=sid, message_id="ghost") is None
    leaf = await session.get_latest_leaf()
    assert leaf is not None and await c.call("get_latest_leaf", session_id=sid) == leaf.to_dict()
    assert await c.call("get_path_length", session_id=sid) == await session.get_path_length()
    assert await c.call("get_path_length", session_id=sid, leaf_id="m6") == 5
    assert await c.call("update_message", session_id=sid, message=text("m5", "five, edited")) is True
    assert await c.call("update_message", session_id=sid, message=text("ghost", "x")) is False
    edited = await session.get_message("m5")
    assert edited is not None and edited.text() == "five, edited"

    # Search, across sessions and in one.
    hits = await c.call("search", query="hello", limit=5)
    assert hits == builtins(await twin.search("hello", 5))
    assert [h["id"] for h in hits] == ["m1"] and hits[0]["session_id"] == sid
    local = await c.call("session_search", session_id=sid, query="edited")
    assert local == builtins(await session.search("edited"))
    assert [h["id"] for h in local] == ["m5"]

    # Overlays, usage, forks, deletion of messages.
    overlay = await c.call("add_compaction", session_id=sid, summary="sum", from_id="m1", to_id="m2")
    assert [overlay] == builtins(await twin.get_compactions(sid))
    assert await c.call("get_compactions", session_id=sid) == builtins(await twin.get_compactions(sid))
    usage = await c.call("add_usage", session_id=sid, input_tokens=100, output_tokens=20, cost=0.5)
    assert (usage["input_tokens"], usage["output_tokens"], usage["estimated_cost"]) == (100, 20, 0.5)
    assert usage == builtins(await twin.get(sid))
    fork = await c.call("fork", session_id=sid, at_message_id="m4", name="fork")
    assert fork == builtins(await twin.get(fork["id"]))
    assert fork["parent_session_id"] == sid
    assert await c.call("get_history", session_id=fork["id"]) == dicts(await twin.get_history(fork["id"]))
    deleted = await c.call("delete_messages", session_id=sid, ids=["m3", "ghost"])
    assert deleted == ["m3"]
    assert await session.get_message("m3") is None

    assert await c.call("list") == builtins(await twin.list())
    assert {s["id"] for s in await c.call("list")} >= {sid, fork["id"]}


async def _context_tools_and_compaction(c: Client, store: SqliteStore) -> None:
    sid = (await c.call("create", name="ctx"))["id"]

    def fresh() -> Any:
        return configured(store).get_session(sid)

    blocks = await c.call("get_context_blocks", session_id=sid)
    assert blocks == builtins(await fresh().get_context_blocks())
    assert [b["label"] for b in blocks] == ["soul", "memory"]
    soul = await c.call("get_context_block", session_id=sid, label="soul")
    assert soul == builtins(await fresh().get_context_block("soul"))
    assert soul["content"] == "x" and soul["writable"] is False
    assert await c.call("get_context_block", session_id=sid, label="nope") is None

    written = await c.call("replace_context_block", session_id=sid, label="memory", content="likes tea")
    assert written == builtins(await fresh().get_context_block("memory"))
    assert written["content"] == "likes tea"
    appended = await c.call("append_context_block", session_id=sid, label="memory", content="and cake")
    assert appended == builtins(await fresh().get_context_block("memory"))
    assert "likes tea" in appended["content"] and "and cake" in appended["content"]

    # Refused block writes: the engine's errors, word for word.
    await same_error(
        c,
        lambda: fresh().replace_context_block("soul", "y"),
        "replace_context_block",
        session_id=sid,
        label="soul",
        content="y",
    )
    error = await same_error(
        c,
        lambda: fresh().replace_context_block("memory", "word " * 200),
        "replace_context_block",
        session_id=sid,
        label="memory",
        content="word " * 200,
    )
    assert error.code == "invalid" and "maxTokens" in error.message
    await same_error(
        c,
        lambda: fresh().append_context_block("soul", "z"),
        "append_context_block",
        session_id=sid,
        label="soul",
        content="z",
    )

    # The frozen prompt stays frozen until refreshed.
    frozen = await c.call("freeze_system_prompt", session_id=sid)
    assert frozen == await fresh().freeze_system_prompt()
    assert "likes tea" in frozen
    await c.call("replace_context_block", session_id=sid, label="memory", content="likes coffee")
    assert await c.call("freeze_system_prompt", session_id=sid) == frozen
    refreshed = await c.call("refresh_system_prompt", session_id=sid)
    assert refreshed == await fresh().refresh_system_prompt()
    assert "likes coffee" in refreshed and refreshed != frozen

    # Tools: listed like the engine lists them, run remotely, errors come back as strings.
    tools = await c.call("tools", session_id=sid)
    assert tools == tool_dicts(await fresh().tools())
    assert [t["name"] for t in tools] == ["set_context"]
    assert await c.call("tools", session_id=None) == tool_dicts(configured(store).tools())
    result = await c.call(
        "run_tool",
        session_id=sid,
        name="set_context",
        arguments={"label": "memory", "content": "from a tool"},
    )
    assert isinstance(result, str) and not result.startswith("Error")
    block = await fresh().get_context_block("memory")
    assert block is not None and block.content == "from a tool"
    as_string = await c.call(
        "run_tool",
        session_id=sid,
        name="set_context",
        arguments=json.dumps({"label": "memory", "content": "more", "action": "append"}),
    )
    assert isinstance(as_string, str) and not as_string.startswith("Error")
    block = await fresh().get_context_block("memory")
    assert block is not None and "more" in block.content
    bad_calls: list[tuple[str, str | dict[str, Any]]] = [
        ("no_such_tool", {}),
        ("set_context", {"label": "memory"}),
        ("set_context", {"label": "memory", "content": 5}),
        ("set_context", "{not json"),
        ("set_context", {"label": "memory", "content": "word " * 200}),
    ]
    for name, arguments in bad_calls:
        remote = await c.call("run_tool", session_id=sid, name=name, arguments=arguments)
        local = await dispatch(await fresh().tools(), name, arguments)
        assert remote == local, (name, arguments)
        assert remote.startswith("Error"), remote
    await c.call("append", session_id=sid, message=text("q1", "where is the teapot"))
    remote = await c.call("run_tool", session_id=None, name="session_search", arguments={"query": "teapot"})
    assert remote == await dispatch(configured(store).tools(), "session_search", {"query": "teapot"})
    assert "teapot" in remote

    # Compaction with the manager's compaction function.
    for i in range(2, 6):
        await c.call("append", session_id=sid, message=text(f"q{i}", f"message {i}"))
    compacted = await c.call("compact", session_id=sid)
    assert compacted == {"from_message_id": "q1", "to_message_id": "q4", "summary": "summary of 4 messages"}
    overlays = await configured(store).get_compactions(sid)
    assert [(o.from_message_id, o.to_message_id, o.summary) for o in overlays] == [
        ("q1", "q4", "summary of 4 messages")
    ]
    history = await c.call("get_history", session_id=sid)
    assert history == dicts(await fresh().get_history())
    assert len(history) == 2  # the summary, then the newest message


async def _subscriptions(c: Client, store: SqliteStore) -> None:
    sid = (await c.call("create", name="sub"))["id"]
    await c.call("append", session_id=sid, message=text("a", "one"))
    reply = await c.subscribe(sid, after_seq=0)
    position = await store.stream_position(f"s:{sid}")
    assert reply["frame"] == "reply"
    assert reply["result"] == {"epoch": position.epoch, "last_seq": position.last_seq}
    events = await c.until_seq(sid, position.last_seq)
    logged = await configured(store).get_session(sid).read_events()
    assert [(e["seq"], e["type"], e["data"], e["epoch"]) for e in events] == [
        (e.seq, e.type, e.data, e.epoch) for e in logged
    ]
    assert await c.call("unsubscribe", session_id=sid) is None


async def _endings(c: Client, store: SqliteStore) -> None:
    twin = configured(store)
    sid = (await c.call("create", name="ending"))["id"]
    await c.call("append_all", session_id=sid, messages=[text("e1", "one"), text("e2", "two")])
    assert await c.call("clear_messages", session_id=sid) is None
    assert await twin.get_history(sid) == []
    assert await c.call("get_message_count", session_id=sid) == 0
    successor = await c.call("compact_and_split", session_id=sid, summary="the gist", name="part 2")
    assert successor == builtins(await twin.get(successor["id"]))
    assert successor["parent_session_id"] == sid and successor["name"] == "part 2"
    old = await twin.get(sid)
    assert old is not None and old.end_reason == "compaction"
    assert await c.call("get", session_id=sid) == builtins(old)
    assert await c.call("get_history", session_id=successor["id"]) == dicts(
        await twin.get_history(successor["id"])
    )
    ended = await c.call("end", session_id=successor["id"], reason="the user is done")
    assert ended["end_reason"] == "the user is done" and ended == builtins(await twin.get(successor["id"]))
    await same_error(c, lambda: twin.end(successor["id"]), "end", session_id=successor["id"])
    # Nor is an ended session split (its reason would be overwritten): a conflict too.
    split = await same_error(
        c,
        lambda: twin.compact_and_split(successor["id"], "again"),
        "compact_and_split",
        session_id=successor["id"],
        summary="again",
    )
    assert split.code == "conflict" and "already ended (the user is done)" in split.message
    assert builtins(await twin.get(successor["id"])) == ended
    # Export and import (tests/store/test_dump.py has the rest): the dump comes in dump frames
    # before the reply; importing it back over itself is refused without replace.
    rid = await c.send("export", session_ids=[successor["id"]])
    reply = await c.answer(rid)
    lines = [line for fr in c.received if fr["frame"] == "dump" and fr["id"] == rid for line in fr["lines"]]
    assert reply["result"] == {"sessions": 1, "lines": len(lines)} and len(lines) >= 3
    refused = await c.request("import", lines=lines, final=True)
    assert (refused["frame"], refused["code"]) == ("error", "conflict")
    assert await c.call("import", lines=lines, final=True, replace=True) == {
        "sessions": [successor["id"]],
        "messages": await twin.get_message_count(successor["id"]),
    }
    assert await c.call("delete", session_id=sid) is None
    assert await twin.get(sid) is None
    assert await c.call("get", session_id=sid) is None


async def test_end_is_an_event_for_the_session_and_the_registry(store: SqliteStore) -> None:
    async with served(manager=configured(store)) as h, h.client() as c, h.client() as watcher:
        sid = (await c.call("create", name="to end"))["id"]
        assert (await watcher.subscribe(sid))["frame"] == "reply"
        assert (await watcher.subscribe(None))["frame"] == "reply"
        await watcher.events(sid, 1)  # session.created
        await watcher.events(None, 1)
        ended = await c.call("end", session_id=sid)
        assert ended["end_reason"] == "ended"
        for stream in (sid, None):
            (event,) = await watcher.events(stream, 1)
            assert event["type"] == "session.ended" and event["data"] == {"session": ended}
        # Ending it again, or with a bad reason, is refused with the engine's words; no event.
        again = await c.request("end", session_id=sid, reason="again")
        assert (again["frame"], again["code"]) == ("error", "conflict")
        assert again["message"] == f"session {sid!r} has already ended (ended)"
        other = (await c.call("create", name="other"))["id"]
        bad = await c.request("end", session_id=other, reason="")
        assert (bad["frame"], bad["code"], bad["message"]) == (
            "error",
            "invalid",
            "end reason must not be empty",
        )
        info = await c.call("get", session_id=other)
        assert info["end_reason"] is None
        await watcher.quiet(lambda f: f["frame"] == "event" and f["type"] == "session.ended")


async def test_errors_match_in_process(store: SqliteStore) -> None:
    manager = SessionManager(store)
    twin = SessionManager(store)
    async with served(manager=manager) as h, h.client() as c:
        sid = (await c.call("create", name="e"))["id"]
        await c.call("append", session_id=sid, message=text("m1", "x"))
        cases: list[tuple[Callable[[], Awaitable[Any]], str, dict[str, Any]]] = [
            (lambda: twin.get_history("nope"), "get_history", {"session_id": "nope"}),
            (
                lambda: twin.append("nope", text("a", "x")),
                "append",
                {"session_id": "nope", "message": text("a", "x")},
            ),
            (lambda: twin.rename("nope", "n"), "rename", {"session_id": "nope", "name": "n"}),
            (lambda: twin.delete("nope"), "delete", {"session_id": "nope"}),
            (lambda: twin.end("nope"), "end", {"session_id": "nope"}),
            (
                lambda: twin.add_usage("nope", 1, 1, 0.0),
                "add_usage",
                {"session_id": "nope", "input_tokens": 1, "output_tokens": 1, "cost": 0.0},
            ),
            (
                lambda: twin.fork("nope", "m1", "f"),
                "fork",
                {"session_id": "nope", "at_message_id": "m1", "name": "f"},
            ),
            (
                lambda: twin.add_compaction("nope", "s", "m0", "m1"),
                "add_compaction",
                {"session_id": "nope", "summary": "s", "from_id": "m0", "to_id": "m1"},
            ),
            (
                lambda: twin.append(sid, {"id": 5, "role": "user", "parts": []}),
                "append",
                {"session_id": sid, "message": {"id": 5, "role": "user", "parts": []}},
            ),
            (
                lambda: twin.append(sid, {"id": "bad", "role": "user", "parts": [{"text": "no type"}]}),
                "append",
                {"session_id": sid, "message": {"id": "bad", "role": "user", "parts": [{"text": "no type"}]}},
            ),
            (
                lambda: twin.append(sid, {"id": "x", "role": "user", "parts": "no"}),
                "append",
                {"session_id": sid, "message": {"id": "x", "role": "user", "parts": "no"}},
            ),
        ]
        for call, op, fields in cases:
            error = await same_error(c, call, op, **fields)
            assert error.frame["id"] is not None
        # compact on a hub without a summarizer: the engine's builder hint becomes what an
        # operator can do about it (the same code, and nothing written).
        refused = await c.request("compact", session_id=sid)
        assert refused["code"] == "invalid"
        assert refused["message"].startswith("this hub has no summarizer, so it cannot compact")
        # Nothing was written by any of them.
        assert [m.id for m in await twin.get_history(sid)] == ["m1"]


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("get_history", {}),
        ("get_branches", {"message_id": "m"}),
        ("get_message_count", {}),
        ("rename", {"name": "x"}),
        ("delete", {}),
        ("end", {}),
        ("append", {"message": text("m", "x")}),
        ("clear_messages", {}),
        ("get_compactions", {}),
        ("compact_and_split", {"summary": "s"}),
        ("add_usage", {"input_tokens": 1, "output_tokens": 1, "cost": 0}),
        ("get_message", {"message_id": "m"}),
        ("get_latest_leaf", {}),
        ("get_path_length", {}),
        ("update_message", {"message": text("m", "x")}),
        ("session_search", {"query": "x"}),
        ("get_context_blocks", {}),
        ("get_context_block", {"label": "memory"}),
        ("replace_context_block", {"label": "memory", "content": "x"}),
        ("append_context_block", {"label": "memory", "content": "x"}),
        ("freeze_system_prompt", {}),
        ("refresh_system_prompt", {}),
        ("tools", {}),
        ("run_tool", {"name": "set_context", "arguments": {"label": "memory", "content": "x"}}),
        ("compact", {}),
        ("subscribe", {"after_seq": 0}),
    ],
)
async def test_unknown_session_is_not_found_with_the_id(
    store: SqliteStore, op: str, fields: dict[str, Any]
) -> None:
    async with served(manager=configured(store, summarize)) as h, h.client() as c:
        frame = await c.request(op, id=f"req-{op}", session_id="no-such-session", **fields)
        assert frame["frame"] == "error", frame
        assert (frame["code"], frame["id"]) == ("not_found", f"req-{op}")
        assert "no-such-session" in frame["message"]
        assert await c.call("ping") == "pong"
        # Nothing came into being.
        assert await SessionManager(store).list() == []


# -- bad frames ------------------------------------------------------------------------------


async def test_malformed_json_keeps_the_connection_open(store: SqliteStore) -> None:
    async with served(store=store) as h, h.client() as c:
        for data in ['{"op": "ping", "id": 1', "not json at all", "", "[1, 2]", '"ping"', "null"]:
            await c.send_raw(data)
            frame = await c.take(lambda f: f["frame"] == "error")
            assert frame["code"] == "bad_frame", (data, frame)
            assert frame["id"] is None
            assert frame["message"]
        # Still the same, working connection.
        assert await c.call("ping") == "pong"
        info = await c.call("create", name="after")
        assert (await c.call("get", session_id=info["id"]))["name"] == "after"
        assert not c.closed.is_set()


@pytest.mark.parametrize(
    "data",
    [
        "{}x",
        '{"op": 1}x',
        '{"id": 1, "op": "launch"}x',
        '{"op": "ping", "id": 1, "x": 1} junk',
        "[]x",
        "{}{}",
    ],
)
async def test_json_followed_by_junk_is_a_bad_frame(
    store: SqliteStore, data: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Validation stops at the first wrong field before the parser reads the rest: the
    # fallback parse of such a frame used to raise past every handler (1006, tracebacks).
    async with served(store=store) as h, h.client() as c:
        await c.send_raw(data)
        frame = await c.take(lambda f: f["frame"] == "error")
        assert (frame["code"], frame["id"]) == ("bad_frame", None), frame
        assert await c.call("ping") == "pong"
        assert not c.closed.is_set()
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


async def test_missing_or_bad_ids_and_ops(store: SqliteStore) -> None:
    async with served(store=store) as h, h.client() as c:
        await c.send_raw(json.dumps({"op": "ping"}))
        frame = await c.take(lambda f: f["frame"] == "error")
        assert (frame["code"], frame["id"]) == ("bad_frame", None)
        await c.send_raw(json.dumps({"op": "ping", "id": 1.5}))
        frame = await c.take(lambda f: f["frame"] == "error")
        assert (frame["code"], frame["id"]) == ("bad_frame", None)
        await c.send_raw(json.dumps({"id": "x1", "session_id": "s"}))
        frame = await c.take(lambda f: f["frame"] == "error")
        assert (frame["code"], frame["id"]) == ("bad_frame", "x1")
        frame = await c.request("launch", id="u1")
        assert (frame["frame"], frame["code"], frame["id"]) == ("error", "unknown_op", "u1")
        assert "launch" in frame["message"]
        frame = await c.request("launch", id=77, session_id="s")
        assert (frame["code"], frame["id"]) == ("unknown_op", 77)
        assert await c.call("ping") == "pong"


@pytest.mark.parametrize(
    ("op", "fields"),
    [
        ("get", {"session_id": 5}),
        ("create", {"name": ["a"]}),
        ("create", {}),
        ("append", {"session_id": "s", "message": "hello"}),
        ("append_all", {"session_id": "s", "messages": "hello"}),
        ("add_usage", {"session_id": "s", "input_tokens": "1", "output_tokens": 1, "cost": 0}),
        ("search", {"query": "q", "limit": "ten"}),
        ("subscribe", {"session_id": "s", "after_seq": "0"}),
        ("ping", {"extra": True}),
        ("get", {"session_id": "s", "sesion_id": "typo"}),
    ],
)
async def test_wrong_field_types_are_invalid(store: SqliteStore, op: str, fields: dict[str, Any]) -> None:
    async with served(store=store) as h, h.client() as c:
        frame = await c.request(op, id="w1", **fields)
        assert frame["frame"] == "error"
        assert (frame["code"], frame["id"]) == ("invalid", "w1"), frame
        assert await c.call("ping") == "pong"
        assert await SessionManager(store).list() == []


async def test_a_frame_over_the_limit_is_too_large(store: SqliteStore) -> None:
    async with served(store=store, config=HubConfig(max_frame_bytes=1000)) as h, h.client() as c:
        sid = (await c.call("create", name="big"))["id"]
        big = json.dumps({"op": "append", "id": "big", "session_id": sid, "message": text("m1", "x" * 2000)})
        await c.send_raw(big)
        frame = await c.answer("big")
        assert (frame["frame"], frame["code"]) == ("error", "too_large")
        assert "1000" in frame["message"]
        # Nothing was written, and the connection is still usable.
        assert await c.call("get_message_count", session_id=sid) == 0
        assert await c.call("append", session_id=sid, message=text("m2", "small")) == "m2"
        # Just under the limit is fine.
        body = {"op": "append", "id": "fits", "session_id": sid, "message": text("m3", "")}
        room = 1000 - len(json.dumps(body).encode())
        body["message"] = text("m3", "y" * room)
        data = json.dumps(body)
        assert len(data.encode()) == 1000
        await c.send_raw(data)
        assert (await c.answer("fits"))["result"] == "m3"
        # A huge frame with no readable id.
        await c.send_raw("[" + "1," * 5000 + "1]")
        frame = await c.take(lambda f: f["frame"] == "error")
        assert (frame["code"], frame["id"]) == ("too_large", None)
        assert await c.call("ping") == "pong"


async def test_a_binary_frame_closes_with_1003(store: SqliteStore) -> None:
    async with served(store=store) as h, h.client() as bystander, h.client() as c:
        assert await c.call("ping") == "pong"
        await c.send_raw(json.dumps({"op": "ping", "id": 1}).encode())
        code, reason = await c.wait_closed()
        assert code == 1003
        assert reason and "binary" in reason
        # Only that connection.
        assert await bystander.call("ping") == "pong"


# -- hostile input ---------------------------------------------------------------------------

HOSTILE = [
    '"',
    '""',
    "'",
    "AND",
    "OR",
    "NOT",
    "hello AND",
    "hello OR world",
    "NEAR(hello world)",
    "*",
    "hel*",
    "^hello",
    "-hello",
    "body:hello",
    "sid:x",
    "a:b:c",
    "(",
    ")",
    "{hello}",
    "[hello]",
    "hello\x00world",
    "%",
    "_",
    "\\",
    "'; DROP TABLE messages; --",
    "🙂 hello",
    "  ",
    "",
    "x" * 5000,
    "hello " * 300,
]


async def test_hostile_search_queries(store: SqliteStore) -> None:
    twin = SessionManager(store)
    async with served(store=store) as h, h.client() as c:
        sid = (await c.call("create", name="s"))["id"]
        await c.call(
            "append_all",
            session_id=sid,
            messages=[
                text("m1", "hello world"),
                text("m2", "body: hello (NEAR) AND more"),
                text("m3", "🙂 hello"),
            ],
        )
        session = twin.get_session(sid)
        searches: list[tuple[str, Callable[[str], Awaitable[list[Any]]]]] = [
            ("search", lambda q: twin.search(q, 20)),
            ("session_search", lambda q: session.search(q, 20)),
        ]
        for query in HOSTILE:
            for op, local in searches:
                fields: dict[str, Any] = {"query": query, "limit": 20}
                if op == "session_search":
                    fields["session_id"] = sid
                frame = await c.request(op, **fields)
                failure: SessionHubError | None = None
                try:
                    expected = builtins(await local(query))
                except SessionHubError as exc:
                    failure = exc
                if failure is not None:
                    assert frame["frame"] == "error", (op, query, frame)
                    assert (frame["code"], frame["message"]) == (failure.code, str(failure))
                    assert frame["code"] != "internal", (op, query, frame)
                else:
                    assert frame["frame"] == "reply", (op, query, frame)
                    assert frame["result"] == expected, (op, query)
        assert [r["id"] for r in await c.call("search", query="hello AND")] == ["m2"]
        assert len(await twin.get_history(sid)) == 3


# -- concurrency -----------------------------------------------------------------------------


async def test_concurrent_requests_on_one_connection(store: SqliteStore) -> None:
    twin = SessionManager(store)
    async with served(store=store) as h, h.client() as c:
        sid = (await c.call("create", name="busy"))["id"]
        ids = [f"req-{i}" for i in range(100)]
        for i, rid in enumerate(ids):
            await c.send("append", id=rid, session_id=sid, message=text(f"m{i}", f"message {i}"))
        answers = await asyncio.gather(*(c.answer(rid) for rid in ids))
        for i, (rid, frame) in enumerate(zip(ids, answers, strict=True)):
            assert frame["frame"] == "reply", frame
            assert (frame["id"], frame["result"]) == (rid, f"m{i}")
        assert c.inbox == []
        assert await twin.get_message_count(sid) == 100
        assert {m.id for m in await twin.get_history(sid)} == {f"m{i}" for i in range(100)}
        # Mixed ops in flight; each answer carries its own request's id.
        mixed: dict[str | int, Callable[[Any], bool] | None] = {
            await c.send("get_message", session_id=sid, message_id="m7"): lambda r: r["id"] == "m7",
            await c.send("get_message_count", session_id=sid): lambda r: r == 100,
            await c.send("get", session_id=sid): lambda r: r["id"] == sid,
            await c.send("ping"): lambda r: r == "pong",
            await c.send("get", session_id=5): None,
        }
        for mixed_id, check in mixed.items():
            frame = await c.answer(mixed_id)
            if check is None:
                assert frame["frame"] == "error" and frame["code"] == "invalid"
            else:
                assert frame["frame"] == "reply" and check(frame["result"]), frame


# -- HTTP ------------------------------------------------------------------------------------


def samples(text_: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text_):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_healthz_and_metrics(store: SqliteStore) -> None:
    async with served(store=store) as h, httpx2.AsyncClient() as http:
        health = await http.get(f"{h.url}/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        async with h.client() as c:
            sid = (await c.call("create", name="m"))["id"]
            for i in range(3):
                await c.call("append", session_id=sid, message=text(f"m{i}", "x"))
            assert (await c.subscribe(sid))["frame"] == "reply"
            await c.until_seq(sid, 4)
            await c.send_raw("garbage")
            await c.take(lambda f: f["frame"] == "error")
            health = await http.get(f"{h.url}/healthz")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            response = await http.get(f"{h.url}/metrics")
            assert response.status_code == 200
            body = response.text
            for name in ("sessionhub_connections", "sessionhub_events_delivered", "sessionhub_op_seconds"):
                assert name in body
            values = samples(body)
            assert values[("sessionhub_connections", ())] == 1
            assert values[("sessionhub_subscriptions", ())] == 1
            assert values[("sessionhub_events_delivered_total", ())] >= 4
            assert values[("sessionhub_op_seconds_count", (("op", "append"),))] == 3
            assert values[("sessionhub_op_seconds_count", (("op", "create"),))] == 1
            assert values[("sessionhub_bad_frames_total", (("code", "bad_frame"),))] == 1

        async def disconnected() -> bool:
            return samples((await http.get(f"{h.url}/metrics")).text)[("sessionhub_connections", ())] == 0

        await eventually(disconnected, interval=0.02)


# -- graceful shutdown -----------------------------------------------------------------------


async def test_drain_finishes_in_flight_ops_then_closes_with_1001(db_path: Path, store: SqliteStore) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_summary(history: list[Message], ctx: Any) -> dict[str, str] | None:
        started.set()
        await release.wait()
        return await summarize(history, ctx)

    manager = SessionManager(store).on_compaction(slow_summary)
    async with served(manager=manager) as h, h.client() as idle, h.client() as busy:
        sid = (await busy.call("create", name="d"))["id"]
        for i in range(3):
            await busy.call("append", session_id=sid, message=text(f"m{i}", "x"))
        assert await idle.call("ping") == "pong"
        rid = await busy.send("compact", session_id=sid)
        async with asyncio.timeout(5):
            await started.wait()
        drain = asyncio.create_task(h.hub.drain())
        await asyncio.sleep(0.1)  # proves a negative: the drain does not end while an op runs
        assert not drain.done()  # waiting for the compaction
        assert not idle.closed.is_set() and not busy.closed.is_set()
        release.set()
        async with asyncio.timeout(5):
            await drain
        reply = await busy.answer(rid)
        assert reply["frame"] == "reply"
        assert reply["result"] == {
            "from_message_id": "m0",
            "to_message_id": "m1",
            "summary": "summary of 2 messages",
        }
        for c in (idle, busy):
            code, reason = await c.wait_closed()
            assert code == 1001, (code, reason)
        # The socket is closed: nothing more can be sent on it.
        with pytest.raises(ConnectionClosed):
            await idle.ws.send(json.dumps({"op": "ping", "id": 9}))
        # New connections are refused, and health says so.
        with pytest.raises((InvalidStatus, ConnectionClosed, ConnectionError)):
            async with h.client() as late:
                await late.call("ping")
        async with httpx2.AsyncClient() as http:
            assert (await http.get(f"{h.url}/healthz")).status_code == 503


async def test_a_request_sent_just_before_drain_gets_its_reply(store: SqliteStore) -> None:
    async with served(store=store) as h, h.client() as c:
        sid = (await c.call("create", name="d"))["id"]
        rid = await c.send("append", session_id=sid, message=text("last", "the last word"))
        # Drain as soon as the hub has read the request.
        await eventually(lambda: any(conn.requests for conn in h.hub.connections), interval=0)
        await h.hub.drain()
        reply = await c.answer(rid)
        assert reply["frame"] == "reply", reply
        assert reply["result"] == "last"
        code, _ = await c.wait_closed()
        assert code == 1001
        assert [m.id for m in await SessionManager(store).get_history(sid)] == ["last"]


async def test_drain_with_subscribers(store: SqliteStore) -> None:
    async with served(store=store) as h, h.client() as c:
        sid = (await c.call("create", name="d"))["id"]
        assert (await c.subscribe(sid))["frame"] == "reply"
        await c.until_seq(sid, 1)
        async with asyncio.timeout(5):
            await h.hub.drain()
        code, reason = await c.wait_closed()
        assert code == 1001 and reason
        assert not h.hub.connections or all(conn.closed for conn in h.hub.connections)
