"""web/examples/chat.html in Debian's Chromium (playwright, as tests/web/test_inspector.py):
a reply that keeps streaming across a page reload, nothing doubled or lost; the active
branch only; Regenerate and the branch switcher; Stop, which stops the responder and leaves
the reply as shown, stored and marked stopped."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from clients import HubClient, Turn
from hub.store.base import session_stream
from tests.support.chatkit import responder
from tests.support.hubtest import WAIT, eventually, served
from tests.support.services import chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@contextlib.asynccontextmanager
async def _browser() -> AsyncIterator[Browser]:
    executable = chromium()  # skips (fails under SESSIONHUB_REQUIRE_SERVICES=1) without it
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(executable),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"],
        )
        try:
            yield launched
        finally:
            await launched.close()


@contextlib.asynccontextmanager
async def _chat_page(browser: Browser, url: str, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A fresh page on ``url``, once it says Connected. On the way out it leaves a screenshot
    in test-artifacts/ (also when the test failed) and, when the test passed, asserts that
    the page raised no error but a WebSocket one."""
    context = await browser.new_context()
    page = await context.new_page()
    page.set_default_timeout(WAIT * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        await page.goto(url)
        await expect(page.locator("#status")).to_have_text("Connected")
        yield page
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            await page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
        await context.close()
    assert not [e for e in errors if "WebSocket" not in e], errors


async def test_a_reply_keeps_streaming_across_a_reload(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        _browser() as browser,
    ):
        info = await h.hub.store.create_session("page chat", session_id="page-chat")
        async with _chat_page(browser, f"{h.url}/examples/chat.html#session={info.id}", request) as page:
            await page.get_by_label("Message").fill("slow story please")
            await page.get_by_role("button", name="Send").click()
            reply = page.locator('#chat-log article[data-role="assistant"]')
            await expect(reply).to_contain_text("w3 ")
            assert h.hub.turns.in_flight(info.id) is not None, "reloading mid-reply"
            await page.reload()
            await expect(page.locator("#status")).to_contain_text("Connected")
            await expect(reply).to_contain_text("w39", timeout=10_000)
            words = (await reply.locator("p").first.inner_text()).split()[1:]  # after "Assistant:"
            assert words == [f"w{i}" for i in range(40)], "nothing doubled or lost"
            # The page shows the last delta as soon as it is streamed; the store holds it
            # once the reply ends (stream_end), a moment later.
            await eventually(lambda: h.hub.turns.in_flight(info.id) is None)

            async def stored_whole() -> bool:
                stored = (await h.hub.manager.get_session(info.id).get_history())[-1]
                return stored.text().split() == words

            await eventually(stored_whole)
            # Regenerate: a sibling; the page shows the new branch, and ‹ 1/2 › switches back.
            async with asyncio.timeout(5):
                while h.hub.turns.in_flight(info.id) is not None:
                    await asyncio.sleep(0.01)
            await page.get_by_role("button", name="Regenerate").click()
            await expect(page.locator(".branch")).to_contain_text("2/2")
            await expect(page.locator("#chat-log article")).to_have_count(2)  # the active branch only
            await page.get_by_title("previous branch").click()
            await expect(page.locator(".branch")).to_contain_text("1/2")
            await expect(reply).to_contain_text("w39")


@contextlib.asynccontextmanager
async def _slow_responder(url: str, sent: list[str], turns: list[Turn]) -> AsyncIterator[None]:
    """A responder streaming a word every 50 ms, up to 200; ``sent``: every word it sent."""
    async with HubClient(url, name="slow", role="worker") as agent:

        async def run() -> None:
            async for turn in agent.turns():
                turns.append(turn)
                async with turn.reply() as st:
                    for i in range(200):
                        await st.text(f"w{i} ")
                        sent.append(f"w{i}")
                        await asyncio.sleep(0.05)

        task = asyncio.create_task(run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_stop_ends_the_reply_as_shown_and_stops_the_responder(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    sent: list[str] = []
    turns: list[Turn] = []
    async with (
        served(db=tmp_path / "hub.db") as h,
        _browser() as browser,
        _slow_responder(h.ws_url, sent, turns),
    ):
        await eventually(lambda: len(h.hub.turns.responders) == 1)
        info = await h.hub.store.create_session("page stop", session_id="page-stop")
        async with _chat_page(browser, f"{h.url}/examples/chat.html#session={info.id}", request) as page:
            stop = page.get_by_role("button", name="Stop")
            await expect(stop).to_be_hidden()  # nothing in flight
            await page.get_by_label("Message").fill("tell me everything")
            await page.get_by_role("button", name="Send").click()
            reply = page.locator('#chat-log article[data-role="assistant"]')
            await expect(reply).to_contain_text("w5 ")
            await expect(stop).to_be_visible()
            await stop.click()
            await expect(reply.locator(".stopped")).to_have_text("Stopped: stopped by the user")
            await expect(page.locator("#status")).to_have_text("Stopped")
            await expect(stop).to_be_hidden()
            shown = (await reply.locator("p").first.inner_text()).split()[1:]  # after "Assistant:"
            assert 5 < len(shown) < 200
            assert shown == [f"w{i}" for i in range(len(shown))]
            # The responder was told (turn.stopped) and sent nothing more: a second later
            # (20 more words, had it gone on) what it sent is what the page shows, but for
            # at most the one word it sent while the stop was on its way (the hub refused it).
            assert turns and turns[0].stopped.is_set()
            told = len(sent)
            await asyncio.sleep(1.0)
            assert len(sent) == told
            assert sent[: len(shown)] == shown and len(sent) - len(shown) <= 1
            assert (await reply.locator("p").first.inner_text()).split()[1:] == shown
            stored = (await h.hub.manager.get_session(info.id).get_history())[-1]
            assert stored.role == "assistant" and stored.text().split() == shown
            ended = [
                e for e in await h.hub.store.read_events(session_stream(info.id)) if e.type == "turn.ended"
            ]
            assert [(e.data["status"], e.data["reason"]) for e in ended] == [
                ("stopped", "stopped by the user")
            ]
            # The mark is the log's: a reload shows it again, with no Stop.
            await page.reload()
            await expect(reply.locator(".stopped")).to_have_text("Stopped: stopped by the user")
            await expect(stop).to_be_hidden()


async def test_without_a_session_the_page_starts_one_or_says_how_to_name_one(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from hub.auth import issue_token
    from hub.server import HubConfig

    secret = "a-chat-page-secret-that-is-long-enough!!"
    async with _browser() as browser:
        async with (
            served(db=tmp_path / "open.db") as h,
            _chat_page(browser, h.url + "/examples/chat.html", request) as page,
        ):
            await expect(page).to_have_url(re.compile(r"#session=[0-9a-f-]{36}$"))
            session_id = page.url.rsplit("=", 1)[1]
            async with HubClient(h.ws_url) as hub:
                info = await hub.sessions.get(session_id)
            assert info is not None and info.name == "chat"
        async with served(db=tmp_path / "auth.db", config=HubConfig(auth_secret=secret)) as h:
            page = await browser.new_page()
            read = issue_token(secret, {"*": "read"})
            await page.goto(h.url + f"/examples/chat.html#token={read}")
            await expect(page.locator("#status")).to_contain_text("No session: open this page as")
            await expect(page.locator("#chat-input")).to_be_disabled()
            await page.close()
