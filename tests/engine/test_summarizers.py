"""OpenAICompatible against a real local HTTP server that speaks chat completions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hub import Session, SqliteStore, SummarizerError
from hub.compaction import create_compact_function
from hub.summarizers import OpenAICompatible
from tests.support.hubtest import served
from tests.support.hubtest import text_message as T


@dataclass
class Script:
    """What the fake model answers, one entry per request; then plain successes."""

    replies: list[Any] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


@pytest.fixture
async def llm() -> AsyncIterator[tuple[str, Script]]:
    script = Script()

    async def chat(request: Request) -> Response:
        script.requests.append(await request.json())
        script.headers.append(dict(request.headers))
        reply: tuple[str, Any] = script.replies.pop(0) if script.replies else ("ok", "SUMMARY")
        kind, value = reply
        if kind == "ok":
            return JSONResponse(completion(value))
        if kind == "status":
            status, headers = value
            return PlainTextResponse(f"error {status}", status_code=status, headers=headers)
        if kind == "sleep":
            await asyncio.sleep(value)  # a model slower than the client's timeout
            return JSONResponse(completion("too late"))
        return PlainTextResponse(value)  # "raw": not a chat completion

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    async with served(app=app) as server:
        yield f"{server.url}/v1", script


async def test_success_sends_model_prompt_and_key(llm: tuple[str, Script]) -> None:
    url, script = llm
    summarize = OpenAICompatible(url, "gpt-fake", api_key="sk-test", system_prompt="Be brief.")
    assert await summarize("Summarize this.") == "SUMMARY"
    body = script.requests[0]
    assert body["model"] == "gpt-fake"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Summarize this."},
    ]
    assert script.headers[0]["authorization"] == "Bearer sk-test"


async def test_retries_a_500_then_succeeds(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("status", (500, {})), ("status", (503, {})), ("ok", "after retries")]
    summarize = OpenAICompatible(url, "m", backoff=0.01)
    assert await summarize("p") == "after retries"
    assert len(script.requests) == 3


async def test_429_honours_retry_after(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("status", (429, {"retry-after": "0.2"})), ("ok", "fine")]
    summarize = OpenAICompatible(url, "m", backoff=5.0)
    started = asyncio.get_running_loop().time()
    assert await summarize("p") == "fine"
    elapsed = asyncio.get_running_loop().time() - started
    assert 0.2 <= elapsed < 4.0  # the server's 0.2 s, not the 5 s backoff


async def test_client_errors_are_not_retried(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("status", (400, {}))]
    summarize = OpenAICompatible(url, "m", backoff=0.01)
    with pytest.raises(SummarizerError, match="HTTP 400: error 400") as info:
        await summarize("p")
    assert info.value.code == "upstream"
    assert len(script.requests) == 1


async def test_gives_up_after_max_retries(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("status", (502, {}))] * 3
    summarize = OpenAICompatible(url, "m", max_retries=2, backoff=0.01)
    with pytest.raises(SummarizerError, match="after 3 attempts: HTTP 502"):
        await summarize("p")
    assert len(script.requests) == 3


async def test_timeout_is_retried_then_reported(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("sleep", 2.0), ("sleep", 2.0)]
    summarize = OpenAICompatible(url, "m", timeout=0.2, max_retries=1, backoff=0.01)
    with pytest.raises(SummarizerError, match=r"timed out after 0\.2s"):
        await summarize("p")
    script.replies = [("sleep", 2.0)]
    assert await OpenAICompatible(url, "m", timeout=0.2, max_retries=1, backoff=0.01)("p") == "SUMMARY"


async def test_not_a_completion_is_a_clear_error(llm: tuple[str, Script]) -> None:
    url, script = llm
    script.replies = [("raw", "<html>proxy error</html>")]
    with pytest.raises(SummarizerError, match="not a chat completion: <html>proxy error"):
        await OpenAICompatible(url, "m")("p")


async def test_unreachable_server() -> None:
    summarize = OpenAICompatible("http://127.0.0.1:9/v1", "m", max_retries=1, backoff=0.01)
    with pytest.raises(SummarizerError, match="connection failed"):
        await summarize("p")


async def test_session_compacts_through_the_http_summarizer(
    llm: tuple[str, Script], store: SqliteStore
) -> None:
    url, script = llm
    script.replies = [("ok", "## Topic\nDeploying.")]
    session = Session(store).on_compaction(
        create_compact_function(OpenAICompatible(url, "m"), tail_token_budget=10)
    )
    for i in range(8):
        await session.append_message(
            T(f"m{i}", "user" if i % 2 == 0 else "assistant", f"turn {i} about deploys")
        )
    result = await session.compact()
    assert result is not None
    assert (result.from_message_id, result.to_message_id) == ("m3", "m5")
    prompt = script.requests[0]["messages"][-1]["content"]
    assert prompt.startswith("Create a concise summary of this conversation")
    assert "[assistant]\nturn 3 about deploys" in prompt
    history = await session.get_history()
    assert [m.id for m in history][:3] == ["m0", "m1", "m2"]
    assert history[3].parts == [{"type": "text", "text": "## Topic\nDeploying."}]


async def test_summarizer_failure_leaves_history_intact(llm: tuple[str, Script], store: SqliteStore) -> None:
    url, script = llm
    script.replies = [("status", (401, {}))]
    session = Session(store).on_compaction(
        create_compact_function(OpenAICompatible(url, "m"), tail_token_budget=10)
    )
    for i in range(8):
        await session.append_message(T(f"m{i}", "user", f"turn {i}"))
    assert await session.compact() is None
    assert len(await session.get_history()) == 8
    errors = [e for e in await session.read_events() if e.type == "error"]
    assert len(errors) == 1 and "HTTP 401" in errors[0].data["error"]
