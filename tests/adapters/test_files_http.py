"""Files over HTTP (hub/adapters/files_http.py, docs/files.md) against a served hub: upload
raw and multipart, download with ETag and ranges, the limits and the scopes, and inline
data: URLs converted on every door (a WebSocket append, /api/chat)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from hub.auth import issue_token
from hub.server import HubConfig
from tests.adapters.test_aisdk_chat import _websocket_flags
from tests.support.chatkit import responder
from tests.support.hubtest import served
from tests.support.nodetests import JS, JS7, node20, node22, run_node_tests

SECRET = "f" * 32


def _bearer(scopes: dict[str, Any], subject: str = "sessionhub") -> dict[str, str]:
    return {"authorization": "Bearer " + issue_token(SECRET, scopes, subject=subject)}


def _file_part(url: str, media: str = "image/png", name: str = "a.png") -> dict[str, Any]:
    return {"type": "file", "mediaType": media, "url": url, "filename": name}


async def _stored_bytes(h: Any) -> int:
    store = h.hub.store
    total = 0
    for sha in {s for sid in ("s1", "s2") for s in await store.session_files(sid)}:
        info = await store.file_info(sha)
        total += info.size
    return total


async def test_upload_raw_and_multipart_then_download_with_etag_and_ranges(tmp_path: Path) -> None:
    blob = os.urandom(3 * (1 << 20) + 17)  # past a chunk: ranges across chunk edges
    sha = hashlib.sha256(blob).hexdigest()
    async with served(db=tmp_path / "hub.db") as h, httpx2.AsyncClient() as http:
        r = await http.post(
            f"{h.url}/files?filename=cat.png", content=blob, headers={"content-type": "image/png"}
        )
        assert r.status_code == 201, r.text
        assert r.json() == {
            "url": f"/files/{sha}",
            "sha256": sha,
            "size": len(blob),
            "mediaType": "image/png",
            "filename": "cat.png",
        }
        small = b"%PDF-1.4 tiny"
        r = await http.post(f"{h.url}/files", files={"file": ("doc.pdf", small, "application/pdf")})
        assert r.status_code == 201, r.text
        assert r.json()["filename"] == "doc.pdf" and r.json()["mediaType"] == "application/pdf"
        assert r.json()["sha256"] == hashlib.sha256(small).hexdigest()

        r = await http.get(f"{h.url}/files/{sha}")
        assert r.status_code == 200 and r.content == blob
        assert r.headers["content-type"] == "image/png" and r.headers["etag"] == f'"{sha}"'
        assert r.headers["x-content-type-options"] == "nosniff"
        head = await http.head(f"{h.url}/files/{sha}")
        assert head.status_code == 200 and not head.content
        assert head.headers["content-length"] == str(len(blob))
        again = await http.get(f"{h.url}/files/{sha}", headers={"if-none-match": f'"{sha}"'})
        assert again.status_code == 304
        edge = 1 << 20
        for spec, want in (
            (f"bytes={edge - 5}-{edge + 5}", blob[edge - 5 : edge + 6]),
            ("bytes=-10", blob[-10:]),
            (f"bytes={len(blob) - 3}-", blob[-3:]),
        ):
            r = await http.get(f"{h.url}/files/{sha}", headers={"range": spec})
            assert r.status_code == 206 and r.content == want, spec
            assert r.headers["content-range"].endswith(f"/{len(blob)}")
        r = await http.get(f"{h.url}/files/{sha}", headers={"range": f"bytes={len(blob)}-"})
        assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{len(blob)}"
        r = await http.get(f"{h.url}/files/nothex")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid"
        r = await http.get(f"{h.url}/files/{'0' * 64}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = await http.delete(f"{h.url}/files/{sha}")
        assert r.status_code == 405


async def test_over_the_limit_is_refused_typed_and_nothing_is_stored(tmp_path: Path) -> None:
    config = HubConfig(max_file_bytes=1000)
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        big = os.urandom(1001)
        r = await http.post(f"{h.url}/files", content=big, headers={"content-type": "image/png"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"

        async def chunked() -> Any:  # no Content-Length: cut as it streams
            for _ in range(4):
                yield os.urandom(400)

        r = await http.post(f"{h.url}/files", content=chunked(), headers={"content-type": "image/png"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        r = await http.post(f"{h.url}/files", files={"file": ("big.bin", big, "application/octet-stream")})
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        assert await h.hub.store.file_info(hashlib.sha256(big).hexdigest()) is None
        r = await http.post(f"{h.url}/files", content=b"x", headers={"content-type": "not a type"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid"
        r = await http.post(f"{h.url}/files?filename=a/b", content=b"x")
        assert r.status_code == 400


async def test_scopes_upload_needs_write_and_reading_needs_a_session_that_has_it(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET)
    image = os.urandom(2000)
    sha = hashlib.sha256(image).hexdigest()
    admin = _bearer({"*": "admin"}, subject="ops")
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        await h.hub.store.create_session("one", session_id="s1")
        await h.hub.store.create_session("two", session_id="s2")
        r = await http.post(f"{h.url}/files", content=image)
        assert r.status_code == 401  # no token: refused before the body is read
        r = await http.post(f"{h.url}/files", content=image, headers=_bearer({"s1": "read"}))
        assert r.status_code == 403  # read cannot upload
        alice = _bearer({"s1": "write"}, subject="alice")
        r = await http.post(f"{h.url}/files", content=image, headers={**alice, "content-type": "image/png"})
        assert r.status_code == 201
        # The uploader reads it back; nobody else yet (a hash is no capability).
        assert (await http.get(f"{h.url}/files/{sha}", headers=alice)).content == image
        bob_s2 = _bearer({"s2": "write"}, subject="bob")
        assert (await http.get(f"{h.url}/files/{sha}", headers=bob_s2)).status_code == 404
        # Alice's message references it: a reader of s1 may read it now, one of s2 not.
        async with h.client(additional_headers=alice) as alice_ws:
            await alice_ws.call(
                "append",
                session_id="s1",
                message={"id": "m1", "role": "user", "parts": [_file_part(f"/files/{sha}")]},
            )
        reader = _bearer({"s1": "read"}, subject="carol")
        assert (await http.get(f"{h.url}/files/{sha}", headers=reader)).content == image
        assert (await http.get(f"{h.url}/files/{sha}", headers=bob_s2)).status_code == 404
        # Bob knows the hash but may not reference it in s2: refused, nothing written.
        async with h.client(additional_headers=bob_s2) as bob_ws:
            error = await bob_ws.request(
                "append",
                session_id="s2",
                message={"id": "m2", "role": "user", "parts": [_file_part(f"/files/{sha}")]},
            )
            assert error["frame"] == "error" and error["code"] == "forbidden", error
        assert await h.hub.store.get_history("s2") == []
        assert (await http.get(f"{h.url}/files/{sha}", headers=admin)).status_code == 200


async def test_inline_data_urls_are_stored_once_on_every_door(tmp_path: Path) -> None:
    image = os.urandom(5000)
    sha = hashlib.sha256(image).hexdigest()
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    config = HubConfig(turn_timeout=0.3)
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        await h.hub.store.create_session("one", session_id="s1")
        await h.hub.store.create_session("two", session_id="s2")
        async with h.client() as ws:
            await ws.call(
                "append", session_id="s1", message={"id": "m1", "role": "user", "parts": [_file_part(url)]}
            )
        body = {
            "id": "s2",
            "messages": [{"id": "u1", "role": "user", "parts": [_file_part(url, name="same.png")]}],
        }
        # /api/chat appends before it looks for a responder (none here: its error is the reply).
        async with http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            await r.aread()
        for sid, mid in (("s1", "m1"), ("s2", "u1")):
            message = await h.hub.store.get_message(sid, mid)
            assert message is not None and message.parts[0]["url"] == f"/files/{sha}"
        # Two sessions, one copy.
        assert await h.hub.store.file_sessions(sha) in (["s1", "s2"], ["s2", "s1"])
        assert await _stored_bytes(h) == len(image)
        assert (await http.get(f"{h.url}/files/{sha}")).content == image


@pytest.mark.parametrize("sdk", ["ai6-http", "ai7-ws"])
async def test_the_ai_sdk_sends_a_file_part_stored_once(tmp_path: Path, sdk: str) -> None:
    """tests/js/files.test.mjs (AI SDK 6, /api/chat) and tests/js7/files-ws.test.mjs (AI SDK
    7's WebSocketChatTransport, /api/chat/ws): two chats of the real SDK send one image."""
    node_path = node20() if sdk == "ai6-http" else node22()
    script = JS / "files.test.mjs" if sdk == "ai6-http" else JS7 / "files-ws.test.mjs"
    image = os.urandom(40_000)
    (tmp_path / "pixel.png").write_bytes(image)
    sha = hashlib.sha256(image).hexdigest()
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
    ):
        env = {
            "SESSIONHUB_URL": h.url,
            "SESSIONHUB_WS_URL": h.ws_url,
            "SESSIONHUB_IMAGE": str(tmp_path / "pixel.png"),
        }
        flags = tuple(_websocket_flags(node_path)) if sdk == "ai6-http" else ()
        await run_node_tests(node_path, script, env, passes=2, flags=flags, timeout=90)
        assert len(await h.hub.store.file_sessions(sha)) == 2
    # One copy on disk for the two chats: the chunks hold the image's bytes once.
    with sqlite3.connect(tmp_path / "hub.db") as db:
        assert db.execute("SELECT COUNT(*), SUM(size) FROM files").fetchone() == (1, len(image))
        assert db.execute("SELECT SUM(length(data)) FROM file_chunks").fetchone() == (len(image),)


