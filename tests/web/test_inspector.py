"""The browser inspector (web/, served at ``/``) in a real Chromium against a real hub, with
real Python clients writing. Screenshots go to ``test-artifacts/inspector/``.

Skipped when ``/usr/bin/chromium`` is missing (``.ci/run`` installs it, and fails them
instead: ``tests/support/services.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

from clients import HubClient, HubError
from hub import SessionManager, SqliteStore, session_stream
from hub.auth import issue_token
from hub.compaction import CompactResult
from hub.server import HubConfig
from hub.store import LogEntry
from protocol import Message
from tests.support.chatkit import responder
from tests.support.hubtest import WAIT, Served, served, text
from tests.support.services import chromium

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "inspector"
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
async def page_of(
    browser: Browser, request: pytest.FixtureRequest, width: int = 1366, height: int = 768
) -> AsyncIterator[Page]:
    """A fresh page (1366×768, a laptop screen, by default); its screenshot is saved whatever
    happens, and a console error fails the test."""
    context = await browser.new_context(viewport={"width": width, "height": height})
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
    # Each node of the tree is named on hover: role, id, the start of its text, the branch.
    await expect(page.locator('#tree circle[data-id="a1"] title')).to_have_text("assistant a1: first answer")
    await expect(page.locator('#tree circle[data-id="b2"] title')).to_have_text(
        "assistant b2: thinking about tools (active branch)"
    )
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
            # Edited from the page: replace_context_block, the hub's budget enforced.
            await block.locator("details.edit summary").click()
            await block.get_by_label("New content of memory").fill("prefers coffee")
            await block.get_by_role("button", name="Save memory").click()
            await expect(block.locator(".edit-status")).to_have_text("Saved.")
            memory = await s.get_context_block("memory")
            assert memory is not None and memory.content == "prefers coffee"
            await expect(block).to_contain_text("prefers coffee", use_inner_text=False)
            edit = page.locator('#context li[data-label="memory"] details.edit')
            await edit.get_by_label("New content of memory").fill("word " * 200)
            await edit.get_by_role("button", name="Save memory").click()
            await expect(edit.locator(".edit-status")).to_contain_text("Not saved (invalid)")
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


async def test_a_pruned_log_says_so_and_shows_every_message(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("pruned")
    s = hub.session(info.id)
    await s.append_message(text("root", "the question"), None)
    for i in range(6):
        await s.append_message(text(f"a{i}", f"answer {i}", "assistant"))
    await s.append_message(text("b1", "another branch", "assistant"), "a2")
    await s.append_message(text("b2", "and its tip"), "b1")
    await hub.sessions.add_compaction(info.id, "summary of the start", "root", "a1")
    await h.hub.manager.prune_events(keep_per_session=2)
    first = (await h.hub.manager.store.stream_position(session_stream(info.id))).first_seq
    assert first > 2  # the appends' events are gone: only the log's end is left
    await page.goto(h.url + "/")
    await open_session(page, "pruned")
    await expect(page.locator("#session-status")).to_have_text(
        f"Events before seq {first} were pruned (retention); the messages are all here."
    )
    # Every branch and the overlay, rebuilt from the messages (the log no longer has them).
    await expect(page.locator("#leaves li")).to_have_count(2)
    await expect(page.locator("section.overlay")).to_contain_text("summary of the start")
    await page.locator('#leaves li[data-id="a5"]').click()
    assert await message_ids(page) == ["a2", "a3", "a4", "a5"]
    await page.locator('#leaves li[data-id="b2"]').click()
    assert await message_ids(page) == ["a2", "b1", "b2"]
    # Live again from the log's end.
    await s.append_message(text("b3", "written after the prune"), "b2")
    await expect(page.locator('article[data-id="b3"]')).to_be_visible()


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
        await expect(page.locator("#notice")).to_contain_text("does not allow listing sessions")
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


# -- issue 17: tree view, times, event details, actions, streaming, narrow screens -------------


async def build_big_tree(db: Path) -> tuple[str, str]:
    """A 10,000-message session with 200 branches, written through the engine into the
    hub's SQLite file: a trunk of 5,025 messages and 199 branches of 25 forking every 20
    messages along it. Returns (session id, trunk leaf id)."""
    store = await SqliteStore.open(db)
    try:
        manager = SessionManager(store)
        info = await manager.create("big-tree")
        trunk = [text(f"t{i}", f"trunk {i}", "user" if i % 2 == 0 else "assistant") for i in range(5025)]
        parent: str | None = None
        for start in range(0, len(trunk), 1000):
            parent = await manager.append_all(info.id, trunk[start : start + 1000], parent)
        for b in range(199):
            branch = [text(f"b{b}-{j}", f"branch {b} message {j}", "assistant") for j in range(25)]
            await manager.append_all(info.id, branch, f"t{b * 20}")
        return info.id, "t5024"
    finally:
        await store.close()


async def test_the_tree_view_at_10000_messages_and_200_branches(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    db = tmp_path / "hub.db"
    session_id, trunk_leaf = await build_big_tree(db)
    async with served(db=db) as h, page_of(browser, request) as page:
        await page.goto(h.url + "/")
        started = time.perf_counter()
        await page.locator("#sessions li", has_text="big-tree").click()
        view = page.locator("#session-view")
        await expect(view).to_have_attribute("data-caught-up", "true", timeout=60_000)
        tree = page.locator("#tree")
        await expect(view).to_have_attribute("data-messages", "10000")
        await expect(tree).to_have_attribute("data-rows", "5025")
        await expect(page.locator("#tree circle.t-node").first).to_be_visible()
        first_render = time.perf_counter() - started
        await expect(page.locator("#leaf-count")).to_have_text("(200 leaves)")
        lanes = int(await tree.get_attribute("data-lanes") or 0)
        assert 2 <= lanes <= 200
        # Only the viewport's rows are in the DOM.
        in_tree = await page.evaluate("document.querySelectorAll('#tree *').length")
        in_page = await page.evaluate("document.getElementsByTagName('*').length")
        assert in_tree < 1000, in_tree
        layout_ms = float(await tree.get_attribute("data-layout-ms") or 0)
        # Scroll to the middle of the tree, then to the top: each is one frame's drawing.
        scroll_ms = await page.evaluate(
            """async () => {
                const t = document.getElementById('tree');
                const out = [];
                for (const top of [t.scrollHeight / 2, 0, t.scrollHeight / 3]) {
                    const t0 = performance.now();
                    t.scrollTop = top;
                    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
                    out.push(performance.now() - t0);
                }
                return out;
            }"""
        )
        assert int(await tree.get_attribute("data-first-row") or -1) > 1000  # redrawn at 1/3
        in_tree_scrolled = await page.evaluate("document.querySelectorAll('#tree *').length")
        assert in_tree_scrolled < 1000, in_tree_scrolled
        draw_ms = float(await tree.get_attribute("data-draw-ms") or 0)
        print(
            f"\ntree at 10,000 messages / 200 branches: first render {first_render * 1000:.0f} ms "
            f"(click to drawn, log replay included), layout {layout_ms} ms, draw {draw_ms} ms, "
            f"scroll frames {', '.join(f'{ms:.0f}' for ms in scroll_ms)} ms, "
            f"{in_tree} tree DOM nodes ({in_page} in the page), {lanes} lanes"
        )
        assert first_render < 60 and max(scroll_ms) < 5000  # hang guards, not benchmarks
        await page.locator("#session").evaluate("e => e.scrollTo(0, 0)")
        await page.screenshot(path=str(ARTIFACTS / "tree-10k.png"))
        # Keyboard: the active leaf is the newest branch's tip; up to its fork point...
        await tree.focus()
        status = page.locator("#tree-status")
        await expect(status).to_contain_text("b198-24")
        for _ in range(25):
            await page.keyboard.press("ArrowUp")
        await expect(status).to_contain_text("t3960")
        await expect(status).to_contain_text("forks into 2")
        await page.keyboard.press("ArrowDown")  # the child on the active branch
        await expect(status).to_contain_text("b198-0")
        await page.keyboard.press("ArrowLeft")  # its sibling: the trunk goes on
        await expect(status).to_contain_text("t3961")
        await expect(status).to_contain_text("branch 1 of 2")
        await page.keyboard.press("Enter")  # ...whose branch becomes the active one
        await expect(page.locator(f'#leaves li[data-id="{trunk_leaf}"]')).to_have_attribute(
            "aria-selected", "true"
        )
        await expect(page.locator('article[data-id="t3961"]')).to_be_focused()
        await expect(page.locator("#tree circle.t-node.on.cursor")).to_have_count(1)
        assert session_id


async def banded_rows(page: Page) -> dict[str, set[str]]:
    """Compaction id -> the messages whose tree node lies inside that compaction's band (its
    rectangles as drawn, against each node's centre: both as Chromium lays them out)."""
    covered: dict[str, list[str]] = await page.evaluate(
        """() => {
            const nodes = [...document.querySelectorAll('#tree circle.t-node')].map((c) => {
                const r = c.getBoundingClientRect();
                return [c.dataset.id, r.x + r.width / 2, r.y + r.height / 2];
            });
            const out = {};
            for (const rect of document.querySelectorAll('#tree rect.t-overlay')) {
                const id = rect.closest('[data-compaction]').dataset.compaction;
                const b = rect.getBoundingClientRect();
                out[id] ??= [];
                for (const [node, x, y] of nodes) {
                    if (x > b.left && x < b.right && y > b.top && y < b.bottom) out[id].push(node);
                }
            }
            return out;
        }"""
    )
    return {cid: set(ids) for cid, ids in covered.items()}


