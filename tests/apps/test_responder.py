"""The built-in responder (hub/apps/responder.py, ``sessionhub respond``) against a local
streaming chat-completions server written here: a real HTTP server on 127.0.0.1:0 that
speaks OpenAI's SSE format. Text, a tool call round trip through the session's context
tools, a 500 then success, and a timeout; the chat sees each as the AI SDK would."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest

from hub import ReadonlyText, SessionManager, SqliteStore
from hub.apps.responder import ChatCompletionsResponder, run_responder
from hub.templates import Template, TemplateBlock
from tests.support.chatkit import sse_chunks
from tests.support.hubtest import served

ROOT = Path(__file__).resolve().parents[2]

Writer = Callable[[asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


@dataclass
class ModelServer:
    """A chat-completions server: each request is answered by the next scripted behaviour."""

    script: list[Writer]
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode().split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            if not head.startswith(b"POST"):
                # `sessionhub respond` checks the server answers (GET /models): this one has none.
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                await writer.drain()
                return
            body = json.loads(await reader.readexactly(length))
            self.requests.append(body)
            behaviour = self.script.pop(0) if self.script else _text("(no more script)")
            await behaviour(writer, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def _sse_response(writer: asyncio.StreamWriter, chunks: list[dict[str, Any]]) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    for chunk in chunks:
        writer.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await writer.drain()
    writer.write(b"data: [DONE]\n\n")
    await writer.drain()


def _delta(**delta: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"id": "c1", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}


def _text(*pieces: str, usage: tuple[int, int] = (10, 3)) -> Writer:
    async def write(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        await _sse_response(writer, [*(_delta(content=p) for p in pieces), _usage(*usage)])

    return write


def _tool_call(name: str, arguments: dict[str, Any]) -> Writer:
    raw = json.dumps(arguments)
    half = len(raw) // 2

    async def write(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        # The arguments arrive in two pieces, as real servers send them.
        first = {
            "index": 0,
            "id": "call-7",
            "type": "function",
            "function": {"name": name, "arguments": raw[:half]},
        }
        second = {"index": 0, "function": {"arguments": raw[half:]}}
        await _sse_response(writer, [_delta(tool_calls=[first]), _delta(tool_calls=[second]), _usage(20, 5)])

    return write


def _status(code: int, text: str) -> Writer:
    async def write(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        data = text.encode()
        writer.write(
            f"HTTP/1.1 {code} Oops\r\ncontent-type: text/plain\r\ncontent-length: {len(data)}\r\n"
            "connection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()

    return write


def _hang(seconds: float) -> Writer:
    async def write(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        await asyncio.sleep(seconds)

    return write


@contextlib.asynccontextmanager
async def model_server(*script: Writer) -> AsyncIterator[ModelServer]:
    model = ModelServer(list(script))
    server = await asyncio.start_server(model.handle, "127.0.0.1", 0)
    model.port = int(server.sockets[0].getsockname()[1])
    try:
        yield model
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def chat_backend(
    tmp_path: Path, responder: ChatCompletionsResponder, *, template: bool = False
) -> AsyncIterator[tuple[Any, SessionManager]]:
    """A hub whose sessions have a read-only soul and a writable memory (given by the
    manager, or by its default template: sessionhub.toml's way), and the responder."""
    store = await SqliteStore.open(tmp_path / "hub.db")
    manager = SessionManager(store)
    soul = ReadonlyText("You are terse.")
    if template:
        blocks = (TemplateBlock("soul", provider=soul), TemplateBlock("memory", "Learned facts", 100))
        manager.with_templates([Template("t", blocks)], default="t")
    else:
        manager.with_context("soul", provider=soul).with_context(
            "memory", description="Learned facts", max_tokens=100
        )
    try:
        async with served(manager=manager) as h:
            ready = asyncio.Event()
            task = asyncio.create_task(run_responder(h.ws_url, responder, name="llm", ready=ready))
            await ready.wait()
            async with asyncio.timeout(5):
                while not h.hub.turns.responders:
                    await asyncio.sleep(0.005)
            try:
                yield h, manager
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    finally:
        await store.close()


async def _chat(url: str, session_id: str, text: str) -> list[dict[str, Any] | str]:
    body = {
        "id": session_id,
        "messages": [{"id": f"u-{session_id}", "role": "user", "parts": [{"type": "text", "text": text}]}],
    }
    async with httpx2.AsyncClient(timeout=30) as http, http.stream("POST", f"{url}/api/chat", json=body) as r:
        assert r.status_code == 200
        return [c async for c in sse_chunks(r)]


def _types(chunks: list[dict[str, Any] | str]) -> list[str]:
    return [c if isinstance(c, str) else str(c["type"]) for c in chunks]


async def test_text_streams_with_the_frozen_prompt_and_usage(tmp_path: Path) -> None:
    async with model_server(_text("Hel", "lo", "!", usage=(12, 3))) as model:
        responder = ChatCompletionsResponder(model.base_url, "tiny", api_key="k-1", max_retries=0)
        async with chat_backend(tmp_path, responder) as (h, manager):
            chunks = await _chat(h.url, "s-text", "hi")
            assert _types(chunks) == [
                "start",
                "text-start",
                "text-delta",
                "text-delta",
                "text-delta",
                "text-end",
                "finish",
                "[DONE]",
            ]
            session = manager.get_session("s-text")
            reply = (await session.get_history())[-1]
            assert reply.parts == [{"type": "text", "text": "Hello!"}]
            sent = model.requests[0]
            assert sent["stream"] is True and sent["model"] == "tiny"
            assert sent["messages"][0] == {"role": "system", "content": await session.freeze_system_prompt()}
            assert "You are terse." in sent["messages"][0]["content"]
            assert sent["messages"][-1] == {"role": "user", "content": "hi"}
            assert {t["function"]["name"] for t in sent["tools"]} >= {"set_context"}
            info = await manager.get("s-text")
            assert info is not None
            assert (info.input_tokens, info.output_tokens) == (12, 3)


@pytest.mark.parametrize("template", [False, True], ids=["manager", "template"])
async def test_a_tool_call_round_trip(tmp_path: Path, template: bool) -> None:
    script = (_tool_call("set_context", {"label": "memory", "content": "User likes tea."}), _text("Noted."))
    async with model_server(*script) as model:
        responder = ChatCompletionsResponder(model.base_url, "tiny", max_retries=0)
        async with chat_backend(tmp_path, responder, template=template) as (h, manager):
            chunks = await _chat(h.url, "s-tool", "remember I like tea")
            types = _types(chunks)
            assert types[:4] == ["start", "tool-input-start", "tool-input-available", "tool-output-available"]
            assert types[-3:] == ["text-end", "finish", "[DONE]"]
            session = manager.get_session("s-tool")
            block = await session.get_context_block("memory")
            assert block is not None and block.content == "User likes tea."  # ran through dispatch
            reply = (await session.get_history())[-1]
            tool, text = reply.parts
            assert tool["type"] == "tool-set_context" and tool["state"] == "output-available"
            assert tool["input"] == {"label": "memory", "content": "User likes tea."}
            assert text == {"type": "text", "text": "Noted."}
            # The second request carries the call and its result.
            assert "You are terse." in model.requests[0]["messages"][0]["content"]
            follow_up = model.requests[1]["messages"]
            assert follow_up[-2]["tool_calls"][0]["id"] == "call-7"
            assert follow_up[-1] == {"role": "tool", "tool_call_id": "call-7", "content": tool["output"]}
            info = await manager.get("s-tool")
            assert info is not None and info.input_tokens == 20 + 10


async def _roles(manager: SessionManager, session_id: str) -> list[str]:
    return [m.role for m in await manager.get_session(session_id).get_history()]


async def _until(read: Callable[[], Awaitable[Any]], expected: Any) -> None:
    """The responder cleans up after the chat has seen the error: wait for it (bounded)."""
    async with asyncio.timeout(5):
        while await read() != expected:
            await asyncio.sleep(0.01)


async def test_a_500_then_success_is_retried(tmp_path: Path) -> None:
    async with model_server(_status(500, "overloaded"), _text("fine")) as model:
        responder = ChatCompletionsResponder(model.base_url, "tiny", max_retries=2, backoff=0.01)
        async with chat_backend(tmp_path, responder) as (h, manager):
            chunks = await _chat(h.url, "s-retry", "hi")
            assert "error" not in _types(chunks)
            assert len(model.requests) == 2
            reply = (await manager.get_session("s-retry").get_history())[-1]
            assert reply.text() == "fine"


async def test_a_400_fails_the_turn_with_the_servers_answer(tmp_path: Path) -> None:
    async with model_server(_status(400, "model 'tiny' does not exist")) as model:
        responder = ChatCompletionsResponder(model.base_url, "tiny", max_retries=3, backoff=0.01)
        async with chat_backend(tmp_path, responder) as (h, manager):
            chunks = await _chat(h.url, "s-400", "hi")
            error = chunks[-2]
            assert isinstance(error, dict) and error["type"] == "error"
            assert "HTTP 400: model 'tiny' does not exist" in error["errorText"]
            # Who failed, named once, and the model server by its URL (no exception's type).
            assert error["errorText"].startswith(
                f"responder 'llm' failed: model server request to {model.base_url}/chat/completions failed"
            ), error["errorText"]
            assert len(model.requests) == 1  # not retried
            # The failed reply said nothing: no empty assistant message is left in the tree.
            await _until(lambda: _roles(manager, "s-400"), ["user"])


async def test_a_timeout_is_retried_then_reported(tmp_path: Path) -> None:
    async with model_server(_hang(5), _hang(5)) as model:
        responder = ChatCompletionsResponder(model.base_url, "tiny", timeout=0.3, max_retries=1, backoff=0.01)
        async with chat_backend(tmp_path, responder) as (h, manager):
            chunks = await _chat(h.url, "s-slow", "hi")
            error = chunks[-2]
            assert isinstance(error, dict) and error["type"] == "error"
            assert "failed after 2 attempts: timed out after 0.3s" in error["errorText"]
            assert len(model.requests) == 2
            # The aborted reply, empty, is deleted; the turn's outcome stays in the log.
            await _until(lambda: _roles(manager, "s-slow"), ["user"])
            events = await manager.get_session("s-slow").read_events()
            assert "message.deleted" in [e.type for e in events]
            ended = [e for e in events if e.type == "turn.ended"]
            assert ended and ended[-1].data["status"] == "failed"


def test_respond_command_refuses_a_bad_base_url() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hub.apps.cli", "respond", "--base-url", "localhost:8080", "--model", "m"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "sessionhub: --base-url must be an http(s) URL; got 'localhost:8080'"


def test_respond_command_says_when_the_hub_is_unreachable() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hub.apps.cli",
            "respond",
            "--url",
            "ws://127.0.0.1:9/ws",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    # The model server is checked first (before the hub): it is named in the one line.
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("sessionhub: cannot reach the model server at http://127.0.0.1:9/v1"), lines


async def test_stopping_the_chat_stops_the_model_request(tmp_path: Path) -> None:
    sent: list[int] = []
    cut = asyncio.Event()

    async def trickle(writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        try:
            for i in range(200):
                writer.write(f"data: {json.dumps(_delta(content=f'w{i} '))}\n\n".encode())
                await writer.drain()
                sent.append(i)
                await asyncio.sleep(0.03)
        except ConnectionError:
            cut.set()  # the responder closed the request

    async with (
        model_server(trickle) as model,
        chat_backend(tmp_path, ChatCompletionsResponder(model.base_url, "m")) as (h, _),
    ):
        body = {
            "id": "s-stop",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "go"}]}],
        }
        async with (
            httpx2.AsyncClient(timeout=10) as http,
            http.stream("POST", f"{h.url}/api/chat", json=body) as r,
        ):
            chunks: list[dict[str, Any] | str] = []
            async for chunk in sse_chunks(r):
                chunks.append(chunk)
                if chunk == {"type": "text-delta", "id": "text-0", "delta": "w2 "}:
                    stopped = await http.post(f"{h.url}/api/chat/s-stop/stop")
                    assert stopped.status_code == 200, stopped.text
                    assert stopped.json()["started"] is True
            # Once stopped, no turn is in flight: a second stop is a typed 404.
            again = await http.post(f"{h.url}/api/chat/s-stop/stop")
            assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
        assert chunks[-2:] == [{"type": "abort", "reason": "stopped by the user"}, "[DONE]"]
        async with asyncio.timeout(5):
            await cut.wait()
        assert len(sent) < 100  # the model was not read to the end
        session = h.hub.manager.get_session("s-stop")
        reply = await session.get_message(str(chunks[0]["messageId"]))  # type: ignore[index]
        streamed = "".join(c["delta"] for c in chunks if isinstance(c, dict) and c["type"] == "text-delta")
        assert reply is not None and reply.text() == streamed  # stored as it stood
        ended = [e.data for e in await session.read_events() if e.type == "turn.ended"]
        assert ended[-1]["status"] == "stopped" and ended[-1]["reason"] == "stopped by the user"
        stream_ended = [e.data for e in await session.read_events() if e.type == "stream.ended"]
        assert stream_ended[-1]["status"] == "stopped"


async def test_an_image_reaches_the_model_as_an_image_url_part(tmp_path: Path) -> None:
    import base64
    import hashlib
    import os

    image = os.urandom(3000)
    inline = "data:image/png;base64," + base64.b64encode(image).decode()
    async with model_server(_text("A cat.")) as model:
        responder = ChatCompletionsResponder(model.base_url, "vision", max_retries=0)
        async with chat_backend(tmp_path, responder) as (h, manager):
            body = {
                "id": "s-img",
                "messages": [
                    {
                        "id": "u1",
                        "role": "user",
                        "parts": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "file", "mediaType": "image/png", "url": inline, "filename": "c.png"},
                        ],
                    }
                ],
            }
            async with (
                httpx2.AsyncClient(timeout=30) as http,
                http.stream("POST", f"{h.url}/api/chat", json=body) as r,
            ):
                assert r.status_code == 200
                _ = [c async for c in sse_chunks(r)]
            stored = (await manager.get_session("s-img").get_history())[0]
            assert stored.parts[1]["url"] == f"/files/{hashlib.sha256(image).hexdigest()}"
            assert model.requests[0]["messages"][-1] == {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": inline}},
                ],
            }
