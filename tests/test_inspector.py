"""The browser inspector (web/, served at ``/``) in a real Chromium against a real hub, with
real Python clients writing. Screenshots go to ``test-artifacts/inspector/``.

Skipped when ``/usr/bin/chromium`` is missing (``.ci/run`` installs it, and fails them
instead: ``tests/services.py``)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright, expect

from clients import HubClient
from hub import SessionManager, SqliteStore
from hub.auth import issue_token
from hub.server import HubConfig

from .hubtest import WAIT, Served, served, text
from .services import chromium

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "inspector"
SECRET = "an-inspector-test-secret-long-enough-for-hs256"

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    executable = chromium()  # skips (fails under SESSIONHUB_REQUIRE_SERVICES=1) without it
    async with async_playwright() as pw:
        launched = await pw.chromium.launch(
            executable_path=str(executable),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield launched
        finally:
            await launched.close()


@contextlib.asynccontextmanager
async def page_of(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A fresh page (1366×768, a laptop screen); its screenshot is saved whatever happens,
    and a console error fails the test."""
    context = await browser.new_context(viewport={"width": 1366, "height": 768})
    page = await context.new_page()
    page.set_default_timeout(WAIT * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        yield page
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            await page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"))
        await context.close()
    assert not [e for e in errors if "WebSocket" not in e], errors


def python_client(h: Served, **kwargs: Any) -> HubClient:
    return HubClient(h.ws_url, **kwargs)


async def message_ids(page: Page) -> list[str]:
    ids: list[str] = await page.locator("#messages article.message").evaluate_all(
        "els => els.map(e => e.dataset.id)"
    )
    return ids


async def open_session(page: Page, name: str) -> None:
    await page.locator("#sessions li", has_text=name).click()
    await expect(page.locator("#session-view")).to_have_attribute("data-caught-up", "true")


@dataclass
class Scene:
    """A hub, a page of the inspector and a Python client writing to the hub."""

    served: Served
    page: Page
    hub: HubClient


@pytest_asyncio.fixture(loop_scope="module")
async def scene(browser: Browser, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Scene]:
    async with (
        served(db=tmp_path / "hub.db") as h,
        page_of(browser, request) as page,
        python_client(h) as hub,
    ):
        yield Scene(h, page, hub)


# -- scenarios -------------------------------------------------------------------------------


async def test_a_session_created_by_a_client_appears_live(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async with served(db=tmp_path / "hub.db") as h, page_of(browser, request) as page:
        await page.goto(h.url + "/")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "open")
        async with python_client(h) as hub:
            info = await hub.sessions.create("first-session", model="gpt-test")
            await expect(page.locator("#sessions li", has_text="first-session")).to_be_visible()
            await hub.sessions.rename(info.id, "renamed-session")
            await hub.sessions.add_usage(info.id, 1200, 340, 0.25)
            row = page.locator(f'#sessions li[data-id="{info.id}"]')
            await expect(row).to_contain_text("renamed-session")
            await expect(row).to_contain_text("1,200/340 tok")
            await expect(row).to_contain_text("$0.2500")
            # Keyboard: the list is a listbox; Enter opens the focused session.
            await page.locator("#sessions").focus()
            await page.keyboard.press("ArrowDown")
            await page.keyboard.press("Enter")
            await expect(page.locator("#session-title")).to_have_text("renamed-session")
            await hub.sessions.delete(info.id)
            await expect(row).to_have_count(0)


async def test_branches_and_picking_a_leaf(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("branchy")
    s = hub.session(info.id)
    await s.append_message(text("root", "the question"), None)
    await s.append_message(text("a1", "first answer", "assistant"), "root")
    await page.goto(h.url + "/")
    await open_session(page, "branchy")
    assert await message_ids(page) == ["root", "a1"]
    # A second branch from the root, written while the page watches.
    await s.append_message(text("b1", "second answer", "assistant"), "root")
    await s.append_message(
        {
            "id": "b2",
            "role": "assistant",
            "parts": [
                {"type": "reasoning", "text": "thinking about tools"},
                {
                    "type": "tool-weather",
                    "toolCallId": "c1",
                    "state": "output-available",
                    "input": {"city": "Paris"},
                    "output": {"temp": 21},
                },
                {"type": "file", "mediaType": "text/plain", "filename": "notes.txt", "url": "data:,hi"},
            ],
        },
        "b1",
    )
    await expect(page.locator("#leaves li")).to_have_count(2)
    await expect(page.locator("#messages article.message")).to_have_count(3)
    assert await message_ids(page) == ["root", "b1", "b2"]
    b2 = page.locator('article[data-id="b2"]')
    await expect(b2.locator(".part.tool")).to_contain_text("Tool call: weather")
    await expect(b2.locator(".part.tool")).to_contain_text('"city": "Paris"')
    await expect(b2.locator(".part.reasoning")).to_contain_text("thinking about tools")
    await expect(b2.locator(".part.file")).to_contain_text("notes.txt")
    await expect(page.locator('article[data-id="b1"] .m-branch')).to_contain_text("branch 2 of 2")
    # Pick the other leaf: its history replaces the view.
    await page.locator('#leaves li[data-id="a1"]').click()
    await expect(page.locator("#messages article.message")).to_have_count(2)
    assert await message_ids(page) == ["root", "a1"]
    # And back with the keyboard, through the branch switcher.
    await page.locator('article[data-id="a1"] button[aria-label="Next branch"]').click()
    await expect(page.locator('article[data-id="b2"]')).to_be_visible()
    # A compaction overlay lies over its range and expands to the originals.
    await s.add_compaction("summary of the question and b1", "root", "b1")
    overlay = page.locator("section.overlay")
    await expect(overlay).to_contain_text("summary of the question and b1")
    assert await message_ids(page) == ["b2"]
    await overlay.get_by_role("button", name="Show originals").click()
    await expect(page.locator("article.message.in-overlay")).to_have_count(2)
    assert await message_ids(page) == ["root", "b1", "b2"]


async def test_context_prompt_presence_and_event_log(
    browser: Browser, request: pytest.FixtureRequest, db_path: Path
) -> None:
    store = await SqliteStore.open(db_path)
    try:
        manager = SessionManager(store).with_context("memory", max_tokens=100).with_cached_prompt()
        async with served(manager=manager) as h, page_of(browser, request) as page, python_client(h) as hub:
            info = await hub.sessions.create("with-context")
            s = hub.session(info.id)
            await s.replace_context_block("memory", "the user likes tea " * 5)
            await s.freeze_system_prompt()
            await s.append_message(text("m1", "hello"))
            await page.goto(h.url + "/")
            await open_session(page, "with-context")
            block = page.locator('#context li[data-label="memory"]')
            await expect(block).to_contain_text("/ 100 tokens")
            meter = block.get_by_role("meter")
            assert int(await meter.get_attribute("aria-valuenow") or 0) > 0
            await expect(page.locator("#prompt-summary")).to_contain_text("Frozen")
            await expect(page.locator("#prompt")).to_contain_text("the user likes tea", use_inner_text=False)
            await expect(page.locator("#log li").last).to_contain_text("message.appended")
            await expect(page.locator("#log li").last).to_have_attribute("data-seq", re.compile(r"\d+"))
            async with python_client(h, name="worker-7", role="worker", sessions=[info.id]):
                await expect(page.locator("#presence")).to_contain_text("worker-7")
            await expect(page.locator("#presence")).not_to_contain_text("worker-7")
            await s.append_context_block("memory", " and biscuits")
            await expect(block).to_contain_text("biscuits", use_inner_text=False)
    finally:
        await store.close()


async def test_a_streamed_message_grows_on_screen(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("streaming")
    s = hub.session(info.id)
    await s.append_message(text("q", "tell me a story"))
    await page.goto(h.url + "/")
    await open_session(page, "streaming")
    article = page.locator('article[data-id="m9"]')
    async with s.stream_message("m9", role="assistant") as st:
        await st.reasoning("Plotting…")
        await st.text("Once upon")
        await expect(article.locator(".part.text")).to_have_text("Once upon")
        await expect(article).to_have_attribute("aria-busy", "true")
        await st.text(" a time")
        await expect(article.locator(".part.text")).to_have_text("Once upon a time")
        await st.text(", the end.")
    await expect(article.locator(".part.text")).to_have_text("Once upon a time, the end.")
    await expect(article.locator(".part.reasoning")).to_contain_text("Plotting…")
    await expect(article.locator(".badge")).to_have_text("finished")


async def test_a_dropped_connection_recovers_and_catches_up(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    db = tmp_path / "hub.db"
    async with page_of(browser, request) as page:
        async with served(db=db) as h, python_client(h) as hub:
            port = h.port
            info = await hub.sessions.create("resilient")
            await hub.session(info.id).append_message(text("m1", "before the drop"))
            await page.goto(h.url + "/")
            await open_session(page, "resilient")
            await expect(page.locator('article[data-id="m1"]')).to_be_visible()
            # First: the server closes the socket; the page reconnects and resubscribes.
            for connection in [c for c in h.hub.connections if c.name == "inspector"]:
                await connection.close(4000, "dropped by the test")
            await hub.session(info.id).append_message(text("m2", "right after the drop"))
            await expect(page.locator('article[data-id="m2"]')).to_be_visible()
        # Then the hub goes away entirely (it closes every socket with 1001)...
        await expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
        await expect(page.locator("#conn")).to_contain_text("Disconnected")
        await page.screenshot(path=str(ARTIFACTS / f"{request.node.name}-disconnected.png"))
        # ...messages are written meanwhile, straight into its database...
        store = await SqliteStore.open(db)
        try:
            manager = SessionManager(store)
            await manager.append(info.id, text("m3", "written while the hub was down"))
            await manager.rename(info.id, "resilient-renamed")
        finally:
            await store.close()
        # ...and when it is back on the same port, the view catches up by itself.
        async with served(db=db, port=port):
            await expect(page.locator("#conn")).to_have_attribute("data-state", "open", timeout=15_000)
            await expect(page.locator('article[data-id="m3"]')).to_be_visible()
            assert await message_ids(page) == ["m1", "m2", "m3"]
            await expect(page.locator("#session-title")).to_have_text("resilient-renamed")
            # No event was applied twice.
            seqs = await page.locator("#log li").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
            assert seqs == sorted(set(seqs))


async def test_a_search_hit_navigates_to_its_message(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    other = await hub.sessions.create("elsewhere")
    await hub.session(other.id).append_message(text("x1", "nothing to see"))
    target = await hub.sessions.create("long-one")
    messages = [text(f"m{i}", f"filler message {i}") for i in range(300)]
    messages[10] = text("m10", "the zebrafish appears here")
    await hub.sessions.append_all(target.id, messages)
    await page.goto(h.url + "/")
    await open_session(page, "elsewhere")
    await page.get_by_label("Search all sessions").fill("zebrafish")
    await page.get_by_label("Search all sessions").press("Enter")
    hit = page.locator("#search-results button.hit")
    await expect(hit).to_have_count(1)
    await expect(hit).to_contain_text("long-one")
    await hit.click()
    await expect(page.locator("#session-title")).to_have_text("long-one")
    found = page.locator('article[data-id="m10"]')
    await expect(found).to_be_visible()
    await expect(found).to_be_in_viewport()
    await expect(found).to_be_focused()
    await expect(found).to_have_class(re.compile("highlight"))


async def test_a_10000_message_session_is_paged(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("huge")
    for chunk in range(10):
        await hub.sessions.append_all(
            info.id, [text(f"m{chunk * 1000 + i}", f"message {chunk * 1000 + i}") for i in range(1000)]
        )
    await page.goto(h.url + "/")
    await page.locator("#sessions li", has_text="huge").click()
    view = page.locator("#session-view")
    await expect(view).to_have_attribute("data-caught-up", "true", timeout=20_000)
    await expect(view).to_have_attribute("data-messages", "10000")
    rendered = await page.locator("#messages article.message").count()
    assert 0 < rendered <= 200
    assert (await message_ids(page))[-1] == "m9999"
    await expect(page.locator("#pager-top")).to_contain_text("of 10,000")
    await page.locator("#pager-top").get_by_role("button", name="◀ Earlier").click()
    assert (await message_ids(page))[-1] == "m9899"
    # Still live: a new message shows at the end once back at the latest page.
    await page.locator("#pager-top").get_by_role("button", name="Latest").click()
    await hub.sessions.append(info.id, text("m10000", "one more"))
    await expect(page.locator('article[data-id="m10000"]')).to_be_visible()


# -- auth --------------------------------------------------------------------------------------


async def test_auth_token_from_the_fragment(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    admin = issue_token(SECRET, {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h, page_of(browser, request) as page:
        async with HubClient(h.ws_url, token=admin) as hub:
            await hub.sessions.create("secret-session")
        await page.goto(f"{h.url}/#token={admin}")
        await expect(page.locator("#sessions li", has_text="secret-session")).to_be_visible()
        assert admin not in page.url  # the token leaves the address bar at once
        stored = await page.evaluate("sessionStorage.getItem('sessionhub.token')")
        assert stored == admin


async def test_auth_prompt_and_missing_scope(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    admin = issue_token(SECRET, {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h, page_of(browser, request) as page:
        async with HubClient(h.ws_url, token=admin) as hub:
            info = await hub.sessions.create("scoped")
            await hub.session(info.id).append_message(text("m1", "visible with read on this session"))
        # No token: the page asks for one.
        await page.goto(h.url + "/")
        form = page.locator("#token-form")
        await expect(form).to_be_visible()
        # A token that may read one session only: listing is refused, and the page says why.
        reader = issue_token(SECRET, {info.id: "read"})
        await page.get_by_label("Access token").fill(reader)
        await page.get_by_role("button", name="Use token").click()
        await expect(page.locator("#notice")).to_contain_text("does not allow list sessions")
        await expect(page.locator("#notice")).to_contain_text("read on *")
        # That session still opens by id.
        await page.get_by_label("Open a session by id").fill(info.id)
        await page.get_by_label("Open a session by id").press("Enter")
        await expect(page.locator('article[data-id="m1"]')).to_be_visible()
        assert reader not in page.url


async def test_the_chat_example_loads_and_talks_to_the_hub(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("chat")
    await page.goto(f"{h.url}/examples/chat.html#session={info.id}")
    await page.get_by_label("Message").fill("hello from the browser")
    await page.get_by_role("button", name="Send").click()
    await expect(page.locator("#chat-log")).to_contain_text("hello from the browser")
    history = await hub.session(info.id).get_history()
    assert [m.text() for m in history] == ["hello from the browser"]
    await hub.session(info.id).append_message(text("r1", "hi from python", "assistant"))
    await expect(page.locator("#chat-log")).to_contain_text("hi from python")
