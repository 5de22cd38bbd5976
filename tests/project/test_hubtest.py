"""The helpers the other tests lean on: a wait that never ends early or silently, and a
served app that really listens and comes back on its port."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support.hubtest import Served, eventually, text, text_message
from tests.support.hubtest import text_message as T


async def test_eventually_returns_the_first_truthy_value() -> None:
    calls: list[int] = []

    def grows() -> list[int] | None:
        calls.append(len(calls))
        return calls if len(calls) >= 3 else None

    assert await eventually(grows, interval=0) == [0, 1, 2]


async def test_eventually_awaits_an_async_condition() -> None:
    ready = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, ready.set)

    async def is_ready() -> bool:
        return ready.is_set()

    assert await eventually(is_ready) is True


async def test_eventually_fails_naming_the_condition_and_its_last_value() -> None:
    with pytest.raises(AssertionError, match=r"not true within 0\.05s: .*never_true.*last value: 0"):
        await eventually(lambda: 0 if "never_true" else 1, timeout=0.05)


async def test_a_raising_condition_fails_at_once() -> None:
    def broken() -> bool:
        raise KeyError("gone")

    with pytest.raises(KeyError):
        await eventually(broken)


def test_one_message_builder_under_every_name() -> None:
    built = {"id": "m1", "role": "assistant", "parts": [{"type": "text", "text": "hi"}]}
    assert text_message("m1", "assistant", "hi") == built
    assert T("m1", "assistant", "hi") == built
    assert text("m1", "hi", role="assistant") == built
    assert text("m1", "hi")["role"] == "user"


async def test_served_listens_and_comes_back_on_its_port() -> None:
    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello")

    server = Served(Starlette(routes=[Route("/", hello)]))
    await server.start()
    port = server.port
    assert port != 0
    try:
        async with httpx2.AsyncClient() as http:
            assert (await http.get(server.url)).text == "hello"
            await server.stop()
            with pytest.raises(httpx2.ConnectError):
                await http.get(server.url)
            await server.start()
            assert server.port == port
            assert (await http.get(server.url)).text == "hello"
    finally:
        await server.stop()
