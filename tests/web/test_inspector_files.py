"""The inspector shows a message's files (web/inspector/files.js, docs/files.md): an image
inline, another file as a download, both read from /files with the page's token. Chromium via
Playwright, as tests/web/test_inspector.py drives it (its fixtures)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from clients import HubClient
from hub.auth import issue_token
from hub.server import HubConfig
from tests.support.hubtest import served
from tests.web.test_inspector import browser, open_session, page_of

__all__ = ["browser"]

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

SECRET = "i" * 32
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
PDF = b"%PDF-1.4\n% a small document\n"


async def test_an_image_shows_inline_and_a_pdf_downloads(
    browser: Browser, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = HubConfig(auth_secret=SECRET)
    admin = issue_token(SECRET, {"*": "admin"})
    async with served(db=tmp_path / "hub.db", config=config) as h, page_of(browser, request) as page:
        async with HubClient(h.ws_url, token=admin) as hub:
            info = await hub.sessions.create("with-files")
            parts = [
                {"type": "text", "text": "two files"},
                {"type": "file", "mediaType": "image/png", "filename": "pixel.png",
                 "url": "data:image/png;base64," + base64.b64encode(PIXEL).decode()},
                {"type": "file", "mediaType": "application/pdf", "filename": "doc.pdf",
                 "url": "data:application/pdf;base64," + base64.b64encode(PDF).decode()},
            ]  # fmt: skip
            await hub.session(info.id).append_message({"id": "m1", "role": "user", "parts": parts})
        await page.goto(f"{h.url}/#token={admin}")
        await open_session(page, "with-files")
        image = page.locator("#messages figure.part.file.image img")
        await expect(image).to_have_attribute("src", re.compile(r"^blob:"))
        await page.wait_for_function(
            "() => { const i = document.querySelector('#messages figure.part.file.image img');"
            " return i && i.complete && i.naturalWidth === 1; }"
        )
        link = page.locator("#messages a.download", has_text="download")
        await expect(link).to_be_visible()
        async with page.expect_download() as waiting:
            await link.click()
        download = await waiting.value
        assert download.suggested_filename == "doc.pdf"
        saved = tmp_path / "downloaded.pdf"
        await download.save_as(saved)
        assert saved.read_bytes() == PDF
