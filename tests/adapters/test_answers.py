"""The user's word to a running turn over the chat doors (hub/adapters/answers.py,
hub/server/turnanswers.py): tool approvals and client tool results answered by posting
the reply back (what ``useChat`` does after ``addToolApprovalResponse`` /
``addToolOutput``), checked by the hub, stored in the tree, the reply continuing as the same
message; and steering messages (``steer_turn``, ``POST /api/chat/{id}/steer``).

The real AI SDK 7 drives the same paths in tests/js7/chat-ws.test.mjs; here raw HTTP and
the Python client check what the SDK never sends (forged, repeated and foreign answers).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from pathlib import Path
from typing import Any

import httpx2
import pytest

from hub.auth import issue_token
from hub.server import HubConfig
from protocol import Conflict, InvalidInput, NotFound
from tests.support.chatkit import responder, sse_chunks
from tests.support.hubtest import Served, served

SECRET = "s" * 32


def _user(text: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "user", "parts": [{"type": "text", "text": text}]}


async def _post(http: httpx2.AsyncClient, h: Served, body: dict[str, Any], **headers: str) -> list[Any]:
    async with http.stream("POST", f"{h.url}/api/chat", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return [r.status_code, r.json()]
        return [c async for c in sse_chunks(r)]


async def _ended(h: Served, session_id: str) -> None:
    async with asyncio.timeout(10):
        while not any(
            e.type == "turn.ended" for e in await h.hub.manager.get_session(session_id).read_events()
        ):
            await asyncio.sleep(0.02)


def _page_copy(h: Served, session_id: str, reply_id: str) -> dict[str, Any]:
    current = h.hub.streams.current(session_id, reply_id)
    assert current is not None
    return copy.deepcopy(current[0])


def _answered(message: dict[str, Any], approved: bool, reason: str | None = None) -> dict[str, Any]:
    """What addToolApprovalResponse leaves in the page's copy of the reply."""
    for part in message["parts"]:
        if part.get("state") == "approval-requested":
            part["state"] = "approval-responded"
            part["approval"] = {**part["approval"], "approved": approved}
            if reason is not None:
                part["approval"]["reason"] = reason
    return message


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_round_trip_over_sse(tmp_path: Path, approved: bool) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        ask = _user("approve the deploy")
        first = await _post(http, h, {"id": "c1", "messages": [ask]})
        types = [c["type"] for c in first[:-1]]
        # The request ends at the question (the SDK's own step end); the turn does not.
        assert "tool-approval-request" in types and types[-1] == "finish", types
        assert first[-2]["finishReason"] == "tool-calls"
        reply_id = first[0]["messageId"]
        turn = h.hub.turns.in_flight("c1")
        assert turn is not None and turn.reply_id == reply_id
        page = _answered(_page_copy(h, "c1", reply_id), approved, None if approved else "not today")

        second = await _post(http, h, {"id": "c1", "messages": [ask, page]})
        assert second[0] == {"type": "start", "messageId": reply_id}
        assert second[-1] == "[DONE]" and second[-2]["type"] == "finish"
        text = "".join(c["delta"] for c in second if isinstance(c, dict) and c["type"] == "text-delta")
        # Only what came after the page's copy: not the first text again.
        assert "approval" not in text
        assert text == ("Deployed." if approved else "Not deployed: not today.")
        assert ("tool-output-available" if approved else "tool-output-denied") in [
            c["type"] for c in second if isinstance(c, dict)
        ]
        stored = await h.hub.manager.get_session("c1").get_message(reply_id)
        assert stored is not None
        tool = next(p for p in stored.parts if p["type"] == "tool-deploy")
        assert tool["state"] == ("output-available" if approved else "output-denied")
        assert tool["approval"]["approved"] is approved
        history = await h.hub.manager.get_session("c1").get_history()
        assert [m.id for m in history] == [ask["id"], reply_id]  # one reply, continued