async def test_a_token_uploads_at_most_its_bytes(tmp_path: Path) -> None:
    config = HubConfig(auth_secret=SECRET, max_upload_bytes_per_token=3000)
    dana, erin = _bearer({"*": "write"}, subject="dana"), _bearer({"*": "write"}, subject="erin")
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        first, second, third = os.urandom(2000), os.urandom(2000), os.urandom(900)
        assert (await http.post(f"{h.url}/files", content=first, headers=dana)).status_code == 201
        r = await http.post(f"{h.url}/files", content=second, headers=dana)
        assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
        assert await h.hub.store.file_info(hashlib.sha256(second).hexdigest()) is None
        assert (await http.post(f"{h.url}/files", content=second, headers=erin)).status_code == 201
        assert (await http.post(f"{h.url}/files", content=third, headers=dana)).status_code == 201
        r = await http.post(f"{h.url}/files", content=b"x" * 200, headers=dana)
        assert r.status_code == 413  # 2,900 of 3,000 used: 100 left


async def test_inline_data_files_count_against_the_upload_quota(tmp_path: Path) -> None:
    """A ``data:`` file in a message is an upload as POST /files is: it counts against its
    writer's quota, and one past it is refused, nothing of the message written."""
    config = HubConfig(auth_secret=SECRET, max_upload_bytes_per_token=3000)
    dana = _bearer({"*": "admin"}, subject="dana")
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        await h.hub.store.create_session("one", session_id="s1")
        first, second = os.urandom(2000), os.urandom(2000)
        async with h.client(additional_headers=dana) as ws:
            inline = "data:image/png;base64," + base64.b64encode(first).decode()
            await ws.call(
                "append", session_id="s1", message={"id": "m1", "role": "user", "parts": [_file_part(inline)]}
            )
            # 2,000 of 3,000 used by the inline file: an upload of 2,000 more is refused.
            r = await http.post(f"{h.url}/files", content=second, headers=dana)
            assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
            inline = "data:image/png;base64," + base64.b64encode(second).decode()
            error = await ws.request(
                "append", session_id="s1", message={"id": "m2", "role": "user", "parts": [_file_part(inline)]}
            )
            assert error["frame"] == "error" and error["code"] == "too_large", error
        assert [m.id for m in await h.hub.store.get_history("s1")] == ["m1"]
        assert await h.hub.store.file_info(hashlib.sha256(second).hexdigest()) is None
        assert await h.hub.store.uploaded_bytes("dana") == 2000


