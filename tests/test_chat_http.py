"""The chat endpoints against the real Vercel AI SDK: a real uvicorn hub, a real responder
(a ``HubClient`` iterating ``turns()``), and ``node --test tests/js/`` driving ``ai`` 6.x
(``DefaultChatTransport``, ``readUIMessageStream``, ``validateUIMessages``, resumable
streams) and ``SessionHubChatTransport`` against them. Plus the HTTP edges in Python."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import httpx2
import pytest

from hub.auth import issue_token
from hub.server import HubConfig
from hub.server.chat_http import KEEPALIVE

from .chatkit import responder, sse_chunks
from .hubtest import served
from .services import node

ROOT = Path(__file__).resolve().parent.parent
JS = ROOT / "tests" / "js"


def _npm_ci() -> None:
    """Install tests/js (the exact `ai` version of its lock file) when it is missing."""
    if (JS / "node_modules" / "ai" / "package.json").exists():
        return
    subprocess.run(["npm", "ci", "--prefix", str(JS), "--no-audit", "--no-fund"], check=True, timeout=300)


def _websocket_flags(node_path: str) -> list[str]:
    has = subprocess.run(
        [node_path, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"], check=False
    )
    return [] if has.returncode == 0 else ["--experimental-websocket"]


async def test_the_ai_sdk_against_the_hub(tmp_path: Path) -> None:
    node_path = node()
    _npm_ci()
    # Keep-alive comments every 20 ms: the real SDK's parser meets them between chunks.
    async with (
        served(db=tmp_path / "hub.db", config=HubConfig(chat_keepalive=0.02)) as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        proc = await asyncio.create_subprocess_exec(
            node_path,
            *_websocket_flags(node_path),
            "--test",
            "--test-reporter=spec",
            str(JS / "chat.test.mjs"),
            cwd=JS,
            env={
                "PATH": "/usr/bin:/bin",
                "SESSIONHUB_URL": h.url,
                "SESSIONHUB_WS_URL": h.ws_url,
                "NO_COLOR": "1",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 90)
    report = out.decode()
    assert proc.returncode == 0, report
    assert "fail 0" in report, report
    assert "skipped 0" in report, report
    assert "pass 8" in report, report


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
