"""A chat resumed on another node (hub/server/remoteturns.py): two real ``sessionhub serve``
processes on one real Postgres, a real responder, real HTTP. The reply is posted on node A
and resumed on node B mid-reply, from its start, once, in order, to its end; after the turn
ended B answers 204, as A does.

One pair of nodes (``nodes``) serves every test that leaves them running, each in sessions
of its own: a pair takes seconds to start and stop. The test that kills a node has its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import pytest_asyncio

from clients import HubClient
from hub import Message, SqliteStore
from hub.server.remoteturns import TurnLog, latest_turn_event
from hub.store.base import LogEntry
from protocol import Conflict
from tests.support.chatkit import responder, sse_chunks
from tests.support.hubtest import eventually, text
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

Nodes = tuple[Node, Node, httpx2.AsyncClient]


def _http(node: Node) -> str:
    return f"http://127.0.0.1:{node.port}"


@contextlib.asynccontextmanager
async def _two_nodes(*options: str) -> AsyncIterator[Nodes]:
    """Nodes A and B (``serve --turn-timeout 20`` and ``options``) on one scratch Postgres
    database, and an HTTP client for both."""
    async with (
        scratch_database(postgres_dsn()) as database,
        Node(database, "postgres", None, "--turn-timeout", "20", *options) as a,
        Node(database, "postgres", None, "--turn-timeout", "20", *options) as b,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        yield a, b, http


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def nodes() -> AsyncIterator[Nodes]:
    async with _two_nodes() as pair:
        yield pair


async def _until_no_turn(http: httpx2.AsyncClient, node: Node, sid: str) -> None:
    """Wait until ``node`` answers 204 to a resume: no turn of ``sid`` is in flight."""

    async def idle() -> bool:
        return (await http.get(f"{_http(node)}/api/chat/{sid}/stream")).status_code == 204

    await eventually(idle)


def _text(chunks: list[dict[str, Any] | str]) -> str:
    return "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")


async def _resume(http: httpx2.AsyncClient, node: Node, sid: str) -> list[dict[str, Any] | str]:
    async with http.stream("GET", f"{_http(node)}/api/chat/{sid}/stream") as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        return [c async for c in sse_chunks(r)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("worker_on", ["a", "b"])
async def test_a_reply_posted_on_a_resumes_on_b_whole_and_once(nodes: Nodes, worker_on: str) -> None:
    a, b, http = nodes
    sid = f"resume-{worker_on}"
    # Before any turn: 204 on both nodes.
    for node in (a, b):
        assert (await http.get(f"{_http(node)}/api/chat/{sid}/stream")).status_code == 204
    worker = a if worker_on == "a" else b
    async with responder(worker.ws_url, lambda: True, name=f"agent-on-{worker_on}"):
        body = {"id": sid, "messages": [text("u1", "slow please")]}
        posted: list[dict[str, Any] | str] = []
        resumed: list[dict[str, Any] | str] = []
        async with http.stream("POST", f"{_http(a)}/api/chat", json=body) as r:
            assert r.status_code == 200
            chunks = sse_chunks(r)
            # Mid-reply: some words out, most to come (40 words, 40 ms apart).
            while len([c for c in posted if isinstance(c, dict) and c["type"] == "text-delta"]) < 5:
                posted.append(await anext(chunks))
            resume = asyncio.create_task(_resume(http, b, sid))
            posted += [c async for c in chunks]
            resumed = await resume
        # Once the turn ended (A logged turn.ended), B says nothing is in flight.
        await _until_no_turn(http, b, sid)
        assert (await http.get(f"{_http(a)}/api/chat/{sid}/stream")).status_code == 204
    whole = " ".join(f"w{i}" for i in range(40)) + " "
    assert _text(posted) == whole
    assert resumed[0] == posted[0]  # the same reply id
    assert _text(resumed) == whole, resumed  # from its start, each word once, in order
    assert resumed[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
    # The same chunk kinds as the posting node's stream, in the same order.
    kinds = [c["type"] for c in resumed if isinstance(c, dict) and c["type"] != "text-delta"]
    assert kinds == [c["type"] for c in posted if isinstance(c, dict) and c["type"] != "text-delta"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop_on", ["a", "b"])
async def test_a_stop_on_any_node_stops_a_reply_streaming_on_another(nodes: Nodes, stop_on: str) -> None:
    a, b, http = nodes
    sid = f"stop-{stop_on}"
    async with responder(b.ws_url, lambda: True, name="agent-on-b"):
        body = {"id": sid, "messages": [text("u1", "slow please")]}
        chunks: list[dict[str, Any] | str] = []
        async with http.stream("POST", f"{_http(a)}/api/chat", json=body) as r:
            assert r.status_code == 200
            async for chunk in sse_chunks(r):
                chunks.append(chunk)
                if chunk == {"type": "text-delta", "id": "text-0", "delta": "w3 "}:
                    stopped = await http.post(f"{_http(a if stop_on == 'a' else b)}/api/chat/{sid}/stop")
                    assert stopped.status_code == 200, stopped.text
        assert chunks[-2:] == [{"type": "abort", "reason": "stopped by the user"}, "[DONE]"]
        await _until_no_turn(http, b, sid)
    streamed = _text(chunks)
    assert 0 < len(streamed.split()) < 40
    async with HubClient(a.ws_url) as user:
        session = user.session(sid)
        reply = await session.get_message(str(chunks[0]["messageId"]))  # type: ignore[index]
        async with asyncio.timeout(10):
            async for event in session.events():
                if event.type == "turn.ended":
                    ended = event.data
                    break
    # Stored as it stood when the stop reached node B (a delta or two may have been on the way).
    assert reply is not None and reply.text().startswith(streamed)
    assert ended["status"] == "stopped" and ended["reason"] == "stopped by the user"


@pytest.mark.timeout(120)
async def test_a_resume_ends_when_the_node_running_the_turn_dies() -> None:
    async with (
        _two_nodes("--presence-ttl", "2") as (a, b, http),
        # reconnect=False: once node A is killed the worker has nowhere to go, and its
        # client's retries would only hold the test's exit up.
        HubClient(a.ws_url, name="endless", role="worker", reconnect=False) as agent,
    ):

        async def endless() -> None:
            async for turn in agent.turns():
                async with turn.reply() as st:
                    while True:
                        await st.text("more ")
                        await asyncio.sleep(0.02)

        worker = asyncio.create_task(endless())
        try:
            body = {"id": "dies", "messages": [text("u1", "go on")]}
            async with http.stream("POST", f"{_http(a)}/api/chat", json=body) as posted:
                assert posted.status_code == 200
                async with http.stream("GET", f"{_http(b)}/api/chat/dies/stream") as r:
                    assert r.status_code == 200
                    chunks: list[dict[str, Any] | str] = []
                    async for chunk in sse_chunks(r):
                        chunks.append(chunk)
                        if len(chunks) == 5:
                            assert a.proc is not None
                            a.proc.kill()  # node A dies mid-reply: no turn.ended is ever logged
            assert chunks[-2:] == [
                {"type": "error", "errorText": "the hub node running this turn went away"},
                "[DONE]",
            ]
            assert (await http.get(f"{_http(b)}/api/chat/dies/stream")).status_code == 204
        finally:
            worker.cancel()
            with contextlib.suppress(BaseException):
                await worker


async def _post(http: httpx2.AsyncClient, node: Node, body: dict[str, Any]) -> httpx2.Response:
    """``POST /api/chat``, its body left unread (a reply streams on)."""
    return await http.send(http.build_request("POST", f"{_http(node)}/api/chat", json=body), stream=True)


@pytest.mark.timeout(120)
async def test_a_turn_streaming_on_a_refuses_a_second_turn_on_b_until_it_ended(nodes: Nodes) -> None:
    a, b, http = nodes
    async with (
        responder(a.ws_url, lambda: True, name="agent-on-a"),
        HubClient(b.ws_url) as user_b,
    ):
        body = {"id": "busy", "messages": [text("u1", "slow please")]}
        async with http.stream("POST", f"{_http(a)}/api/chat", json=body) as r:
            assert r.status_code == 200
            chunks = sse_chunks(r)
            assert (await anext(chunks))["type"] == "start"  # type: ignore[index]
            second = await http.post(f"{_http(b)}/api/chat", json=body)
            assert second.status_code == 409, second.text
            error = second.json()["error"]
            assert error["code"] == "conflict"
            assert "still in flight in this session (on hub node" in error["message"]
            with pytest.raises(Conflict, match="still in flight"):
                await user_b.session("busy").start_turn("u1")
            rest = [c async for c in chunks]
        assert rest[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
        # At once (the stream ends after turn.ended is written): B takes the next turn.
        again = {"id": "busy", "messages": [text("u1", "slow please"), text("u2", "hi")]}
        async with http.stream("POST", f"{_http(b)}/api/chat", json=again) as r:
            assert r.status_code == 200, await r.aread()
            after = [c async for c in sse_chunks(r)]
        assert after[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
        assert (await user_b.session("busy").start_turn("u2"))["trigger"] == "submit-message"


@pytest.mark.timeout(180)
async def test_two_posts_at_once_on_two_nodes_start_one_turn(nodes: Nodes) -> None:
    rounds = 12
    a, b, http = nodes
    async with (
        responder(a.ws_url, lambda: True, name="agent-on-a"),
        HubClient(a.ws_url) as user,
    ):
        sids = []
        for i in range(rounds):
            info = await user.sessions.create(f"race {i}")
            await user.sessions.append(info.id, text("u1", "slow please"))
            sids.append(info.id)
        # Both nodes must have heard of each other (a silent node's turns count as over).
        await asyncio.sleep(1.0)
        for sid in sids:
            body = {"id": sid, "messages": [text("u1", "slow please")]}
            responses = await asyncio.gather(_post(http, a, body), _post(http, b, body))
            try:
                codes = sorted(r.status_code for r in responses)
                assert codes == [200, 409], (sid, codes)
                loser = next(r for r in responses if r.status_code == 409)
                assert json.loads(await loser.aread())["error"]["code"] == "conflict"
                stopped = await http.post(f"{_http(b)}/api/chat/{sid}/stop")
                assert stopped.status_code == 200, stopped.text
                winner = next(r for r in responses if r.status_code == 200)
                chunks = [c async for c in sse_chunks(winner)]
                assert chunks[-2:] == [{"type": "abort", "reason": "stopped by the user"}, "[DONE]"]
            finally:
                for r in responses:
                    await r.aclose()
            # The refused turn's pair is in the log, and no scan mistakes it for the turn.
            async with http.stream("GET", f"{_http(b)}/api/chat/{sid}/stream") as r:
                assert r.status_code == 204
        # A start refused before it logged anything leaves nothing; one that lost the race
        # after both logged turn.started leaves its pair, ended ``refused``.
        raced = 0
        for sid in sids:
            ended = []
            async with asyncio.timeout(10):
                async for event in user.session(sid).events():
                    if event.type == "turn.ended":
                        ended.append(event.data)
                        if event.data["status"] == "stopped":
                            break
            assert [d["status"] for d in ended] in (["stopped"], ["failed", "stopped"]), ended
            if len(ended) == 2:
                raced += 1
                assert ended[0]["refused"] is True and "still in flight" in ended[0]["error"]
        print(f"{raced} of {rounds} rounds were decided after both nodes logged turn.started")


async def test_the_turn_log_follows_the_log_as_a_full_scan_would(tmp_path: Path) -> None:
    """What a stream_start on a node with several nodes asks (issue 24, item 8): read once,
    then only what was logged since, with a lost start race's pair looked past."""
    async with await SqliteStore.open(tmp_path / "hub.db") as store:
        await store.create_session("t", session_id="s1")
        turns = TurnLog(store)

        async def log(type_: str, turn: str, **data: Any) -> None:
            entry = LogEntry(
                session_id="s1", type=type_, data={"turn_id": turn, "reply_id": f"r-{turn}", **data}
            )
            await store.log_event(entry)

        async def agree() -> tuple[str, Any] | None:
            """The cached answer, checked against a full scan: (type, turn id)."""
            cached, scanned = await turns.latest("s1"), await latest_turn_event(store, "s1")
            assert (cached and cached.seq) == (scanned and scanned.seq)
            return None if cached is None else (cached.type, cached.data["turn_id"])

        assert await agree() is None
        await log("turn.started", "t1", node="a")
        assert await agree() == ("turn.started", "t1")
        await store.append_messages("s1", [Message.from_dict(text("m1", "between"))], None)
        await log("turn.started", "t2", node="b")
        await log("turn.ended", "t2", status="failed", refused=True)
        assert await agree() == ("turn.started", "t1")  # t2 lost the start race
        await log("turn.ended", "t1", status="finished")
        assert await agree() == ("turn.ended", "t1")