async def test_two_uploads_at_once_cannot_both_pass_the_quota(tmp_path: Path) -> None:
    """Both bodies are on their way before either is stored (each has passed the door's
    check of what is left): the store's check, with the upload it admits, lets one in."""
    config = HubConfig(auth_secret=SECRET, max_upload_bytes_per_token=3000)
    dana = _bearer({"*": "write"}, subject="dana")
    blobs = [os.urandom(2000), os.urandom(2000)]
    started = [asyncio.Event(), asyncio.Event()]

    async def body(i: int) -> AsyncIterator[bytes]:
        yield blobs[i][:1000]
        started[i].set()
        await asyncio.gather(*(e.wait() for e in started))  # the other is past the check too
        await asyncio.sleep(0.05)
        yield blobs[i][1000:]

    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        answers = await asyncio.gather(
            *(http.post(f"{h.url}/files", content=body(i), headers=dana) for i in range(2))
        )
        assert sorted(r.status_code for r in answers) == [201, 413], [r.text for r in answers]
        assert await h.hub.store.uploaded_bytes("dana") == 2000


def _checkpoint(thread: str) -> dict[str, Any]:
    return {"thread_id": thread, "ns": "", "checkpoint_id": "c1", "parent_id": None,
            "type": "msgpack", "data": "AP8=", "metadata": {"step": 0}}  # fmt: skip


