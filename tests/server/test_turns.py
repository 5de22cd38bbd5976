"""Turns (hub/server/turndispatch.py) over the WebSocket: ``start_turn``, who gets a turn, hand-over when
a responder goes away, what a responder may answer, and the outcome in the log. Real
uvicorn, real ``HubClient`` responders and raw sockets; across nodes, real ``sessionhub
serve`` pairs, one per bus for every test of the module (they take seconds to start, and
no test here stops one; each test has its own session)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import msgspec
import pytest
import pytest_asyncio

from clients import HubClient, HubError, Turn
from hub.auth import issue_token
from hub.bus import doorbell
from hub.server import HubConfig
from protocol import Conflict, NotFound
from tests.support.chatkit import responder, sse_chunks
from tests.support.hubtest import Client, Served, eventually, served, text
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn, redis_url

SECRET = "a-test-secret-of-at-least-32-bytes!!"

#: The tests on a node pair run on the module's loop, the pair's processes' loop.
on_nodes = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Node, Node]]:
    """Nodes A and B on one scratch database, ringing each other on ``request.param``'s bus."""
    url = redis_url() if request.param == "redis" else "postgres"
    async with (
        scratch_database(postgres_dsn()) as database,
        Node(database, url, None, "--turn-timeout", "20") as a,
        Node(database, url, None, "--turn-timeout", "20") as b,
    ):
        yield a, b


async def _session(h: Served, sid: str = "s1") -> None:
    await h.hub.store.create_session("t", session_id=sid)
    await h.hub.manager.append(sid, text("u1", "hello"), None)


async def _taker(c: Client) -> None:
    reply = await c.request("take_turns")
    assert reply["frame"] == "reply", reply


async def _outcome(h: Served, sid: str) -> dict[str, Any]:
    async with asyncio.timeout(5):
        while True:
            events = await h.hub.manager.get_session(sid).read_events()
            ended = [e for e in events if e.type == "turn.ended"]
            if ended:
                return ended[-1].data
            await asyncio.sleep(0.01)


