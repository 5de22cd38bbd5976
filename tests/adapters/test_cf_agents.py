"""Cloudflare's agent chat protocol at ``/agents/{agent}/{name}`` (hub/adapters/cf_agents.py).

Cloudflare's own client code drives it first: ``agents`` 0.32's ``AgentClient`` and the
``WebSocketChatTransport`` of ``agents/chat/transport`` (what ``useAgentChat`` uses), on
Node 22 (tests/js7/cf-agents.test.mjs). Then raw frames for the tokens and bad input. Tabs
on two hub nodes: tests/adapters/test_doors_on_nodes.py.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx2
import pytest
from websockets.asyncio.client import ClientConnection, connect

from hub.adapters import cf_rooms
from hub.adapters.cf_agents import session_of
from hub.auth import issue_token
from hub.server import HubConfig
from tests.adapters.test_aisdk_ws import SECRET
from tests.support.chatkit import responder
from tests.support.hubtest import eventually, served
from tests.support.nodetests import JS7, node22, run_node_tests


async def test_the_agents_sdk_client_against_the_hub(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        await run_node_tests(node22(), JS7 / "cf-agents.test.mjs", {"SESSIONHUB_URL": h.url}, passes=3)


async def _until(ws: ClientConnection, kind: str) -> dict[str, Any]:
    async with asyncio.timeout(10):
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] == kind:
                return dict(frame)


def _request(request_id: str, *texts: str) -> str:
    messages = [
        {"id": str(uuid.uuid4()), "role": "user", "parts": [{"type": "text", "text": t}]} for t in texts
    ]
    body = json.dumps({"messages": messages, "trigger": "submit-message"})
    return json.dumps(
        {"type": "cf_agent_use_chat_request", "id": request_id, "init": {"method": "POST", "body": body}}
    )


async def test_tokens_read_watches_write_posts_other_sessions_see_nothing(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient(base_url=h.url) as http:
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        await h.hub.store.create_session("chat", session_id=sid)
        url = f"ws://127.0.0.1:{h.port}/agents/chat-agent/{name}"
        read = issue_token(SECRET, {sid: "read"})
        async with connect(f"{url}?token={read}") as ws:
            assert (await _until(ws, "cf_agent_chat_messages"))["messages"] == []
            await ws.send(_request("r1", "hi"))
            refused = await _until(ws, "cf_agent_use_chat_response")
            assert refused["id"] == "r1" and refused["error"] and "forbidden" in refused["body"]
            await ws.send(json.dumps({"type": "cf_agent_chat_clear"}))
            await ws.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "p"}))
            assert (await _until(ws, "cf_agent_stream_resume_none")) == {
                "type": "cf_agent_stream_resume_none",
                "reason": "idle",
                "probeId": "p",
            }
        other = issue_token(SECRET, {"chat-agent:else": "admin"})
        async with connect(f"{url}?token={other}") as ws:
            error = await _until(ws, "cf_agent_state_error")
            assert "forbidden" in error["error"]
        async with connect(url) as ws:
            assert "unauthorized" in (await _until(ws, "cf_agent_state_error"))["error"]
        assert (await http.get(f"/agents/chat-agent/{name}/get-messages")).status_code == 401
        ok = await http.get(
            f"/agents/chat-agent/{name}/get-messages", headers={"authorization": f"Bearer {read}"}
        )
        assert ok.status_code == 200 and ok.json() == []
        assert await h.hub.manager.get_history(sid) == []


@pytest.mark.parametrize(
    "frame",
    [
        '{"type":"cf_agent_use_chat_request","id":"b1"}',
        '{"type":"cf_agent_use_chat_request","id":"b0","init":"POST"}',
        '{"type":"cf_agent_use_chat_request","id":"b2","init":{"body":"not json"}}',
        '{"type":"cf_agent_use_chat_request","id":"b3","init":{"body":"{\\"messages\\":[]}"}}',
        '{"type":"cf_agent_use_chat_request","id":"b4","init":{"body":"{\\"messages\\":[{\\"id\\":5}]}"}}',
    ],
)
async def test_bad_chat_requests_are_answered_with_an_error_and_nothing_is_written(
    tmp_path: Path, frame: str
) -> None:
    async with served(db=tmp_path / "hub.db") as h:
        async with connect(f"ws://127.0.0.1:{h.port}/agents/chat-agent/bad") as ws:
            await _until(ws, "cf_agent_chat_messages")
            await ws.send("not json at all")
            await ws.send(frame)
            answer = await _until(ws, "cf_agent_use_chat_response")
            assert answer["id"] == json.loads(frame)["id"] and answer["error"] and answer["done"]
            assert answer["body"].startswith("invalid: "), answer  # typed, as the hub's own errors
        assert await h.hub.manager.get(session_of("chat-agent", "bad")) is None


async def _response_chunks(ws: ClientConnection, request_id: str) -> list[dict[str, Any]]:
    """The chunks of one ``cf_agent_use_chat_response`` stream, until its ``done``."""
    chunks: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while True:
            frame = json.loads(await ws.recv())
            if frame["type"] != "cf_agent_use_chat_response" or frame["id"] != request_id:
                continue
            if frame["done"]:
                assert not frame.get("error"), frame
                return chunks
            chunks.append(json.loads(frame["body"]))


@pytest.mark.parametrize("approved", [True, False])
async def test_a_tool_approval_and_a_client_tool_result_reach_the_responder(
    tmp_path: Path, approved: bool
) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        async with connect(f"ws://127.0.0.1:{h.port}/agents/chat-agent/{name}") as ws:
            await _until(ws, "cf_agent_chat_messages")
            await ws.send(_request("q1", "approve the deploy"))
            first = await _response_chunks(ws, "q1")
            asked = next(c for c in first if c["type"] == "tool-approval-request")
            reply_id = first[0]["messageId"]
            await ws.send(
                json.dumps(
                    {
                        "type": "cf_agent_tool_approval",
                        "toolCallId": asked["toolCallId"],
                        "approved": approved,
                        "autoContinue": True,
                    }
                )
            )
            rest = await _response_chunks(ws, reply_id)
            assert rest[0] == {"type": "start", "messageId": reply_id}
            text = "".join(c.get("delta", "") for c in rest if c["type"] == "text-delta")
            assert text == ("Deployed." if approved else "Not deployed: denied.")
            # Approving again: nothing is pending, the socket says so and nothing changes.
            await ws.send(
                json.dumps(
                    {"type": "cf_agent_tool_approval", "toolCallId": asked["toolCallId"], "approved": True}
                )
            )
            await asyncio.sleep(0.2)
            stored = await h.hub.manager.get_session(sid).get_message(reply_id)
            assert stored is not None
            tool = next(p for p in stored.parts if p["type"] == "tool-deploy")
            assert tool["state"] == ("output-available" if approved else "output-denied")

            await ws.send(_request("q2", "client tool please"))
            asked_call = next(
                c for c in await _response_chunks(ws, "q2") if c["type"] == "tool-input-available"
            )
            second_reply = h.hub.turns.in_flight(sid)
            assert second_reply is not None
            await ws.send(
                json.dumps(
                    {
                        "type": "cf_agent_tool_result",
                        "toolCallId": asked_call["toolCallId"],
                        "toolName": "locate",
                        "output": "Lisbon",
                        "autoContinue": True,
                    }
                )
            )
            rest = await _response_chunks(ws, second_reply.reply_id)
            assert (
                "".join(c.get("delta", "") for c in rest if c["type"] == "text-delta") == "You are in Lisbon."
            )


async def test_a_socket_without_read_hears_nothing_of_the_chat(tmp_path: Path) -> None:
    """A socket whose token does not reach the session is not in its room: another tab's
    messages and clears are not sent to it."""
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        await h.hub.store.create_session("chat", session_id=sid)
        url = f"ws://127.0.0.1:{h.port}/agents/chat-agent/{name}"
        writer = issue_token(SECRET, {sid: "write"})
        stranger = issue_token(SECRET, {"chat-agent:else": "admin"})
        async with connect(f"{url}?token={stranger}") as outsider, connect(f"{url}?token={writer}") as tab:
            await _until(outsider, "cf_agent_state_error")
            await _until(tab, "cf_agent_chat_messages")
            message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "secret"}]}
            await tab.send(json.dumps({"type": "cf_agent_chat_messages", "messages": [message]}))
            await tab.send(json.dumps({"type": "cf_agent_chat_clear"}))
            await tab.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "p"}))
            await _until(tab, "cf_agent_stream_resume_none")  # the tab's frames were all handled
            await asyncio.sleep(0.1)  # and the log follower's, which come after a short wait
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await outsider.recv()
            room = cf_rooms._ROOMS[id(h.hub), sid]
            follower = room.follower
            assert follower is not None and not follower.done()
        assert await h.hub.manager.get_history(sid) == []
        # The last tab gone, its room goes, and the room's log follower with it.
        await eventually(lambda: (id(h.hub), sid) not in cf_rooms._ROOMS and follower.done())


async def _handled(ws: ClientConnection) -> None:
    """Every frame sent on ``ws`` so far has been handled (a socket handles them in order)."""
    await ws.send(json.dumps({"type": "cf_agent_stream_resume_request", "probeId": "done?"}))
    await _until(ws, "cf_agent_stream_resume_none")


async def test_two_hubs_in_one_process_keep_their_own_rooms(tmp_path: Path) -> None:
    """The same agent and name on two hubs (two apps of one process, two databases) are two
    sessions: a tab of one is not in the other's room, and hears none of its messages."""
    async with served(db=tmp_path / "a.db") as a, served(db=tmp_path / "b.db") as b:
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        async with connect(f"ws://127.0.0.1:{a.port}/agents/chat-agent/{name}") as tab_a:
            await _until(tab_a, "cf_agent_chat_messages")
            message = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "only on a"}]}
            await tab_a.send(json.dumps({"type": "cf_agent_chat_messages", "messages": [message]}))
            await _handled(tab_a)
            async with connect(f"ws://127.0.0.1:{b.port}/agents/chat-agent/{name}") as tab_b:
                assert (await _until(tab_b, "cf_agent_chat_messages"))["messages"] == []
                await _handled(tab_b)
                second = {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "more on a"}]}
                transcript = [message, second]  # a client sends its whole transcript
                await tab_a.send(json.dumps({"type": "cf_agent_chat_messages", "messages": transcript}))
                await _handled(tab_a)
                await asyncio.sleep(0.1)  # the room's log follower waits a moment too
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await tab_b.recv()
        assert [m.id for m in await a.hub.manager.get_history(sid)] == ["m1", "m2"]
        assert await b.hub.manager.get(sid) is None