async def test_a_checkpoint_put_gets_the_file_checks_of_every_write(tmp_path: Path) -> None:
    """LangGraph's projected messages are writes like any: a reference to a file the writer
    may not read is refused (nothing of the put written), an inline file is stored."""
    config = HubConfig(auth_secret=SECRET)
    image, mine = os.urandom(2000), os.urandom(1000)
    sha = hashlib.sha256(image).hexdigest()
    alice, bob = _bearer({"*": "write"}, subject="alice"), _bearer({"lg-1": "admin"}, subject="bob")
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        assert (await http.post(f"{h.url}/files", content=image, headers=alice)).status_code == 201
        async with h.client(additional_headers=bob) as ws:
            stolen = {"id": "q1", "role": "user", "parts": [_file_part(f"/files/{sha}")]}
            error = await ws.request(
                "checkpoint_put", session_id="lg-1", checkpoint=_checkpoint("lg-1"), messages=[stolen]
            )
            assert error["frame"] == "error" and error["code"] == "forbidden", error
            assert await h.hub.manager.get("lg-1") is None
            assert await h.hub.store.get_checkpoint("lg-1", "", None) is None
            inline = "data:image/png;base64," + base64.b64encode(mine).decode()
            own = {"id": "q1", "role": "user", "parts": [_file_part(inline)]}
            await ws.call("checkpoint_put", session_id="lg-1", checkpoint=_checkpoint("lg-1"), messages=[own])
        (stored,) = await h.hub.store.get_history("lg-1")
        assert stored.parts[0]["url"] == f"/files/{hashlib.sha256(mine).hexdigest()}"
        assert await h.hub.store.uploaded_bytes("bob") == len(mine)


async def test_a_streamed_file_part_is_checked_for_its_writer(tmp_path: Path) -> None:
    """A file part streamed as a delta follows the rule of every write: a reference to a
    file its writer may not read is refused and not applied (the deltas sent after it
    still apply, in order), an inline file is stored and streamed as its reference."""
    config = HubConfig(auth_secret=SECRET)
    image, mine = os.urandom(2000), os.urandom(1000)
    sha, my_sha = hashlib.sha256(image).hexdigest(), hashlib.sha256(mine).hexdigest()
    alice, bob = _bearer({"*": "write"}, subject="alice"), _bearer({"s1": "write"}, subject="bob")
    async with served(db=tmp_path / "hub.db", config=config) as h, httpx2.AsyncClient() as http:
        await h.hub.store.create_session("one", session_id="s1")
        assert (await http.post(f"{h.url}/files", content=image, headers=alice)).status_code == 201
        async with h.client(additional_headers=bob) as ws:
            await ws.call("stream_start", session_id="s1", message_id="a1", role="assistant")
            ids = [
                await ws.send("stream_delta", session_id="s1", message_id="a1", kind="text", text="see "),
                await ws.send(
                    "stream_delta",
                    session_id="s1",
                    message_id="a1",
                    kind="part",
                    part=_file_part(f"/files/{sha}"),
                ),
                await ws.send("stream_delta", session_id="s1", message_id="a1", kind="text", text="this"),
                await ws.send(
                    "stream_delta",
                    session_id="s1",
                    message_id="a1",
                    kind="part",
                    part=_file_part("data:image/png;base64," + base64.b64encode(mine).decode()),
                ),
            ]
            answers = [await ws.answer(i) for i in ids]
            assert answers[1]["frame"] == "error" and answers[1]["code"] == "forbidden", answers
            assert [a.get("result") for a in answers] == [1, None, 2, 3]
            await ws.call("stream_end", session_id="s1", message_id="a1")
        stored = await h.hub.store.get_message("s1", "a1")
        assert stored is not None and stored.parts == [
            {"type": "text", "text": "see this"},
            {"type": "file", "mediaType": "image/png", "url": f"/files/{my_sha}", "filename": "a.png"},
        ]
