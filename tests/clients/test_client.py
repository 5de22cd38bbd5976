"""`HubClient` against a real hub (uvicorn on 127.0.0.1, a real SQLite file).

Every ``hub.sessions`` method is checked against the in-process ``SessionManager`` on the
same store: same values, same types. Subscriptions are checked across a socket closed by
the server mid-stream and across a hub restart: every seq exactly once, in order.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from clients import LATEST, ConnectionLost, HubClient, HubError, RemoteTool
from clients.errors import error_from
from hub import LATEST as ENGINE_LATEST
from hub import SessionManager, SqliteStore
from hub.server import Hub, create_app
from protocol import (
    Compaction,
    Conflict,
    ContextBlock,
    ContextError,
    Event,
    InvalidInput,
    InvalidMessage,
    Message,
    NotFound,
    PositionLost,
    PruneResult,
    SearchResult,
    SessionHubError,
    SessionInfo,
    SessionNotFound,
    StoreError,
    SummarizerError,
)
from tests.support.hubtest import Served, eventually, text_message


def hub_of(app: Starlette) -> Hub:
    hub: Hub = app.state.hub
    return hub


async def drop_subscribers(app: Starlette) -> int:
    """Close, from the server side, every connection that has a subscription."""
    closed = 0
    for connection in list(hub_of(app).connections):
        if (connection.subscriptions or connection.parked) and not connection.closed:
            await connection.close(1011, "test")
            closed += 1
    return closed


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Starlette]:
    application = create_app(db=tmp_path / "x.db")
    served = Served(application)
    await served.start()
    application.state.url = served.ws_url
    try:
        yield application
    finally:
        await served.stop()


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[HubClient]:
    async with HubClient(app.state.url, max_backoff=0.2, open_timeout=5) as hub:
        yield hub


def manager_of(app: Starlette) -> SessionManager:
    return hub_of(app).manager


async def test_sessions_mirror_the_manager(app: Starlette, client: HubClient) -> None:
    local = manager_of(app)
    s = client.sessions

    info = await s.create("chat", model="gpt", source="test")
    assert type(info) is SessionInfo and info == await local.get(info.id)
    assert await s.get(info.id) == await local.get(info.id)
    assert await s.get("missing") is None
    other = await s.create("other", parent_session_id=info.id)
    assert other.parent_session_id == info.id
    listed = await s.list()
    assert listed == await local.list() and all(type(x) is SessionInfo for x in listed)
    renamed = await s.rename(info.id, "renamed")
    assert renamed == await local.get(info.id) and renamed.name == "renamed"

    assert await s.append(info.id, text_message("m1", "user", "hello tea")) == "m1"
    assert await s.append(info.id, Message.from_dict(text_message("m2", "assistant", "hi"))) == "m2"
    assert await s.upsert(info.id, text_message("m2", "assistant", "hi there tea")) == "m2"
    assert await s.append(info.id, text_message("b1", "user", "branch"), parent_id="m1") == "b1"
    assert await s.append_all(
        info.id, [text_message("m3", "user", "x"), text_message("m4", "user", "y")]
    ) == ("m4")
    assert await s.append_all(info.id, [], parent_id=None) is None
    assert await s.append_all(info.id, []) == await local.append_all(info.id, []) == "m4"

    history = await s.get_history(info.id)
    assert history == await local.get_history(info.id)
    assert all(type(m) is Message for m in history)
    assert [m.id for m in await s.get_history(info.id, "b1")] == ["m1", "b1"]
    branches = await s.get_branches(info.id, "m1")
    assert branches == await local.get_branches(info.id, "m1") and [m.id for m in branches] == ["m2", "b1"]
    count = await s.get_message_count(info.id)
    assert type(count) is int and count == await local.get_message_count(info.id) == 4

    results = await s.search("tea")
    assert results == await local.search("tea") and results
    assert all(type(r) is SearchResult for r in results)

    compaction = await s.add_compaction(info.id, "summary", "m1", "m2")
    assert type(compaction) is Compaction
    compactions = await s.get_compactions(info.id)
    assert compactions == await local.get_compactions(info.id) == [compaction]

    fork = await s.fork(info.id, "m3", "forked")
    assert fork == await local.get(fork.id)
    assert await s.get_history(fork.id) == await local.get_history(fork.id)

    usage = await s.add_usage(info.id, 10, 5, 0.25)
    assert usage == await local.get(info.id) and usage.input_tokens == 10

    tools = await s.tools()
    engine_tools = local.tools()
    assert [(t.name, t.description, t.input_schema) for t in tools] == [
        (t.name, t.description, t.input_schema) for t in engine_tools
    ]
    assert all(type(t) is RemoteTool for t in tools)
    assert await tools[0].execute({"query": "tea"}) == await engine_tools[0].execute({"query": "tea"})
    assert await tools[0].execute('{"query": "tea"}') == await engine_tools[0].execute({"query": "tea"})

    deleted = await s.delete_messages(info.id, ["m4", "nope"])
    assert deleted == ["m4"]
    assert await s.get_history(info.id) == await local.get_history(info.id)

    split = await s.compact_and_split(info.id, "the story so far", name="part 2")
    assert split == await local.get(split.id) and split.name == "part 2"
    ended = await s.get(info.id)
    assert ended is not None and ended.end_reason == "compaction"

    finished = await s.end(split.id, reason="the user is done")
    assert type(finished) is SessionInfo and finished == await local.get(split.id)
    assert finished.end_reason == "the user is done"
    with pytest.raises(Conflict, match="already ended"):  # the engine's error, typed
        await s.end(split.id)

    await s.clear_messages(fork.id)
    assert await local.get_history(fork.id) == []
    await s.delete(fork.id)
    assert await local.get(fork.id) is None
    assert await s.list() == await local.list()


async def test_parent_id_latest_none_and_engine_latest(client: HubClient) -> None:
    s = client.sessions
    info = await s.create("tree")
    await s.append(info.id, text_message("a", "user", "a"))
    await s.append(info.id, text_message("b", "user", "b"), parent_id=LATEST)
    assert ENGINE_LATEST is LATEST
    await s.append(info.id, text_message("c", "user", "c"), ENGINE_LATEST)
    await s.append(info.id, text_message("r", "user", "root"), parent_id=None)
    assert [m.id for m in await s.get_history(info.id, "c")] == ["a", "b", "c"]
    assert [m.id for m in await s.get_history(info.id, "r")] == ["r"]


async def test_typed_errors(app: Starlette, client: HubClient) -> None:
    local = manager_of(app)
    for remote_call, local_call in [
        (client.sessions.get_history("nope"), local.get_history("nope")),
        (
            client.sessions.append("nope", text_message("m", "user", "x")),
            local.append("nope", text_message("m", "user", "x")),
        ),
        (client.session("nope").get_context_blocks(), local.get_history("nope")),
    ]:
        with pytest.raises(SessionNotFound) as remote:
            await remote_call
        with pytest.raises(SessionNotFound) as engine:
            await local_call
        assert str(remote.value) == str(engine.value)
        assert remote.value.session_id == "nope"

    # An id that reads as something else in the message: rebuilt from `detail`, exactly.
    odd = "it's \"odd\"\n: 'x'"
    with pytest.raises(SessionNotFound) as remote_odd:
        await client.sessions.get_history(odd)
    assert remote_odd.value.session_id == odd

    info = await client.sessions.create("errors")
    bad = {"id": "m", "role": "user", "parts": [{"text": "no type"}]}
    with pytest.raises(InvalidMessage) as remote_bad:
        await client.sessions.append(info.id, bad)
    with pytest.raises(InvalidMessage) as engine_bad:
        await local.append(info.id, bad)
    assert str(remote_bad.value) == str(engine_bad.value)
    assert remote_bad.value.field == engine_bad.value.field == "parts[0].type"

    with pytest.raises(InvalidInput):
        await client.sessions.get(123)  # type: ignore[arg-type]
    await same_error(lambda: client.sessions.fork("nope", "m", "f"), lambda: local.fork("nope", "m", "f"))
    await same_error(
        lambda: client.sessions.delete_messages(info.id, "m1"),
        lambda: local.delete_messages(info.id, "m1"),
        same_message=False,
    )
    # Wrong field types: the hub refuses the frame before the engine sees it (own wording).
    await same_error(
        lambda: client.sessions.rename(info.id, 5),  # type: ignore[arg-type]
        lambda: local.rename(info.id, 5),  # type: ignore[arg-type]
        same_message=False,
    )
    with pytest.raises(HubError) as unknown:
        await client.request("no_such_op")
    assert unknown.value.code == "unknown_op" and isinstance(unknown.value, SessionHubError)
    # The connection is still good after errors.
    assert await client.ping() >= 0


async def same_error(
    remote: Callable[[], Awaitable[Any]], local: Callable[[], Awaitable[Any]], *, same_message: bool = True
) -> None:
    """Both calls fail with the same exception type (or the engine's is a subclass the wire
    cannot name), the same code and, unless told otherwise, the same message."""
    with pytest.raises(SessionHubError) as over_wire:
        await remote()
    with pytest.raises(SessionHubError) as engine:
        await local()
    assert isinstance(engine.value, type(over_wire.value))
    assert over_wire.value.code == engine.value.code
    if same_message:
        assert str(over_wire.value) == str(engine.value)


async def test_error_frames_carry_detail(app: Starlette) -> None:
    """The hub's error frames carry the exception's structured detail, on the wire."""
    from websockets.asyncio.client import connect

    async with connect(app.state.url) as ws:
        await ws.send('{"op": "get_history", "id": 1, "session_id": "nope"}')
        missing = json.loads(await ws.recv())
        await ws.send('{"op": "create", "id": 2, "name": "d"}')
        sid = json.loads(await ws.recv())["result"]["id"]
        bad = {
            "op": "append",
            "id": 3,
            "session_id": sid,
            "message": {"id": "m", "role": "user", "parts": [{}]},
        }
        await ws.send(json.dumps(bad))
        invalid = json.loads(await ws.recv())
        await ws.send('{"op": "nope", "id": 4}')
        unknown = json.loads(await ws.recv())
    assert missing == {
        "frame": "error",
        "id": 1,
        "code": "not_found",
        "message": "session not found: 'nope'",
        "detail": {"session_id": "nope"},
    }
    assert invalid["code"] == "invalid" and invalid["detail"] == {
        "field": "parts[0].type",
        "problem": "must be a string",
    }
    assert "detail" not in unknown  # left out when there is none


def test_error_mapping() -> None:
    lost = error_from("not_found", "session not found: 'a b'", {"session_id": "a b"})
    assert type(lost) is SessionNotFound and lost.session_id == "a b"
    assert str(lost) == "session not found: 'a b'"
    # The subclass comes from `detail` only: the message text is never parsed.
    assert type(error_from("not_found", "session not found: 'a b'")) is NotFound
    bad = error_from(
        "invalid",
        "invalid message: parts[0].type is missing",
        {"field": "parts[0].type", "problem": "is missing"},
    )
    assert type(bad) is InvalidMessage and (bad.field, bad.problem) == ("parts[0].type", "is missing")
    assert error_from("forbidden", "forbidden", {"x": 1}).detail == {"x": 1}
    assert type(error_from("not_found", "message not found")) is NotFound
    assert error_from("too_many", "x").code == "too_many"
    assert type(error_from("invalid", 'Block "m" is readonly')) is InvalidInput
    assert type(error_from("internal", "boom")) is StoreError
    assert type(error_from("conflict", "moved")) is Conflict
    assert type(error_from("upstream", "llm down")) is SummarizerError
    assert type(error_from("unavailable", "draining")) is HubError
    position = {"stream": "s:x", "after_seq": 9, "epoch": "e", "first_seq": 1, "last_seq": 3}
    gone = error_from("not_found", "cannot serve", position)
    assert type(gone) is PositionLost and gone.detail == position
    # A detail that is not a whole position (a seq that is not an integer) stays NotFound.
    assert type(error_from("not_found", "x", {**position, "last_seq": "3"})) is NotFound


async def test_concurrent_requests(client: HubClient) -> None:
    info = await client.sessions.create("busy")
    appends = [
        client.sessions.append(info.id, text_message(f"m{i}", "user", f"n{i}"), parent_id=None)
        for i in range(25)
    ]
    reads = [client.sessions.get(info.id) for _ in range(24)]
    results = await asyncio.gather(*appends, *reads, client.ping())
    assert results[:25] == [f"m{i}" for i in range(25)]
    assert all(type(r) is SessionInfo for r in results[25:49])
    s = client.session(info.id)
    stored = await asyncio.gather(*(s.get_message(f"m{i}") for i in range(25)))
    assert [m.id if m else None for m in stored] == [f"m{i}" for i in range(25)]


# -- one session: context, prompt, tools, compaction ----------------------------------------


@dataclass
class ContextHub:
    app: Starlette
    manager: SessionManager
    client: HubClient
    release: asyncio.Event  # the compaction function waits for it


@pytest.fixture
async def context_hub(store: SqliteStore) -> AsyncIterator[ContextHub]:
    release = asyncio.Event()
    release.set()

    async def compact(messages: list[Message], context: Any) -> dict[str, str] | None:
        await release.wait()
        if len(messages) < 3:
            return None
        return {
            "from_message_id": messages[0].id,
            "to_message_id": messages[-2].id,
            "summary": "earlier talk",
        }

    manager = SessionManager(store).with_context("memory", max_tokens=100).on_compaction(compact)
    app = create_app(manager=manager)
    served = Served(app)
    await served.start()
    try:
        async with HubClient(served.ws_url, max_backoff=0.2, open_timeout=5) as hub:
            yield ContextHub(app, manager, hub, release)
    finally:
        await served.stop()


async def test_remote_session_context_ops(context_hub: ContextHub) -> None:
    manager, hub = context_hub.manager, context_hub.client
    info = await hub.sessions.create("ctx")
    s = hub.session(info.id)
    local = manager.get_session(info.id)

    blocks = await s.get_context_blocks()
    assert blocks == await local.get_context_blocks() and all(type(b) is ContextBlock for b in blocks)
    written = await s.replace_context_block("memory", "likes tea")
    assert type(written) is ContextBlock and written.content == "likes tea"
    appended = await s.append_context_block("memory", "lives in Paris")
    assert appended == await local.get_context_block("memory")
    assert await s.get_context_block("memory") == appended
    assert await s.get_context_block("nope") is None

    with pytest.raises(InvalidInput) as remote:
        await s.replace_context_block("memory", "word " * 500)
    with pytest.raises(ContextError) as engine:
        await local.replace_context_block("memory", "word " * 500)
    assert str(remote.value) == str(engine.value)

    frozen = await s.freeze_system_prompt()
    assert frozen == await local.freeze_system_prompt() and "likes tea" in frozen
    await s.replace_context_block("memory", "likes coffee")
    assert await s.freeze_system_prompt() == frozen  # frozen until refreshed
    refreshed = await s.refresh_system_prompt()
    assert "likes coffee" in refreshed and refreshed == await s.freeze_system_prompt()

    tools = await s.tools()
    assert [t.name for t in tools] == [t.name for t in await local.tools()]
    set_context = next(t for t in tools if t.name == "set_context")
    result = await set_context.execute({"label": "memory", "content": "from the model"})
    assert result.startswith("Written to memory.")
    block = await local.get_context_block("memory")
    assert block is not None and block.content == "from the model"
    assert (await set_context.execute({"label": 5})).startswith("Error:")

    # Messages through the session API.
    assert await s.append_message(text_message("m1", "user", "one")) == "m1"
    await s.append_message(text_message("m2", "assistant", "two"))
    await s.append_message(text_message("m3", "user", "three"))
    await s.append_message(text_message("r", "user", "root"), parent_id=None)
    latest = await s.get_latest_leaf()
    assert latest == await local.get_latest_leaf() and latest is not None and latest.id == "r"
    assert await s.get_message("m2") == await local.get_message("m2")
    assert await s.get_message("zz") is None
    assert await s.get_path_length("m3") == await local.get_path_length("m3") == 3
    assert await s.get_branches("m1") == await local.get_branches("m1")
    assert await s.update_message(text_message("m2", "assistant", "two, edited")) is True
    assert await s.update_message(text_message("zz", "assistant", "x")) is False
    hits = await s.search("edited")
    assert hits == await local.search("edited") and [h.id for h in hits] == ["m2"]

    compacted = await s.compact("m3")
    assert compacted == {"from_message_id": "m1", "to_message_id": "m2", "summary": "earlier talk"}
    assert await s.get_compactions() == await local.get_compactions()
    assert [m.id for m in await s.get_history("m3")] == [m.id for m in await local.get_history("m3")]
    assert await s.compact("r") is None


async def test_in_flight_request_fails_on_drop_and_client_recovers(context_hub: ContextHub) -> None:
    hub, release, server = context_hub.client, context_hub.release, hub_of(context_hub.app)
    info = await hub.sessions.create("slow")
    for i in range(3):
        await hub.sessions.append(info.id, text_message(f"m{i}", "user", "x"))
    release.clear()
    events = hub.subscribe(info.id)
    first = await anext(events)  # subscribed: the server closes this connection below
    assert first.seq == 1
    pending = asyncio.create_task(hub.session(info.id).compact())
    await eventually(lambda: any(c.requests for c in server.connections))
    for connection in list(server.connections):
        await connection.close(1011, "test")
    with pytest.raises(ConnectionLost) as lost:
        await pending
    assert lost.value.code == "unavailable"
    release.set()
    assert await hub.ping() >= 0  # waits for the reconnect
    assert hub.reconnects == 1
    await events.aclose()


# -- subscriptions -----------------------------------------------------------------------


async def next_event(events: AsyncIterator[Event], waiting: asyncio.Event | None = None) -> Event:
    if waiting is not None:
        waiting.set()  # seen once this task blocks in anext (nothing awaits before it)
    return await anext(events)


async def test_subscribe_backlog_then_live(app: Starlette, client: HubClient) -> None:
    info = await client.sessions.create("live")
    await client.sessions.append(info.id, text_message("m1", "user", "one"))
    local = manager_of(app).get_session(info.id)
    events = client.subscribe(info.id)
    backlog = [await anext(events), await anext(events)]
    assert backlog == await local.read_events()
    assert all(type(e) is Event for e in backlog)
    await client.sessions.append(info.id, text_message("m2", "user", "two"))
    live = await anext(events)
    assert live.seq == 3 and live.type == "message.appended"
    assert live == (await local.read_events(2))[0]
    await events.aclose()
    # From a position: nothing old, then live.
    events = client.session(info.id).subscribe(after_seq=3)
    await client.sessions.rename(info.id, "renamed")
    event = await anext(events)
    assert event.seq == 4
    await events.aclose()


async def test_several_subscriptions_on_one_client(app: Starlette, client: HubClient) -> None:
    a = await client.sessions.create("a")
    b = await client.sessions.create("b")
    registry = client.sessions.registry_events()
    first = await anext(registry)
    assert first.stream == "registry" and first.session_id == a.id
    streams = [client.subscribe(a.id), client.subscribe(b.id)]
    for sid, stream in zip([a.id, b.id], streams, strict=True):
        assert (await anext(stream)).session_id == sid
    await asyncio.gather(
        client.sessions.append(a.id, text_message("x", "user", "x")),
        client.sessions.append(b.id, text_message("y", "user", "y")),
    )
    got = [await anext(s) for s in streams]
    assert [(e.session_id, e.data["message"]["id"]) for e in got] == [(a.id, "x"), (b.id, "y")]
    assert (await anext(registry)).session_id == b.id
    with pytest.raises(InvalidInput):
        await anext(client.subscribe(a.id))  # one subscription per stream
    for s in [*streams, registry]:
        await s.aclose()
    await eventually(lambda: not any(c.subscriptions or c.parked for c in hub_of(app).connections))
    # After closing, the stream can be followed again, with no stale event.
    again = client.subscribe(a.id, after_seq=1)
    assert (await anext(again)).seq == 2
    await again.aclose()


async def test_break_unsubscribes(app: Starlette, client: HubClient) -> None:
    info = await client.sessions.create("brk")
    async for event in client.subscribe(info.id):
        assert event.seq == 1
        break
    await eventually(lambda: not any(c.subscriptions or c.parked for c in hub_of(app).connections))
    async for event in client.subscribe(info.id):  # the stream is free again
        assert event.seq == 1
        break


async def test_subscribe_unknown_session(client: HubClient) -> None:
    with pytest.raises(SessionNotFound):
        await anext(client.subscribe("no-such-session"))
    assert await client.ping() >= 0


async def test_reset_raises_position_lost(app: Starlette, client: HubClient) -> None:
    info = await client.sessions.create("reset")
    with pytest.raises(PositionLost) as lost:
        await anext(client.subscribe(info.id, after_seq=50))
    assert lost.value.last_seq == 1 and lost.value.first_seq == 1 and lost.value.after_seq == 50
    assert lost.value.epoch
    # A wrong epoch is a reset too.
    with pytest.raises(PositionLost):
        await anext(client.subscribe(info.id, after_seq=1, epoch="not-the-epoch"))
    # reload=True: continue from the reset's last_seq, silently.
    events = client.subscribe(info.id, after_seq=50, reload=True)
    waiter = asyncio.create_task(next_event(events))
    # Resubscribed from the reset's last_seq and live: an append now is a live event.
    await eventually(lambda: any(info.id in c.parked for c in hub_of(app).connections))
    await client.sessions.append(info.id, text_message("m", "user", "m"))
    event = await asyncio.wait_for(waiter, 5)
    assert event.seq == 2 and event.epoch == lost.value.epoch
    await events.aclose()


async def test_drop_mid_stream_every_seq_once(app: Starlette, client: HubClient) -> None:
    info = await client.sessions.create("drop")
    local = manager_of(app)
    received: list[Event] = []
    total = 200

    async def subscriber() -> None:
        appended = 0
        async for event in client.subscribe(info.id):
            received.append(event)
            if event.type == "message.appended":
                appended += 1
                if appended == total:
                    return

    async def writer() -> None:
        for i in range(total):
            await local.append(info.id, text_message(f"m{i}", "user", f"n{i}"))
            await asyncio.sleep(0.001)  # pacing, not a wait: the subscriber reads as we write
            if i in (60, 140):
                # Once the client follows the stream again, cut its socket mid-stream.
                await eventually(
                    lambda: any(
                        (c.subscriptions or c.parked) and not c.closed for c in hub_of(app).connections
                    ),
                    interval=0.005,
                )
                assert await drop_subscribers(app) == 1

    async with asyncio.timeout(10):
        await asyncio.gather(subscriber(), writer())
    log = await local.get_session(info.id).read_events(0, 10_000)
    assert [e.seq for e in received] == list(range(1, len(log) + 1))
    assert received == log
    assert client.reconnects == 2


async def test_hub_restart_resumes_subscription(tmp_path: Path) -> None:
    db = tmp_path / "restart.db"
    served = Served(create_app(db=db))
    await served.start()
    received: list[Event] = []
    try:
        async with HubClient(served.ws_url, max_backoff=0.1, open_timeout=5) as client:
            info = await client.sessions.create("restart")
            for i in range(5):
                await client.sessions.append(info.id, text_message(f"a{i}", "user", "x"))
            events = client.subscribe(info.id)
            for _ in range(6):
                received.append(await anext(events))
            await served.stop()  # the hub goes away: 1001 or 1012, then connection refused

            # Written while the hub is down, straight into the database.
            store = await SqliteStore.open(db)
            try:
                for i in range(5):
                    await SessionManager(store).append(info.id, text_message(f"b{i}", "user", "y"))
            finally:
                await store.close()

            await served.start()  # a new hub on the same port and database
            await client.sessions.append(info.id, text_message("c0", "user", "z"))  # waits for it
            async with asyncio.timeout(5):
                while received[-1].seq < 12:
                    received.append(await anext(events))
            await events.aclose()
            assert client.reconnects >= 1
    finally:
        await served.stop()
    assert [e.seq for e in received] == list(range(1, 13))
    ids = [e.data["message"]["id"] for e in received if e.type == "message.appended"]
    assert ids == [*(f"a{i}" for i in range(5)), *(f"b{i}" for i in range(5)), "c0"]


async def test_without_reconnect_a_drop_ends_the_client(app: Starlette) -> None:
    async with HubClient(app.state.url, reconnect=False) as client:
        info = await client.sessions.create("once")
        events = client.subscribe(info.id)
        assert (await anext(events)).seq == 1
        await drop_subscribers(app)
        with pytest.raises(ConnectionLost):
            await anext(events)
        with pytest.raises(ConnectionLost):
            await client.ping()


async def test_close_ends_subscriptions_and_fails_requests(app: Starlette) -> None:
    client = HubClient(app.state.url)
    await client.connect()
    info = await client.sessions.create("closing")
    events = client.subscribe(info.id)
    assert (await anext(events)).seq == 1
    waiting = asyncio.Event()
    waiter = asyncio.create_task(next_event(events, waiting))
    await waiting.wait()
    await client.aclose()
    with pytest.raises(StopAsyncIteration):
        await waiter
    with pytest.raises(ConnectionLost):
        await client.ping()


async def test_cannot_connect() -> None:
    with pytest.raises(ConnectionLost):
        async with HubClient("ws://127.0.0.1:9/ws", open_timeout=2):
            pass


async def test_token_is_sent_as_bearer(tmp_path: Path) -> None:
    inner = create_app(db=tmp_path / "auth.db")
    seen: list[str | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            headers = dict(scope["headers"])
            value = headers.get(b"authorization")
            seen.append(None if value is None else value.decode())
        await inner(scope, receive, send)

    served = Served(app)
    await served.start()
    try:
        async with HubClient(served.ws_url, token="s3cret", name="worker-1", role="worker") as client:
            assert client.name == "worker-1" and client.role == "worker"
            await client.ping()
        async with HubClient(served.ws_url) as client:
            await client.ping()
    finally:
        await served.stop()
    assert seen == ["Bearer s3cret", None]


def test_public_names_are_where_the_docs_say() -> None:
    """`from clients import ...` is unchanged by the split into modules, one concept each."""
    import clients
    from clients import api, client, errors, streaming, turns

    expected = {
        "LATEST": api,
        "RemoteSession": api,
        "RemoteSessions": api,
        "RemoteTool": api,
        "HubClient": client,
        "ConnectionLost": errors,
        "HubError": errors,
        "TokenExpired": errors,
        "Turn": turns,
        "LiveMessages": streaming,
        "MessageStream": streaming,
    }
    assert set(clients.__all__) == {*expected, "ParentArg"}
    for name, module in expected.items():
        assert getattr(clients, name) is getattr(module, name), name
    assert clients.LATEST is ENGINE_LATEST


# -- event logs: read_events, read_registry_events, prune_events, estimate_tokens -----------


async def test_read_events_matches_the_engine(app: Starlette, client: HubClient) -> None:
    local = manager_of(app)
    info = await client.sessions.create("log")
    remote = client.session(info.id)
    for i in range(5):
        await remote.append_message(text_message(f"m{i}", "user", f"message {i}"))
    await remote.update_message(text_message("m1", "user", "edited"))
    await remote.delete_messages(["m3"])
    engine = local.get_session(info.id)
    for after_seq, limit in [(0, 1000), (0, 3), (2, 2), (6, 1000), (8, 1000), (0, 0)]:
        ours = await remote.read_events(after_seq, limit)
        theirs = await engine.read_events(after_seq, limit)
        assert ours == theirs, (after_seq, limit)
        assert all(isinstance(e, Event) for e in ours)
    everything = await remote.read_events()
    assert [e.seq for e in everything] == list(range(1, 9))
    assert [e.type for e in everything][-2:] == ["message.updated", "message.deleted"]
    # The registry's log, as the manager reads it.
    assert await client.sessions.read_registry_events() == await local.read_registry_events()
    assert await client.sessions.read_registry_events(0, 1) == await local.read_registry_events(0, 1)
    # A position the log cannot serve is the engine's PositionLost, fields and all.
    with pytest.raises(PositionLost) as in_process:
        await engine.read_events(50)
    with pytest.raises(PositionLost) as over_socket:
        await remote.read_events(50)
    assert over_socket.value.detail == in_process.value.detail
    assert str(over_socket.value) == str(in_process.value)
    # Bad input: typed, as in-process; an unknown session is SessionNotFound.
    with pytest.raises(InvalidInput, match="limit must be at most 10000"):
        await remote.read_events(0, 10_001)
    with pytest.raises(InvalidInput):
        await remote.read_events("0")  # type: ignore[arg-type]
    with pytest.raises(SessionNotFound):
        await client.session("no-such-session").read_events()
    # A deleted session keeps its final event, and it can still be read.
    await client.sessions.delete(info.id)
    [deleted] = await remote.read_events(8)
    assert (deleted.seq, deleted.type) == (9, "session.deleted")
    assert [deleted] == await engine.read_events(8)


async def test_prune_events_over_the_socket(app: Starlette, client: HubClient) -> None:
    local = manager_of(app)
    info = await client.sessions.create("prune")
    for i in range(6):
        await client.sessions.append(info.id, text_message(f"m{i}", "user", f"message {i}"))
    last = (await client.session(info.id).read_events())[-1].seq
    result = await client.sessions.prune_events(keep_per_session=2)
    assert isinstance(result, PruneResult)
    assert result.events >= last - 2 and result.streams >= 1
    assert [e.seq for e in await client.session(info.id).read_events(last - 2)] == [last - 1, last]
    with pytest.raises(PositionLost):
        await client.session(info.id).read_events(0)
    # An age as a timedelta, in seconds, or a time: nothing is that old here.
    for age in (timedelta(days=1), 3600, 0.5, datetime.now(UTC) - timedelta(hours=1)):
        assert await client.sessions.prune_events(older_than=age) == PruneResult(events=0, streams=0)
    # A cutoff in the future prunes what is left, as the engine's would.
    before = await local.read_registry_events()
    assert before
    done = await client.sessions.prune_events(older_than=datetime.now(UTC) + timedelta(minutes=1))
    assert done.events >= len(before) + 2
    # Typed errors, as the engine raises them (or the wire's, for what the wire refuses).
    for kwargs in (
        {},
        {"older_than": -5},
        {"older_than": timedelta(0)},
        {"keep_per_session": -1},
        {"keep_per_session": 2, "batch": 0},
        {"older_than": True},
        {"older_than": "yesterday"},
        {"older_than": 1e300},
    ):
        with pytest.raises(InvalidInput):
            await client.sessions.prune_events(**kwargs)
    with pytest.raises(InvalidInput) as engine_error:
        await local.prune_events(keep_per_session=-1)
    with pytest.raises(InvalidInput) as remote_error:
        await client.sessions.prune_events(keep_per_session=-1)
    assert str(remote_error.value) == str(engine_error.value)


async def test_estimate_tokens_matches_the_engine(app: Starlette, client: HubClient) -> None:
    local = manager_of(app)
    info = await client.sessions.create("estimate")
    remote = client.session(info.id)
    assert await remote.estimate_tokens() == await local.get_session(info.id).estimate_tokens() == 0
    await remote.append_message(text_message("m0", "user", "a few words to count"))
    await remote.append_message(text_message("m1", "assistant", "and a few more words in reply"))
    estimate = await remote.estimate_tokens()
    assert estimate > 0 and estimate == await local.get_session(info.id).estimate_tokens()
    assert (
        await remote.estimate_tokens("m0")
        == await local.get_session(info.id).estimate_tokens("m0")
        < estimate
    )
    with pytest.raises(SessionNotFound):
        await client.session("no-such-session").estimate_tokens()
