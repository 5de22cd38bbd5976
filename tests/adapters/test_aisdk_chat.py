"""The chat endpoints against the real Vercel AI SDK: a real uvicorn hub, a real responder
(a ``HubClient`` iterating ``turns()``), and ``node --test tests/js/`` driving ``ai`` 6.x
(``DefaultChatTransport``, ``readUIMessageStream``, ``validateUIMessages``, resumable
streams) and ``SessionHubChatTransport`` against them. Plus the HTTP edges in Python."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
from pathlib import Path

import httpx2
import pytest

from hub.adapters.sse import KEEPALIVE
from hub.auth import issue_token
from hub.server import HubConfig
from hub.store.base import Store
from tests.support.chatkit import responder, sse_chunks
from tests.support.hubtest import served
from tests.support.nodetests import JS, node20, run_node_tests
from tests.support.rawhttp import open_unread, read_to_end, request_head


def _websocket_flags(node_path: str) -> list[str]:
    has = subprocess.run(
        [node_path, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"], check=False
    )
    return [] if has.returncode == 0 else ["--experimental-websocket"]


async def test_the_ai_sdk_against_the_hub(tmp_path: Path) -> None:
    node_path = node20()
    # Keep-alive comments every 20 ms: the real SDK's parser meets them between chunks.
    async with (
        served(db=tmp_path / "hub.db", config=HubConfig(chat_keepalive=0.02)) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        env = {"SESSIONHUB_URL": h.url, "SESSIONHUB_WS_URL": h.ws_url}
        flags = tuple(_websocket_flags(node_path))
        await run_node_tests(node_path, JS / "chat.test.mjs", env, passes=9, flags=flags, timeout=90)


async def test_no_responder_ends_with_an_error_chunk(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(turn_timeout=0.3)) as h:
        body = {
            "id": "s-none",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
        async with httpx2.AsyncClient() as http, http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            assert r.status_code == 200
            assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
            assert r.headers["content-type"].startswith("text/event-stream")
            chunks = [c async for c in sse_chunks(r)]
        assert chunks[0]["type"] == "start"  # type: ignore[index]
        assert chunks[-1] == "[DONE]"
        error = chunks[-2]
        assert isinstance(error, dict) and error["type"] == "error"
        assert "no worker is connected" in error["errorText"]
        # Nothing was appended for the reply; the turn and its outcome are in the log.
        session = h.hub.manager.get_session("s-none")
        assert [m.id for m in await session.get_history()] == ["u1"]
        types = [e.type for e in await session.read_events()]
        assert "turn.started" in types and "turn.ended" in types
        async with httpx2.AsyncClient() as http:
            resumed = await http.get(f"{h.url}/api/chat/s-none/stream")
        assert resumed.status_code == 204


async def test_http_errors_are_typed(tmp_path: Path) -> None:
    secret = "a-test-secret-of-at-least-32-bytes!!"
    config = HubConfig(auth_secret=secret, allowed_origins=("https://app.example",))
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        body = {
            "id": "s-auth",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
        r = await http.post(f"{h.url}/api/chat", json=body)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        writer = issue_token(secret, {"s-auth": "write"})
        r = await http.post(f"{h.url}/api/chat", json=body, headers={"authorization": f"Bearer {writer}"})
        assert r.status_code == 404  # creating a session needs admin
        assert r.json()["error"]["code"] == "not_found"
        reader = issue_token(secret, {"*": "read"})
        r = await http.post(f"{h.url}/api/chat", json=body, headers={"authorization": f"Bearer {reader}"})
        assert r.status_code == 403
        r = await http.post(
            f"{h.url}/api/chat", content=b"{not json", headers={"authorization": f"Bearer {writer}"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid"
        r = await http.get(f"{h.url}/api/chat/s-auth/stream", headers={"authorization": f"Bearer {reader}"})
        assert r.status_code == 204
        # CORS follows --allowed-origin.
        pre = await http.options(f"{h.url}/api/chat", headers={"origin": "https://app.example"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in pre.headers["access-control-allow-headers"]
        bad = await http.post(f"{h.url}/api/chat", json=body, headers={"origin": "https://evil.example"})
        assert bad.status_code == 403


@pytest.mark.parametrize("trigger", ["submit-message", "regenerate-message"])
async def test_post_appends_only_what_is_new(tmp_path: Path, trigger: str) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient() as http,
    ):
        u1 = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "one"}]}
        async with http.stream("POST", f"{h.url}/api/chat", json={"id": "s2", "messages": [u1]}) as r:
            chunks = [c async for c in sse_chunks(r)]
        reply = chunks[0]["messageId"]  # type: ignore[index]
        stored = await h.hub.manager.get_session("s2").get_message(reply)
        assert stored is not None
        body = {"id": "s2", "messages": [u1], "trigger": trigger, "messageId": reply}
        async with http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            again = [c async for c in sse_chunks(r)]
        second = again[0]["messageId"]  # type: ignore[index]
        session = h.hub.manager.get_session("s2")
        # u1 was not appended twice; both replies hang off it.
        assert await session.get_path_length() == 2
        assert sorted(m.id for m in await session.get_branches("u1")) == sorted([reply, second])


async def test_an_idle_reply_stream_sends_keep_alive_comments(tmp_path: Path) -> None:
    # No responder: the turn waits turn_timeout with nothing to say. Comment lines go out
    # meanwhile (a proxy that cuts idle streams keeps this one), and the chunks around them
    # are the same as without them.
    config = HubConfig(turn_timeout=0.8, chat_keepalive=0.1)
    async with served(db=tmp_path / "hub.db", config=config) as h:
        body = {
            "id": "s-idle",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
        async with httpx2.AsyncClient() as http, http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            lines = [line async for line in r.aiter_lines()]
    assert lines.count(KEEPALIVE.decode().strip()) >= 3
    data = [line for line in lines if line.startswith("data: ")]
    assert data[0].startswith('data: {"type":"start"') and data[-1] == "data: [DONE]"
    assert '"type":"error"' in data[-2]
    # Every non-blank line is a chunk or a comment: nothing else was sent.
    assert all(line.startswith(("data: ", ":")) for line in lines if line)


def test_the_keep_alive_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chat_keepalive"):
        HubConfig(chat_keepalive=0)


# -- every door as hard as the socket (issue 24, items 1-4) ----------------------------------

SECRET = "a-test-secret-of-at-least-32-bytes!!"


def _chat(session_id: str, part: str) -> bytes:
    """A chat request as bytes around one raw JSON part (one json.dumps cannot write)."""
    message = f'{{"id":"u1","role":"user","parts":[{part}]}}'
    return f'{{"id":{json.dumps(session_id)},"messages":[{message}]}}'.encode()


def _nested(depth: int) -> str:
    return '{"type":"data-x","data":' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [900, 5000])
async def test_a_deeply_nested_part_is_invalid_and_nothing_is_written(
    tmp_path: Path, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    """5,000 deep was a plain-text 500 with a traceback (the decoder's RecursionError); 900
    deep, within the decoder's reach, is refused by the message checks, and left the new
    chat's session behind, empty."""
    caplog.set_level(logging.ERROR)
    async with served(db=tmp_path / "hub.db") as h, httpx2.AsyncClient() as http:
        r = await http.post(
            f"{h.url}/api/chat",
            content=_chat("s-deep", _nested(depth)),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid"
        assert await h.hub.manager.get("s-deep") is None
    assert [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR] == []


async def test_the_token_and_the_size_are_checked_before_the_body_is_read(tmp_path: Path) -> None:
    """A 128 MiB POST without a token was read whole (RSS +159-256 MiB) before its 401.
    Each answer here comes while all but a few bytes of the declared body are unsent."""
    config = HubConfig(auth_secret=SECRET, max_body_bytes=64 << 10)
    admin = issue_token(SECRET, {"*": "admin"})
    huge = {"content-type": "application/json", "content-length": str(128 << 20)}
    start = b'{"id":"s-big","messages":['
    async with served(db=tmp_path / "hub.db", config=config) as h:
        for path in ("/api/chat", "/mcp"):
            no_token = await request_head(h.port, "POST", path, huge, start)
            assert no_token.status == 401, (path, no_token)
            too_big = await request_head(
                h.port, "POST", path, {**huge, "authorization": f"Bearer {admin}"}, start
            )
            assert too_big.status == 413, (path, too_big)
            # No length declared: the chunks are counted as they come and cut at the bound.
            chunked = {"content-type": "application/json", "transfer-encoding": "chunked"}
            chunk = b"%x\r\n%s\r\n" % (40 << 10, b" " * (40 << 10))
            cut = await request_head(
                h.port, "POST", path, {**chunked, "authorization": f"Bearer {admin}"}, chunk * 3
            )
            assert cut.status == 413, (path, cut)
            for answer in (no_token, too_big, cut):
                error = answer.json()["error"]
                assert (error["data"]["code"] if path == "/mcp" else error["code"]) in (
                    "unauthorized",
                    "too_large",
                )
        assert await h.hub.manager.get("s-big") is None


def _past_socket_buffers() -> int:
    """KiB of reply that a stalled reader's socket cannot all hold: twice the most the
    server's send buffer may grow to (``tcp_wmem``, 4 MiB by default), 8 MiB at least."""
    try:
        most = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        most = 4 << 20
    return max(8192, 2 * most >> 10)


async def _metric(http: httpx2.AsyncClient, url: str, name: str) -> float:
    text = (await http.get(f"{url}/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize(
    ("reason", "config", "kib"),
    [
        ("behind", HubConfig(outbox_bytes=256 << 10, send_timeout=30), 4096),
        # Past what the kernel's socket buffers take, so that a send waits.
        ("timeout", HubConfig(outbox_bytes=64 << 20, send_timeout=0.5), _past_socket_buffers()),
    ],
)
async def test_a_reader_that_stops_reading_is_dropped_and_the_reply_goes_on(
    tmp_path: Path, reason: str, config: HubConfig, kib: int
) -> None:
    """A poster plus 40 resumers of an 8 MiB reply that never read held 333-528 MiB, all
    still connected 15 s after the reply ended. Now a resumer that stops reading is cut once
    it is outbox_bytes behind (or a send waits send_timeout), the metric counts it, and the
    poster still reads the whole reply, which is stored whole."""
    async with (
        served(db=tmp_path / "hub.db", config=config) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        body = {
            "id": "s-big",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": f"big {kib}"}]}],
        }
        async with http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            chunks = sse_chunks(r)
            first = await anext(chunks)
            stalled = await open_unread(h.port, "GET", "/api/chat/s-big/stream", {})
            rest = [c async for c in chunks]
        read = await read_to_end(stalled)  # the hub ended that connection
        stalled.close()
        dropped = await _metric(http, h.url, f'sessionhub_sse_dropped_total{{reason="{reason}"}}')
        reply = first["messageId"]  # type: ignore[index]
        stored = await h.hub.manager.get_session("s-big").get_message(reply)
        held = h.hub.sse_held.outbox
    deltas = "".join(c["delta"] for c in rest if isinstance(c, dict) and c["type"] == "text-delta")
    print(f"{reason}: the stalled reader got {read} bytes of {len(deltas)} and was dropped ({dropped:.0f})")
    assert rest[-2:] == [{"type": "finish", "finishReason": "stop"}, "[DONE]"]
    assert len(deltas) == kib << 10
    assert stored is not None and stored.parts[-1]["text"] == deltas
    assert dropped == 1
    assert read < len(deltas) and held == 0


async def test_first_posts_of_a_new_chat_at_once_one_streams_the_others_conflict(store: Store) -> None:
    """Six at once on a new id: one got the stream, the others `400 invalid: session ...
    already exists` (5 of 6 trials). Now the others are told a turn is in flight (409)."""
    trials, posters = 5, 6
    async with (
        served(store=store) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(timeout=30) as http,
    ):

        async def post(session_id: str) -> tuple[int, str]:
            body = {
                "id": session_id,
                "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "slow"}]}],
            }
            async with http.stream("POST", f"{h.url}/api/chat", json=body) as r:
                if r.status_code == 200:
                    return 200, str([c async for c in sse_chunks(r)][-2])
                return r.status_code, json.loads(await r.aread())["error"]["code"]

        for trial in range(trials):
            answers = await asyncio.gather(*(post(f"s-race-{trial}") for _ in range(posters)))
            statuses = sorted(status for status, _ in answers)
            assert statuses == [200] + [409] * (posters - 1), answers
            assert sorted(code for status, code in answers if status == 409) == ["conflict"] * (posters - 1)
            history = await h.hub.manager.get_session(f"s-race-{trial}").get_history()
            assert [m.role for m in history] == ["user", "assistant"], history