async def test_forged_repeated_and_foreign_answers_are_refused(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    writer = issue_token(SECRET, {"c2": "write"})
    reader = issue_token(SECRET, {"c2": "read"})
    other = issue_token(SECRET, {"elsewhere": "write"})
    admin = issue_token(SECRET, {"*": "admin"})
    async with (
        served(db=tmp_path / "hub.db", config=config) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1, token=admin),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        await h.hub.store.create_session("c2", session_id="c2")
        ask = _user("approve it")
        auth = {"authorization": f"Bearer {writer}"}
        first = await _post(http, h, {"id": "c2", "messages": [ask]}, **auth)
        reply_id = first[0]["messageId"]
        page = _answered(_page_copy(h, "c2", reply_id), True)

        # A read token cannot answer; a token for another session cannot either.
        status, _ = await _post(
            http, h, {"id": "c2", "messages": [ask, page]}, authorization=f"Bearer {reader}"
        )
        assert status == 403
        status, _ = await _post(
            http, h, {"id": "c2", "messages": [ask, page]}, authorization=f"Bearer {other}"
        )
        assert status in (403, 404)
        # An approval the reply never asked for: nothing answered, 409.
        forged = copy.deepcopy(page)
        for part in forged["parts"]:
            if "approval" in part:
                part["approval"]["id"] = "ap-made-up"
        status, error = await _post(http, h, {"id": "c2", "messages": [ask, forged]}, **auth)
        assert status == 409 and error["error"]["code"] == "conflict"
        current = _page_copy(h, "c2", reply_id)
        assert any(p.get("state") == "approval-requested" for p in current["parts"])

        # The real answer goes through once; the same answer again is refused.
        second = await _post(http, h, {"id": "c2", "messages": [ask, page]}, **auth)
        assert second[-1] == "[DONE]"
        status, error = await _post(http, h, {"id": "c2", "messages": [ask, page]}, **auth)
        assert status in (404, 409), error  # the turn has ended, or nothing is pending


async def test_answer_tool_and_a_client_tool_result_over_the_socket(tmp_path: Path) -> None:
    from clients import HubClient

    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        HubClient(h.ws_url) as client,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        ask = _user("client tool please")
        first = await _post(http, h, {"id": "c3", "messages": [ask]})
        reply_id = first[0]["messageId"]
        session = client.session("c3")
        with pytest.raises(NotFound):
            await session.answer_tool(tool_call_id="no-such-call", output="x")
        with pytest.raises(NotFound):
            await session.answer_tool(approval_id="no-such-approval", approved=True)
        call_id = next(p["toolCallId"] for p in _page_copy(h, "c3", reply_id)["parts"] if "toolCallId" in p)
        done = await session.answer_tool(tool_call_id=call_id, output="Lisbon")
        assert done["reply_id"] == reply_id
        with pytest.raises((Conflict, NotFound)):
            await session.answer_tool(tool_call_id=call_id, output="Porto")
        await _ended(h, "c3")  # the reply is stored whole by then
        stored = await h.hub.manager.get_session("c3").get_message(reply_id)
        assert stored is not None
        tool = next(p for p in stored.parts if p.get("toolCallId") == call_id)
        assert tool["state"] == "output-available" and tool["output"] == "Lisbon"
        assert stored.text().endswith("You are in Lisbon.")


async def test_an_answer_the_reply_refuses_does_not_count_as_given(tmp_path: Path) -> None:
    """An answer is marked given once it reaches the reply: one whose output the reply
    refuses (JSON nested past what a part may hold) is an error, and the user may answer
    again, rather than be told the tool was answered already."""
    from clients import HubClient

    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        HubClient(h.ws_url) as client,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        first = await _post(http, h, {"id": "c5", "messages": [_user("client tool please")]})
        reply_id = first[0]["messageId"]
        session = client.session("c5")
        call_id = next(p["toolCallId"] for p in _page_copy(h, "c5", reply_id)["parts"] if "toolCallId" in p)
        deep: Any = "bottom"
        for _ in range(200):
            deep = [deep]
        with pytest.raises(InvalidInput, match="nests deeper"):
            await session.answer_tool(tool_call_id=call_id, output=deep)
        done = await session.answer_tool(tool_call_id=call_id, output="Lisbon")
        assert done["reply_id"] == reply_id
        await _ended(h, "c5")
        stored = await h.hub.manager.get_session("c5").get_message(reply_id)
        assert stored is not None and stored.text().endswith("You are in Lisbon.")


async def test_a_steering_message_reaches_the_running_turn(tmp_path: Path) -> None:
    from clients import HubClient

    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        HubClient(h.ws_url) as client,
        httpx2.AsyncClient(timeout=30) as http,
    ):
        ask = _user("steer me")

        async def steer_soon() -> Any:
            while h.hub.turns.in_flight("c4") is None or not h.hub.turns.in_flight("c4").started:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            return await client.session("c4").steer_turn("use Paris, Texas")

        steering = asyncio.create_task(steer_soon())
        chunks = await _post(http, h, {"id": "c4", "messages": [ask]}, **{"x-sessionhub-ai-sdk": "7"})
        steered = await steering
        text = "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
        assert text == "Working -> told: use Paris, Texas Done."
        (chunk,) = [c for c in chunks if isinstance(c, dict) and c["type"] == "steering-message"]
        assert chunk["parts"] == [{"type": "text", "text": "use Paris, Texas"}]
        stored = await h.hub.manager.get_session("c4").get_message(steered["reply_id"])
        assert stored is not None
        assert [p["type"] for p in stored.parts].count("steering-message") == 1
        # Not a new turn: the session holds the question and the one reply.
        assert len(await h.hub.manager.get_session("c4").get_history()) == 2
        with pytest.raises(NotFound):
            await client.session("c4").steer_turn("too late")


async def test_steer_over_http_and_an_ai_sdk_6_page_is_not_sent_v7_chunks(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    writer = issue_token(SECRET, {"c5": "write"})
    reader = issue_token(SECRET, {"c5": "read"})
    admin = issue_token(SECRET, {"*": "admin"})
    async with (
        served(db=tmp_path / "hub.db", config=config) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1, token=admin),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        await h.hub.store.create_session("c5", session_id="c5")
        steer = f"{h.url}/api/chat/c5/steer"
        r = await http.post(steer, json={"text": "x"}, headers={"authorization": f"Bearer {writer}"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"  # nothing in flight

        async def steer_soon() -> httpx2.Response:
            while h.hub.turns.in_flight("c5") is None or not h.hub.turns.in_flight("c5").started:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            refused = await http.post(
                steer, json={"text": "no"}, headers={"authorization": f"Bearer {reader}"}
            )
            assert refused.status_code == 403
            bad = await http.post(steer, content=b"{", headers={"authorization": f"Bearer {writer}"})
            assert bad.status_code == 400
            return await http.post(
                steer, json={"text": "go left"}, headers={"authorization": f"Bearer {writer}"}
            )

        steering = asyncio.create_task(steer_soon())
        chunks = await _post(
            http, h, {"id": "c5", "messages": [_user("steer me")]}, authorization=f"Bearer {writer}"
        )
        accepted = await steering
        assert accepted.status_code == 202
        text = "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
        assert text == "Working -> told: go left Done."
        # No x-sessionhub-ai-sdk: 7 header: an AI SDK 6 page, whose schema refuses the chunk.
        assert "steering-message" not in [c["type"] for c in chunks if isinstance(c, dict)]
        stored = await h.hub.manager.get_session("c5").get_message(accepted.json()["reply_id"])
        assert stored is not None and any(p["type"] == "steering-message" for p in stored.parts)