async def test_start_turn_and_regenerate(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        await _session(h)
        async with HubClient(h.ws_url) as user:
            s = user.session("s1")
            turn = await s.start_turn("u1")
            assert turn["parent_id"] == "u1" and turn["trigger"] == "submit-message"
            assert (await _outcome(h, "s1"))["status"] == "finished"
            history = await s.get_history()
            assert [m.id for m in history] == ["u1", turn["reply_id"]]
            assert history[-1].text() == "You said: hello"
            # The inspector's call: leaf_id names the assistant leaf, so it regenerates.
            again = await user.request("start_turn", session_id="s1", leaf_id=turn["reply_id"])
            assert again["trigger"] == "regenerate-message" and again["parent_id"] == "u1"
            async with asyncio.timeout(5):
                while len(await s.get_branches("u1")) < 2 or h.hub.turns.in_flight("s1"):
                    await asyncio.sleep(0.01)
            assert {m.id for m in await s.get_branches("u1")} == {turn["reply_id"], again["reply_id"]}
            types = [e.type for e in await h.hub.manager.get_session("s1").read_events()]
            assert types.count("turn.started") == 2 and types.count("turn.ended") == 2
            assert await user.request("get_turn", session_id="s1") is None


async def test_a_turn_nobody_started_goes_to_another_responder(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h:
        await _session(h)
        async with h.client() as quitter:
            await _taker(quitter)
            async with HubClient(h.ws_url) as user:
                turn = await user.session("s1").start_turn()
                given = await quitter.take(lambda f: f["frame"] == "turn")
                assert given["reply_id"] == turn["reply_id"] and given["parent_id"] == "u1"
                assert [m["id"] for m in given["history"]] == ["u1"]
                async with responder(h.ws_url, lambda: len(h.hub.turns.responders) == 2):
                    await quitter.ws.close()  # never started: handed to the other one
                    assert (await _outcome(h, "s1"))["status"] == "finished"
                stored = await user.session("s1").get_message(turn["reply_id"])
                assert stored is not None and stored.text() == "You said: hello"


async def test_a_responder_dying_mid_reply_ends_the_chat_with_an_error(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as dying:
        await _session(h)
        await _taker(dying)
        body = {"id": "s1", "messages": [text("u1", "hello")]}
        async with httpx2.AsyncClient() as http, http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            chunks = sse_chunks(r)
            start = await anext(chunks)
            given = await dying.take(lambda f: f["frame"] == "turn")
            fields = {"session_id": "s1", "message_id": given["reply_id"]}
            started = await dying.call("stream_start", **fields, parent_id="u1", turn_id=given["turn_id"])
            assert started == {"index": 0}
            await dying.call("stream_delta", **fields, kind="text", text="Half a")
            assert await anext(chunks) == {"type": "text-start", "id": "text-0"}
            assert await anext(chunks) == {"type": "text-delta", "id": "text-0", "delta": "Half a"}
            await dying.ws.close()
            rest = [c async for c in chunks]
        assert start == {"type": "start", "messageId": given["reply_id"]}
        assert rest[-2] == {"type": "error", "errorText": "the responder disconnected mid-reply"}
        assert rest[-1] == "[DONE]"
        stored = await h.hub.manager.get_session("s1").get_message(given["reply_id"])
        assert stored is not None and stored.text() == "Half a"  # kept, as interrupted streams are


async def test_only_the_given_connection_may_answer(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as given_to, h.client() as other:
        await _session(h)
        await _taker(given_to)
        async with HubClient(h.ws_url) as user:
            await user.session("s1").start_turn()
            given = await given_to.take(lambda f: f["frame"] == "turn")
            fields = {"session_id": "s1", "message_id": given["reply_id"], "turn_id": given["turn_id"]}
            stolen = await other.request("stream_start", **fields)
            assert stolen["code"] == "forbidden"
            assert "given to another connection" in stolen["message"]
            wrong = await given_to.request("stream_start", **{**fields, "message_id": "m-other"})
            assert wrong["code"] == "invalid"
            failed = await other.request("turn_failed", turn_id=given["turn_id"], error="mine")
            assert failed["code"] == "not_found"
            assert (await given_to.request("turn_failed", turn_id=given["turn_id"], error="no model"))[
                "frame"
            ] == "reply"
            outcome = await _outcome(h, "s1")
            assert outcome["status"] == "failed" and "no model" in outcome["error"]


async def test_turns_go_only_to_responders_allowed_on_the_session(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET, turn_timeout=2.0)
    elsewhere = issue_token(SECRET, {"other": "write"})
    everywhere = issue_token(SECRET, {"*": "write"})
    admin = issue_token(SECRET, {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h:
        await _session(h)
        headers = {"Authorization": f"Bearer {elsewhere}"}
        async with h.client(additional_headers=headers) as narrow, HubClient(h.ws_url, token=admin) as user:
            await _taker(narrow)
            await user.session("s1").start_turn()
            await narrow.quiet(lambda f: f["frame"] == "turn", 0.3)
            async with responder(h.ws_url, lambda: len(h.hub.turns.responders) == 2, token=everywhere):
                assert (await _outcome(h, "s1"))["status"] == "finished"
            assert not [f for f in narrow.inbox if f["frame"] == "turn"]
            # A reader may not start turns.
            reader = issue_token(SECRET, {"*": "read"})
            async with HubClient(h.ws_url, token=reader) as peek:
                with pytest.raises(HubError) as refused:
                    await peek.session("s1").start_turn()
                assert refused.value.code == "forbidden"


async def test_turns_are_spread_across_responders(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as a, h.client() as b:
        for sid in ("s1", "s2", "s3", "s4"):
            await _session(h, sid)
        await _taker(a)
        await _taker(b)
        async with HubClient(h.ws_url) as user:
            for sid in ("s1", "s2", "s3", "s4"):
                await user.session(sid).start_turn()
            got_a = [await a.take(lambda f: f["frame"] == "turn") for _ in range(2)]
            got_b = [await b.take(lambda f: f["frame"] == "turn") for _ in range(2)]
        assert {f["session_id"] for f in got_a + got_b} == {"s1", "s2", "s3", "s4"}


async def test_no_responder_times_out_and_a_second_turn_waits_its_turn(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(turn_timeout=0.2)) as h:
        await _session(h)
        async with HubClient(h.ws_url) as user:
            await user.session("s1").start_turn()
            with pytest.raises(Conflict, match="is still in flight"):
                await user.session("s1").start_turn()
            outcome = await _outcome(h, "s1")
            assert outcome["status"] == "failed"
            assert outcome["error"].startswith("no worker is connected to answer this turn (waited 0.2s)")


@pytest.mark.timeout(90)
@on_nodes
@pytest.mark.parametrize("nodes", ["postgres", "redis"], indirect=True)
async def test_a_turn_posted_on_node_a_is_answered_by_a_worker_on_node_b(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    async with HubClient(a.ws_url) as user:
        info = await user.sessions.create("across nodes")
        await user.sessions.append(info.id, text("u1", "tool time"), None)
    # The responder is on B only; A learns of it through the relay.
    async with responder(b.ws_url, lambda: True, name="agent-on-b"):
        body = {"id": info.id, "messages": [text("u1", "tool time")]}
        base = a.ws_url.replace("ws://", "http://").removesuffix("/ws")
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            http.stream("POST", f"{base}/api/chat", json=body) as r,
        ):
            assert r.status_code == 200
            chunks = [c async for c in sse_chunks(r)]
    types = [c if isinstance(c, str) else c["type"] for c in chunks]
    assert types[0] == "start" and types[-2:] == ["finish", "[DONE]"], chunks
    assert "tool-output-available" in types and "reasoning-delta" in types
    async with HubClient(a.ws_url) as user:
        stored = await user.session(info.id).get_message(chunks[0]["messageId"])  # type: ignore[index]
    assert stored is not None and stored.text() == "Found 3."
    text_deltas = "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
    assert text_deltas == "Found 3."


@pytest.mark.timeout(90)
@on_nodes
@pytest.mark.parametrize("nodes", ["postgres", "redis"], indirect=True)
async def test_a_turn_with_a_long_history_reaches_a_worker_on_another_node_whole(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    async with HubClient(a.ws_url) as user:
        info = await user.sessions.create("long")
        # Multi-byte text, so a piece boundary falls inside characters too.
        chain = [text(f"h{i}", f"{i} " + "é日🙂x" * 250, "assistant" if i % 2 else "user") for i in range(31)]
        await user.sessions.append_all(info.id, chain, None)
        history = [m.to_dict() for m in await user.session(info.id).get_history()]
    # The offer is many NOTIFY payloads on Postgres (each under 8,000 bytes).
    assert len(msgspec.json.encode(history)) > 10 * doorbell.MAX_PAYLOAD
    given: list[Turn] = []
    async with HubClient(b.ws_url, name="agent-on-b", role="worker") as agent:

        async def serve() -> None:
            async for turn in agent.turns():
                given.append(turn)
                async with turn.reply() as st:
                    await st.text(f"read {len(turn.history)} messages")

        task = asyncio.create_task(serve())
        try:
            async with HubClient(a.ws_url) as user:
                session = user.session(info.id)
                turn = await session.start_turn()

                async def replied() -> bool:
                    reply = await session.get_message(turn["reply_id"])
                    return reply is not None and reply.text() == "read 31 messages"

                await eventually(replied, timeout=30)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert len(given) == 1 and given[0].message_id == "h30"
    assert [m.to_dict() for m in given[0].history] == history


async def test_stop_turn_ends_the_reply_as_it_stood_and_tells_the_responder_first(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as agent, h.client() as user:
        await _session(h)
        await _taker(agent)
        none = await user.request("stop_turn", session_id="s1")
        assert none["frame"] == "error" and none["code"] == "not_found"  # nothing in flight
        turn = await user.call("start_turn", session_id="s1")
        given = await agent.take(lambda f: f["frame"] == "turn")
        fields = {"session_id": "s1", "message_id": given["reply_id"]}
        await agent.call("stream_start", **fields, parent_id="u1", turn_id=given["turn_id"])
        await agent.call("stream_delta", **fields, kind="text", text="Half")
        wrong = await user.request("stop_turn", session_id="s1", turn_id="not-this-one")
        assert wrong["frame"] == "error" and wrong["code"] == "not_found"
        stopped = await user.call("stop_turn", session_id="s1", turn_id=turn["turn_id"], reason="enough")
        assert stopped == {"turn_id": turn["turn_id"], "reply_id": turn["reply_id"], "started": True}
        told = await agent.take(lambda f: f["frame"] == "turn_stopped")
        assert told == {
            "frame": "turn_stopped",
            "turn_id": turn["turn_id"],
            "session_id": "s1",
            "reply_id": turn["reply_id"],
            "reason": "enough",
        }
        late = await agent.request("stream_delta", **fields, kind="text", text=" more")
        assert late["frame"] == "error" and late["code"] == "invalid"  # the hub ended it
        outcome = await _outcome(h, "s1")
        assert outcome["status"] == "stopped" and outcome["reason"] == "enough"
        stored = await h.hub.manager.get_session("s1").get_message(turn["reply_id"])
        assert stored is not None and stored.text() == "Half"
        again = await user.request("stop_turn", session_id="s1", turn_id=turn["turn_id"])
        assert again["frame"] == "error" and again["code"] == "not_found"  # finished turns too


async def test_a_stopped_turn_not_yet_started_ends_at_once_and_cannot_start(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as agent, h.client() as user:
        await _session(h)
        await _taker(agent)
        turn = await user.call("start_turn", session_id="s1")
        given = await agent.take(lambda f: f["frame"] == "turn")
        stopped = await user.call("stop_turn", session_id="s1")
        assert stopped["started"] is False
        assert (await agent.take(lambda f: f["frame"] == "turn_stopped"))["turn_id"] == turn["turn_id"]
        assert (await _outcome(h, "s1"))["status"] == "stopped"
        fields = {"session_id": "s1", "message_id": given["reply_id"], "parent_id": "u1"}
        late = await agent.request("stream_start", **fields, turn_id=given["turn_id"])
        assert late["frame"] == "error" and late["code"] == "not_found"
        assert await user.call("get_turn", session_id="s1") is None


async def test_the_python_client_reads_and_stops_the_turn_in_flight(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as agent, HubClient(h.ws_url) as user:
        await _session(h)
        await _taker(agent)
        session = user.session("s1")
        assert await session.get_turn() is None
        with pytest.raises(NotFound):
            await session.stop_turn()  # nothing in flight
        turn = await session.start_turn()
        await agent.take(lambda f: f["frame"] == "turn")
        in_flight = await session.get_turn()
        assert in_flight is not None and in_flight["turn_id"] == turn["turn_id"]
        with pytest.raises(NotFound):
            await session.stop_turn("not-this-one")
        stopped = await session.stop_turn(turn["turn_id"], reason="enough")
        assert stopped == {"turn_id": turn["turn_id"], "reply_id": turn["reply_id"], "started": False}
        told = await agent.take(lambda f: f["frame"] == "turn_stopped")
        assert told["reason"] == "enough"
        assert (await _outcome(h, "s1"))["status"] == "stopped"
        assert await session.get_turn() is None


async def test_a_stop_cancels_the_python_responders_reply_block(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, HubClient(h.ws_url, name="agent", role="worker") as agent:
        await _session(h)
        seen: list[Turn] = []
        after = asyncio.Event()

        async def serve() -> None:
            async for turn in agent.turns():
                seen.append(turn)
                async with turn.reply() as st:
                    for i in range(1000):
                        await st.text(f"w{i} ")
                        await asyncio.sleep(0.01)
                after.set()  # the block was left quietly

        task = asyncio.create_task(serve())
        try:
            await eventually(lambda: bool(h.hub.turns.responders))
            async with HubClient(h.ws_url) as user:
                turn = await user.session("s1").start_turn()
                await eventually(lambda: h.hub.streams.current("s1", turn["reply_id"]) is not None)
                await asyncio.sleep(0.1)
                await user.request("stop_turn", session_id="s1")
                async with asyncio.timeout(5):
                    await after.wait()
            assert seen[0].stopped.is_set() and seen[0].stop_reason == "stopped by request"
            stored = await h.hub.manager.get_session("s1").get_message(turn["reply_id"])
            assert stored is not None and 0 < len(stored.text().split()) < 1000
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# -- a turn's reply is streamed only by its responder (issue 24, item 8) ----------------------


async def _intrude(intruder: Client, session_id: str) -> tuple[str, str]:
    """What any reader of the session sees: the turn's ids in its logged ``turn.started``.
    Every way of streaming that reply from a connection it was not given to is refused
    ``forbidden``; returns ``(turn_id, reply_id)``."""
    async with asyncio.timeout(10):
        while True:
            events = await intruder.call("read_events", session_id=session_id)
            started = [e for e in events if e["type"] == "turn.started"]
            if started:
                break
            await asyncio.sleep(0.01)
    turn_id, reply_id = started[-1]["data"]["turn_id"], started[-1]["data"]["reply_id"]
    fields = {"session_id": session_id, "message_id": reply_id}
    for claim in ({}, {"turn_id": "0" * 32}, {"turn_id": turn_id}, {"parent_id": "u1"}):
        refused = await intruder.request("stream_start", **fields, **claim)
        assert (refused["frame"], refused["code"]) == ("error", "forbidden"), (claim, refused)
    return turn_id, reply_id


async def test_a_connection_never_given_the_turn_cannot_stream_its_reply(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as real, h.client() as intruder:
        await _session(h)
        await _taker(real)
        body = {"id": "s1", "messages": [text("u1", "hello")]}
        async with httpx2.AsyncClient() as http, http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            chunks = sse_chunks(r)
            start = await anext(chunks)
            given = await real.take(lambda f: f["frame"] == "turn")
            turn_id, reply_id = await _intrude(intruder, "s1")
            assert (turn_id, reply_id) == (given["turn_id"], given["reply_id"])
            fields = {"session_id": "s1", "message_id": reply_id}
            # The real responder still starts it: the refusals claimed nothing.
            assert await real.call("stream_start", **fields, turn_id=turn_id) == {"index": 0}
            await real.call("stream_delta", **fields, kind="text", text="the real reply")
            # Into the real responder's running stream: refused too, every delta and the end.
            for op, extra in (("stream_delta", {"kind": "text", "text": " INTRUDER"}), ("stream_end", {})):
                for _ in range(3):
                    refused = await intruder.request(op, **fields, **extra)
                    assert (refused["frame"], refused["code"]) == ("error", "conflict"), refused
            await real.call("stream_end", **fields)
            rest = [c async for c in chunks]
        assert start == {"type": "start", "messageId": reply_id}
        said = "".join(c["delta"] for c in rest if isinstance(c, dict) and c["type"] == "text-delta")
        assert said == "the real reply"
        assert [c if isinstance(c, str) else c["type"] for c in rest][-2:] == ["finish", "[DONE]"]
        stored = await h.hub.manager.get_session("s1").get_message(reply_id)
        assert stored is not None and stored.text() == "the real reply"
        assert (await _outcome(h, "s1"))["status"] == "finished"
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]
    # One line per refused start, one per intruder and stream for its writes.
    assert len(refusals) == 5, refusals
    assert all(reply_id in line or turn_id in line for line in refusals), refusals


@pytest.mark.timeout(90)
@on_nodes
@pytest.mark.parametrize("nodes", ["postgres"], indirect=True)
async def test_an_intruder_on_another_node_cannot_stream_the_reply(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    async with HubClient(a.ws_url) as user:
        info = await user.sessions.create("across nodes")
        await user.sessions.append(info.id, text("u1", "hello"), None)
    async with Client.connect(a.ws_url) as real, Client.connect(b.ws_url) as intruder:
        await _taker(real)
        body = {"id": info.id, "messages": [text("u1", "hello")]}
        base = a.ws_url.replace("ws://", "http://").removesuffix("/ws")
        async with (
            httpx2.AsyncClient(timeout=30) as http,
            http.stream("POST", f"{base}/api/chat", json=body) as r,
        ):
            chunks = sse_chunks(r)
            await anext(chunks)
            given = await real.take(lambda f: f["frame"] == "turn")
            turn_id, reply_id = await _intrude(intruder, info.id)
            assert reply_id == given["reply_id"]
            fields = {"session_id": info.id, "message_id": reply_id}
            await real.call("stream_start", **fields, turn_id=turn_id)
            await real.call("stream_delta", **fields, kind="text", text="from A")
            refused = await intruder.request("stream_delta", **fields, kind="text", text="from B")
            assert refused["frame"] == "error" and refused["code"] in ("invalid", "conflict"), refused
            await real.call("stream_end", **fields)
            rest = [c async for c in chunks]
    said = "".join(c["delta"] for c in rest if isinstance(c, dict) and c["type"] == "text-delta")
    assert said == "from A"
    async with HubClient(b.ws_url) as user:
        stored = await user.session(info.id).get_message(reply_id)
    assert stored is not None and stored.text() == "from A"