def _answered(message: dict[str, Any]) -> dict[str, Any]:
    parts = []
    for part in message["parts"]:
        if part.get("state") == "approval-requested":
            part = {**part, "state": "approval-responded", "approval": {**part["approval"], "approved": True}}
        parts.append(part)
    return {**message, "parts": parts}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("worker_on", "answer_on"), [("a", "b"), ("b", "b"), ("b", "a")])
async def test_an_approval_and_a_steering_message_reach_a_turn_on_another_node(
    nodes: Nodes, worker_on: str, answer_on: str
) -> None:
    """Posted on A; the responder on ``worker_on``; the page's answer and a steering
    message sent to ``answer_on``: each travels to the node whose responder waits."""
    a, b, http = nodes
    sid = f"approve-{worker_on}-{answer_on}"
    worker = a if worker_on == "a" else b
    answering = a if answer_on == "a" else b
    async with responder(worker.ws_url, lambda: True, name=f"agent-on-{worker_on}"):
        ask = text("u1", "approve it")
        async with http.stream("POST", f"{_http(a)}/api/chat", json={"id": sid, "messages": [ask]}) as r:
            assert r.status_code == 200
            first = [c async for c in sse_chunks(r)]
        assert any(isinstance(c, dict) and c["type"] == "tool-approval-request" for c in first)
        reply_id = first[0]["messageId"]  # type: ignore[index]
        async with HubClient(answering.ws_url) as client:
            page = None

            async def asked() -> bool:
                nonlocal page
                history = await client.session(sid).get_history()
                mine = [m for m in history if m.id == reply_id]
                if mine and any(p.get("state") == "approval-requested" for p in mine[0].parts):
                    page = mine[0].to_dict()
                    return True
                return False

            await eventually(asked)
            assert page is not None
            body = {"id": sid, "messages": [ask, _answered(page)]}
            async with http.stream("POST", f"{_http(answering)}/api/chat", json=body) as r:
                assert r.status_code == 200, await r.aread()
                rest = [c async for c in sse_chunks(r)]
            assert _text(rest) == "Deployed."
        await _until_no_turn(http, a, sid)
        async with HubClient(a.ws_url) as stored:
            message = await stored.session(sid).get_message(reply_id)
        assert message is not None
        tool = next(p for p in message.parts if p["type"] == "tool-deploy")
        assert tool["state"] == "output-available" and tool["approval"]["approved"] is True

        # Steering across nodes too.
        async with HubClient(answering.ws_url) as client, HubClient(a.ws_url) as poster:
            steer = asyncio.create_task(_steer_when_started(poster, client, sid))
            body = {"id": sid, "messages": [ask, message.to_dict(), text("u2", "steer it")]}
            async with http.stream("POST", f"{_http(a)}/api/chat", json=body) as r:
                chunks = [c async for c in sse_chunks(r)]
            await steer
        assert _text(chunks) == "Working -> told: left Done."


async def _steer_when_started(poster: HubClient, client: HubClient, sid: str) -> None:
    """Steer through ``client`` once the posting node's turn has started (``get_turn``
    answers for the node's own turns)."""

    async def started() -> bool:
        turn = await poster.session(sid).get_turn()
        return bool(turn and turn.get("started"))

    await eventually(started)
    await client.session(sid).steer_turn("left")