async def test_the_tree_draws_compaction_bands_over_exactly_their_rows(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("banded")
    s = hub.session(info.id)
    # A trunk q0 a1 q2 a3 q4 (lane 0) and a branch b2 b3 from a1 (lane 1, rows 2-3).
    await hub.sessions.append_all(
        info.id,
        [
            text("q0", "q0"),
            text("a1", "a1", "assistant"),
            text("q2", "q2"),
            text("a3", "a3", "assistant"),
            text("q4", "q4"),
        ],
        None,
    )
    await hub.sessions.append_all(info.id, [text("b2", "b2"), text("b3", "b3", "assistant")], "a1")
    # An overlay from the root down into the branch: the trunk's q2 and a3 sit in the same
    # rows, next to it, and are not covered.
    across = await s.add_compaction("the start and the branch, summarized", "q0", "b3")
    await page.goto(h.url + "/")
    await open_session(page, "banded")
    tree = page.locator("#tree")
    await expect(tree).to_have_attribute("data-rows", "5")
    await expect(page.locator(f'#tree [data-compaction="{across.id}"]')).to_have_count(1)
    assert await banded_rows(page) == {across.id: {"q0", "a1", "b2", "b3"}}
    band = page.locator(f'#tree [data-compaction="{across.id}"]')
    await expect(band.locator("title")).to_have_text(
        "Compaction of 4 messages (q0 → b3): the start and the branch, summarized"
    )
    # The status line says so for a covered message (the SVG itself is hidden from readers).
    await tree.focus()
    await page.keyboard.press("Home")
    await expect(page.locator("#tree-status")).to_contain_text("compacted: the start and the branch")
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowDown")  # b2, on the active path (the newest leaf's)
    await expect(page.locator("#tree-status")).to_contain_text("compacted: the start and the branch")
    await page.keyboard.press("ArrowLeft")  # its sibling q2, on the trunk beside the band
    await expect(page.locator("#tree-status")).to_contain_text("user q2")
    await expect(page.locator("#tree-status")).not_to_contain_text("compacted")
    # A second overlay, written while the page watches: its band appears, over its rows only.
    trunk = await s.add_compaction("q2 to q4", "q2", "q4")
    await expect(page.locator(f'#tree [data-compaction="{trunk.id}"]')).to_have_count(1)
    assert await banded_rows(page) == {across.id: {"q0", "a1", "b2", "b3"}, trunk.id: {"q2", "a3", "q4"}}
    await page.locator(".tree-box").screenshot(path=str(ARTIFACTS / "tree-bands-box.png"))
    # A message inside it deleted: its child moves up a row, and the band follows.
    await s.delete_messages(["a3"])
    await expect(tree).to_have_attribute("data-rows", "4")
    assert await banded_rows(page) == {across.id: {"q0", "a1", "b2", "b3"}, trunk.id: {"q2", "q4"}}
    # The first overlay's last message deleted: the overlay no longer applies, and its band goes.
    await s.delete_messages(["b3"])
    await expect(page.locator(f'#tree [data-compaction="{across.id}"]')).to_have_count(0)
    assert await banded_rows(page) == {trunk.id: {"q2", "q4"}}
    await page.screenshot(path=str(ARTIFACTS / "tree-bands.png"))
    # Every overlay gone with the messages: no band is left.
    await s.clear_messages()
    await expect(page.locator("#tree rect.t-overlay")).to_have_count(0)


async def test_the_event_details_of_a_failed_compaction(
    browser: Browser, request: pytest.FixtureRequest, db_path: Path
) -> None:
    def summarizer_down(history: list[Message], context: object) -> CompactResult:
        raise RuntimeError("LLM is down")

    store = await SqliteStore.open(db_path)
    try:
        manager = SessionManager(store).on_compaction(summarizer_down)
        async with served(manager=manager) as h, page_of(browser, request) as page, python_client(h) as hub:
            info = await hub.sessions.create("failing-compaction")
            await hub.sessions.append_all(info.id, [text(f"m{i}", f"message {i}") for i in range(6)])
            await page.goto(h.url + "/")
            await open_session(page, "failing-compaction")
            await page.get_by_role("button", name="Compact now").click()
            await expect(page.locator("#action-status")).to_contain_text("Nothing was compacted")
            row = page.locator("#log li.error")
            await expect(row).to_have_count(1)
            await expect(row).to_have_attribute("data-type", "error")
            await expect(row.locator("summary")).to_contain_text("LLM is down")
            await expect(row.locator("summary time")).to_have_attribute("title", re.compile(r"\d"))
            await row.locator("summary").click()
            await expect(row.locator("pre.ev-data")).to_contain_text('"error": "LLM is down"')
            # The compaction's status event opens to its data too.
            status_row = page.locator('#log li[data-type="status"]').first
            await status_row.locator("summary").click()
            await expect(status_row.locator("pre.ev-data")).to_contain_text('"phase": "compacting"')
            # A filter by type.
            await page.get_by_label("Type", exact=True).select_option("error")
            await expect(page.locator("#log li")).to_have_count(1)
            await expect(page.locator("#log li.error pre.ev-data")).to_be_visible()  # stays open
            await page.get_by_label("Type", exact=True).select_option("")
            await expect(page.locator('#log li[data-type="message.appended"]')).to_have_count(6)
            # Times: messages (their stored time: they carry no createdAt), sessions list.
            stamp = page.locator('article[data-id="m5"] .m-head time')
            await expect(stamp).to_have_attribute("title", re.compile(r"\(stored\)"))
            await expect(stamp).to_have_text(re.compile(r"just now|s ago"))
            await expect(page.locator(f'#sessions li[data-id="{info.id}"] time')).to_have_attribute(
                "title", re.compile("last activity")
            )
            await page.screenshot(path=str(ARTIFACTS / "event-details.png"))
    finally:
        await store.close()


async def test_a_turn_refused_in_a_start_race_is_no_failed_turn(scene: Scene) -> None:
    """Two nodes started a turn at once: the loser logged ``turn.started``, then ``turn.ended``
    with ``refused: true`` (hub/server/turnnodes.py ``_race``), and never ran. Its two rows are
    grey and say so; a turn that did fail stays red."""
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("raced")
    await hub.session(info.id).append_message(text("q1", "the question"))

    async def turn(type_: str, turn_id: str, **data: Any) -> int:
        entry = {"turn_id": turn_id, "reply_id": f"reply-{turn_id}", **data}
        return await h.hub.manager.store.log_event(LogEntry(session_id=info.id, type=type_, data=entry))

    started = {"message_id": "q1", "trigger": "submit-message"}
    await turn("turn.started", "t-failed", **started, node="node-a")
    failed = await turn("turn.ended", "t-failed", status="failed", error="the responder went away")
    won = await turn("turn.started", "t-won", **started, node="node-a")
    lost = await turn("turn.started", "t-lost", **started, node="node-b")
    await page.goto(h.url + "/")
    await open_session(page, "raced")

    def row(seq: int) -> Locator:
        return page.locator(f'#log li[data-seq="{seq}"]')

    await expect(row(failed)).to_have_attribute("class", "error")
    await expect(row(failed).locator("summary")).to_contain_text("the responder went away")
    # Until its refusal is logged, the loser's start reads as any start.
    await expect(row(lost)).not_to_have_attribute("class", "refused")
    error = "turn t-won is still in flight in this session (on hub node node-a)"
    refused = await turn("turn.ended", "t-lost", status="failed", error=error, refused=True)
    for seq in (lost, refused):
        await expect(row(seq)).to_have_attribute("class", "refused")
        await expect(row(seq).locator("summary")).to_contain_text(f"refused, never ran: {error}")
    await expect(row(refused)).to_have_css("font-style", "italic")
    await expect(page.locator("#log li.error")).to_have_count(1)  # the failed turn's end only
    await expect(row(won)).not_to_have_attribute("class", re.compile("."))
    await row(refused).locator("summary").click()
    await expect(row(refused).locator("pre.ev-data")).to_contain_text('"refused": true')


def summarize_first_two(history: list[Message], context: object) -> CompactResult:
    return CompactResult(history[0].id, history[1].id, "the first two, summarized")


async def test_actions_with_the_scope(
    browser: Browser, request: pytest.FixtureRequest, db_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    admin = issue_token(SECRET, {"*": "admin"})
    store = await SqliteStore.open(db_path)
    try:
        manager = SessionManager(store).on_compaction(summarize_first_two)
        async with (
            served(manager=manager, config=config) as h,
            page_of(browser, request) as page,
            HubClient(h.ws_url, token=admin) as hub,
        ):
            info = await hub.sessions.create("acted-on")
            s = hub.session(info.id)
            await s.append_message(text("q1", "first question"))
            await s.append_message(text("a1", "first answer", "assistant"))
            await page.goto(f"{h.url}/#token={admin}")
            await open_session(page, "acted-on")
            await expect(page.locator("#actions")).to_have_attribute("data-level", "admin")
            # Send as a user, on the active leaf...
            await page.get_by_label("Message as user").fill("a follow-up")
            await page.get_by_role("button", name="Send").click()
            await expect(page.locator("#messages article.message")).to_have_count(3)
            history = await s.get_history()
            assert [m.text() for m in history] == ["first question", "first answer", "a follow-up"]
            # ...and as a sibling of it: a new branch from a1.
            await page.get_by_label("Message as user").fill("another follow-up")
            await page.get_by_label("as a sibling of the active message").check()
            await page.get_by_role("button", name="Send").click()
            await expect(page.locator("#leaves li")).to_have_count(2)
            latest = await s.get_history()
            assert [m.text() for m in latest] == ["first question", "first answer", "another follow-up"]
            # Regenerate: a connected responder answers the active leaf (a user message here).
            async with responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1, token=admin):
                await page.get_by_role("button", name="Regenerate").click()
                await expect(page.locator("#action-status")).to_contain_text("Turn started")
                await expect(page.locator("#messages article.message")).to_have_count(4)
                async with asyncio.timeout(5):
                    while h.hub.turns.in_flight(info.id) is not None:
                        await asyncio.sleep(0.01)
            answered = await s.get_history()
            assert [m.id for m in answered[:3]] == [m.id for m in latest]
            assert answered[3].role == "assistant" and answered[3].text() == "You said: another follow-up"
            # Compact now.
            await page.get_by_role("button", name="Compact now").click()
            await expect(page.locator("section.overlay")).to_contain_text("the first two, summarized")
            # Rename.
            await page.get_by_role("button", name="Rename…").click()
            await page.get_by_label("New name").fill("acted-on-renamed")
            await page.get_by_role("button", name="Rename", exact=True).click()
            await expect(page.locator("#session-title")).to_have_text("acted-on-renamed")
            # Fork at the message selected in the tree (the root, with Home).
            await page.locator("#tree").focus()
            await page.keyboard.press("Home")
            await page.get_by_role("button", name="Fork here").click()
            await expect(page.locator("#action-status")).to_contain_text("Forked at q1")
            fork = page.locator("#sessions li", has_text="acted-on-renamed (fork)")
            await expect(fork).to_contain_text("fork")
            # End, after a confirmation (Cancel first: nothing happens), with a reason.
            await page.get_by_role("button", name="End…").click()
            await expect(page.locator("#end-confirm")).to_contain_text("acted-on-renamed")
            await page.get_by_role("button", name="Cancel").click()
            await expect(page.locator("#end-confirm")).to_be_hidden()
            still = await hub.sessions.get(info.id)
            assert still is not None and still.end_reason is None
            await page.get_by_role("button", name="End…").click()
            await page.get_by_label("Reason").fill("done with it")
            await page.get_by_role("button", name="End session").click()
            await expect(page.locator("#action-status")).to_have_text("Ended (done with it).")
            row = page.locator(f'#sessions li[data-id="{info.id}"]')
            await expect(row.locator(".badge.ended")).to_have_text("ended: done with it")
            await expect(page.locator("#session-meta")).to_contain_text("done with it")
            await expect(page.locator("#actions-note")).to_contain_text("This session ended (done with it).")
            ended = await hub.sessions.get(info.id)
            assert ended is not None and ended.end_reason == "done with it"
            # Once ended, End is gone (ending again is a conflict); the other actions stay.
            await expect(page.get_by_role("button", name="End…")).to_have_count(0)
            await expect(page.get_by_role("button", name="Delete…")).to_be_visible()
            # Delete, after a confirmation (Cancel first: nothing happens).
            await page.get_by_role("button", name="Delete…").click()
            await page.get_by_role("button", name="Cancel").click()
            assert await hub.sessions.get(info.id) is not None
            await page.get_by_role("button", name="Delete…").click()
            await expect(page.locator("#delete-confirm")).to_contain_text("acted-on-renamed")
            await page.get_by_role("button", name="Delete for good").click()
            await expect(page.locator(f'#sessions li[data-id="{info.id}"]')).to_have_count(0)
            assert await hub.sessions.get(info.id) is None
            # The fork link in its header leads back... to the deleted parent: a plain id link.
            await fork.click()
            await expect(page.locator("#session-meta a")).to_have_attribute("href", f"#session={info.id}")
    finally:
        await store.close()


async def test_actions_without_the_scope(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    admin = issue_token(SECRET, {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h, page_of(browser, request) as page:
        async with HubClient(h.ws_url, token=admin) as hub:
            info = await hub.sessions.create("read-only")
            await hub.session(info.id).append_message(text("m1", "look, do not touch"))
        reader = issue_token(SECRET, {"*": "read"})
        await page.goto(f"{h.url}/#token={reader}")
        # The token the README suggests lists every session, as of now: a note, not a refusal.
        note = page.locator("#sessions-note")
        await expect(note).to_contain_text("as of now")
        await expect(note).not_to_have_class("warn")
        await expect(note).not_to_contain_text("needs admin")
        await open_session(page, "read-only")
        await expect(page.locator("#actions")).to_have_attribute("data-level", "read")
        await expect(page.locator("#actions-note")).to_contain_text("reading this session only")
        for name in ["Regenerate", "Compact now", "Fork here", "Rename…", "End…", "Delete…", "Send"]:
            await expect(page.get_by_role("button", name=name)).to_have_count(0)
        await expect(page.get_by_label("Message as user")).to_be_hidden()
        await page.screenshot(path=str(ARTIFACTS / "read-only.png"))
        # A write token on this session: appending, not renaming or deleting.
        writer = issue_token(SECRET, {"*": "read", info.id: "write"})
        await page.get_by_role("button", name="Change token").click()
        await page.get_by_label("Access token").fill(writer)
        await page.get_by_role("button", name="Use token").click()
        await expect(page.locator("#actions")).to_have_attribute("data-level", "write")
        await expect(page.get_by_role("button", name="Send")).to_be_visible()
        # Compact now needs a summarizer too, which this hub has not (/healthz says so):
        # test_compact_now_is_offered_only_by_a_hub_that_can_compact shows it offered.
        for name in ["Compact now", "Fork here", "Rename…", "End…", "Delete…"]:
            await expect(page.get_by_role("button", name=name)).to_have_count(0)
        await expect(page.locator("#actions-note")).to_contain_text("ending and deleting need admin")
        # The hub decides anyway: the end op with this token is forbidden, and nothing ends.
        async with HubClient(h.ws_url, token=writer) as as_writer:
            with pytest.raises(HubError) as refused:
                await as_writer.sessions.end(info.id)
            assert refused.value.code == "forbidden"
            still = await as_writer.sessions.get(info.id)
            assert still is not None and still.end_reason is None
        # Admin on this session only (no registry stream): End shows, and the session shows
        # as ended from its own log.
        owner = issue_token(SECRET, {"*": "read", info.id: "admin"})
        await page.get_by_role("button", name="Change token").click()
        await page.get_by_label("Access token").fill(owner)
        await page.get_by_role("button", name="Use token").click()
        await expect(page.locator("#actions")).to_have_attribute("data-level", "admin")
        await page.get_by_role("button", name="End…").click()
        await page.get_by_role("button", name="End session").click()
        await expect(page.locator("#action-status")).to_have_text("Ended (ended).")
        await expect(page.locator("#session-meta")).to_contain_text("ended")
        row = page.locator(f'#sessions li[data-id="{info.id}"]')
        await expect(row.locator(".badge.ended")).to_have_text("ended: ended")
        await expect(page.get_by_role("button", name="End…")).to_have_count(0)


async def test_a_refused_token_shows_in_the_badge(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    forged = issue_token("another-secret-of-the-same-length-for-hs256!!", {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h, page_of(browser, request) as page:
        await page.goto(f"{h.url}/#token={forged}")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "refused")
        await expect(page.locator("#conn")).to_have_text("Connected: token refused")
        await expect(page.locator("#notice")).to_contain_text("refused your token")
        # Said once, not three times.
        assert await page.get_by_text("refused your token").count() == 1


async def test_streaming_follows_the_growing_message(scene: Scene) -> None:
    h, page, hub = scene.served, scene.page, scene.hub
    info = await hub.sessions.create("long-stream")
    await hub.sessions.append_all(info.id, [text(f"m{i}", f"message {i}") for i in range(40)])
    await page.goto(h.url + "/")
    await open_session(page, "long-stream")
    at_bottom = (
        "(() => { const e = document.getElementById('session');"
        " return e.scrollHeight - e.scrollTop - e.clientHeight < 60; })()"
    )
    async with python_client(h, name="writer-1", role="worker") as writer:
        async with writer.session(info.id).stream_message("s1", role="assistant") as st:
            # The hub says which connection streams which message: the writer's row names it.
            row = page.locator("#presence li", has_text="writer-1")
            await expect(row).to_contain_text("streaming s1")
            await expect(row).to_have_attribute("data-streaming", "s1")
            await expect(page.locator("#presence li", has_text="inspector")).not_to_contain_text("streaming")
            for i in range(15):
                await st.text(f"line {i}\n")
            article = page.locator('article[data-id="s1"]')
            await expect(article.locator(".part.text")).to_contain_text("line 14")
            await expect(page.locator('#leaves li[data-id="s1"] .leaf-preview')).to_contain_text("line 14")
            assert await page.evaluate(at_bottom)
            # The user scrolls away: the page stops following, and offers to resume.
            await page.locator("#session").evaluate("e => e.scrollTo(0, 0)")
            await expect(page.locator("#follow")).to_be_visible()
            for i in range(15, 25):
                await st.text(f"line {i}\n")
            await expect(article.locator(".part.text")).to_contain_text("line 24")
            assert await page.locator("#session").evaluate("e => e.scrollTop") == 0
            await page.locator("#follow").click()
            await st.text("the end")
            await expect(article.locator(".part.text")).to_contain_text("the end")
            await page.wait_for_function(at_bottom)
            # The mark leads to the message: scrolled away again, a click brings it back.
            await page.locator("#session").evaluate("e => e.scrollTo(0, 0)")
            await row.get_by_role("button", name="s1").click()
            await expect(article).to_be_in_viewport()
            await page.screenshot(path=str(ARTIFACTS / "presence-streaming.png"))
        await expect(page.locator("#presence")).not_to_contain_text("writer-1")


@pytest.mark.parametrize(("width", "height"), [(800, 700), (390, 844)])
async def test_the_narrow_layout(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path, width: int, height: int
) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        page_of(browser, request, width, height) as page,
        python_client(h) as hub,
    ):
        info = await hub.sessions.create("narrow")
        s = hub.session(info.id)
        await s.append_message(text("q", "a question with a fairly long line of text to wrap on a phone"))
        await s.append_message(text("a", "an answer", "assistant"), "q")
        await s.append_message(text("b", "another answer", "assistant"), "q")
        await page.goto(h.url + "/")
        await open_session(page, "narrow")
        # The details are a drawer, closed: the messages get the width.
        await expect(page.locator("#details-pane")).to_be_hidden()
        box = await page.locator("#session").bounding_box()
        assert box is not None and box["width"] >= width * (0.6 if width > 700 else 0.95)
        await expect(page.locator('article[data-id="b"]')).to_be_in_viewport()
        assert await page.evaluate("document.documentElement.scrollWidth") <= width
        await page.get_by_role("button", name="Details").click()
        await expect(page.locator("#details-pane")).to_be_visible()
        await expect(page.locator("#log li").first).to_be_visible()
        await page.screenshot(path=str(ARTIFACTS / f"narrow-{width}-details.png"))
        await page.get_by_role("button", name="Details").click()
        await expect(page.locator("#details-pane")).to_be_hidden()
        if width < 700:
            await page.get_by_role("button", name="Sessions").click()
            await expect(page.locator("#sessions-pane")).to_be_visible()
            await page.locator("#sessions li", has_text="narrow").click()
            await expect(page.locator("#sessions-pane")).to_be_hidden()


async def test_an_empty_session_list_says_how_to_fill_it(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    async with served(db=tmp_path / "hub.db") as h, page_of(browser, request) as page:
        await page.goto(h.url + "/")
        hint = page.locator("#sessions-hint")
        await expect(hint).to_be_visible()
        await expect(hint).to_contain_text("sessionhub sessions create NAME")
        async with python_client(h) as hub:
            await hub.sessions.create("now there is one")
        await expect(page.locator("#sessions li", has_text="now there is one")).to_be_visible()
        await expect(hint).to_be_hidden()


async def test_compact_now_is_offered_only_by_a_hub_that_can_compact(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    def summarizing(manager: SessionManager) -> None:
        manager.on_compaction(lambda messages, context: None)

    for configure, shown in ((None, False), (summarizing, True)):
        db = tmp_path / f"{shown}.db"
        async with served(db=db, configure_manager=configure) as h, page_of(browser, request) as page:
            async with python_client(h) as hub:
                info = await hub.sessions.create(f"compactable {shown}")
                await hub.session(info.id).append_message(text("u1", "hello"), None)
            await page.goto(h.url + "/")
            await open_session(page, f"compactable {shown}")
            button = page.locator("#act-compact")
            if shown:
                await expect(button).to_be_visible()
                await button.click()
                await expect(page.locator("#action-status")).to_contain_text(
                    "a summary needs a longer history"
                )
            else:
                await expect(page.locator("#act-regenerate")).to_be_visible()  # the actions are drawn
                await expect(button).to_be_hidden()