async def test_a_tab_whose_token_expires_is_closed_with_4001(tmp_path: Path) -> None:
    """As the hub's own socket: the room would otherwise go on sending the chat to it."""
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        await h.hub.store.create_session("chat", session_id=sid)
        url = f"ws://127.0.0.1:{h.port}/agents/chat-agent/{name}"
        lasting = issue_token(SECRET, {sid: "read"}, ttl=600)
        brief = issue_token(SECRET, {sid: "read"}, ttl=1)
        async with connect(f"{url}?token={brief}") as ws, connect(f"{url}?token={lasting}") as other:
            await _until(ws, "cf_agent_chat_messages")
            await _until(other, "cf_agent_chat_messages")
            async with asyncio.timeout(5):
                await ws.wait_closed()
            assert ws.close_code == 4001 and "expired" in (ws.close_reason or "")
            await _handled(other)  # the other tab, whose token lasts, is still served
            await eventually(lambda: len(cf_rooms._ROOMS[id(h.hub), sid].sockets) == 1)


class _WatchedLock(asyncio.Lock):
    """The room's ``telling`` lock, telling when someone had to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        if self.locked():
            self.waited.set()
        return await super().acquire()


async def test_a_transcript_read_in_flight_across_a_clear_neither_undoes_it_nor_echoes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind a flaky clear across nodes (tests/js7/cf-agents-nodes.test.mjs): the
    room's follower read the transcript, a tab cleared, then the read's (older) transcript
    was sent and marked as shown, so the log's ``messages.cleared`` told the clearing tab its
    own clear, and the other tab a second one. Here the read is held in flight, in order."""
    real_history = cf_rooms.Room.history
    held, release = asyncio.Event(), asyncio.Event()
    hold = False

    async def history(room: cf_rooms.Room) -> list[dict[str, Any]]:
        messages = await real_history(room)
        if hold and not held.is_set():
            held.set()  # read, not yet told
            await release.wait()
        return messages

    monkeypatch.setattr(cf_rooms.Room, "history", history)
    async with served(db=tmp_path / "hub.db") as h:
        name = uuid.uuid4().hex
        sid = session_of("chat-agent", name)
        await h.hub.store.create_session("chat", session_id=sid)
        url = f"ws://127.0.0.1:{h.port}/agents/chat-agent/{name}"
        async with connect(url) as clearing, connect(url) as other:
            for tab in (clearing, other):
                await _until(tab, "cf_agent_chat_messages")
            await h.hub.manager.append(sid, _message("m1"), None)
            await _until(other, "cf_agent_chat_messages")  # the follower's transcript
            await _until(clearing, "cf_agent_chat_messages")
            room = cf_rooms._ROOMS[id(h.hub), sid]
            lock = room.telling = _WatchedLock()
            hold = True
            await h.hub.manager.append(sid, _message("m2"), None)  # the follower reads it (a root of its own)
            async with asyncio.timeout(10):
                await held.wait()
            await clearing.send(json.dumps({"type": "cf_agent_chat_clear"}))

            async def cleared() -> bool:
                return await h.hub.manager.get_history(sid) == []

            async def clear_went_on() -> bool:
                """The clear is written, or waits for the read (then the read goes on)."""
                return lock.waited.is_set() or await cleared()

            await eventually(clear_went_on)
            release.set()
            await eventually(cleared)
            # A write after the clear: once each tab is told it, the log's clear was handled.
            await h.hub.manager.append(sid, _message("m3"), None)
            told: dict[str, list[str | list[str]]] = {}
            for tab_name, tab in (("clearing", clearing), ("other", other)):
                seen = told[tab_name] = []
                async with asyncio.timeout(10):
                    while seen[-1:] != [["m3"]]:
                        frame = json.loads(await tab.recv())
                        if frame["type"] == "cf_agent_chat_clear":
                            seen.append("clear")
                        elif frame["type"] == "cf_agent_chat_messages":
                            seen.append([m["id"] for m in frame["messages"]])
        # The read's transcript went first (it was read first), the clear after it, once,
        # to the other tab only; nothing from before the clear after it.
        assert told == {"clearing": [["m2"], ["m3"]], "other": [["m2"], "clear", ["m3"]]}


def _message(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": message_id}]}
