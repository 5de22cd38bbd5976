"""Files in messages on both stores (hub/store/attachments.py, docs/files.md): stored once by
hash, inline data: URLs converted on the way in, references checked, written with their
message and gone with it, and collected only once nothing refers to them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hub.auth import Grant
from hub.store.attachments import CHUNK, UploadQuotaExceeded
from hub.store.base import Store
from hub.store.clientwrites import WRITER, Writer
from protocol import Forbidden, InvalidInput, Message

LATER = datetime.now(UTC) + timedelta(days=1)


def writer(subject: str, **scopes: str) -> Writer:
    return Writer(True, Grant(subject=subject, scopes=scopes, expires_at=LATER.timestamp()))  # type: ignore[arg-type]


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def file_message(id_: str, url: str, *, filename: str = "a.png", media: str = "image/png") -> Message:
    part = {"type": "file", "mediaType": media, "url": url, "filename": filename}
    return Message(id=id_, role="user", parts=[{"type": "text", "text": "see"}, part])


async def read_all(store: Store, sha: str) -> bytes:
    info = await store.file_info(sha)
    assert info is not None
    chunks = [await store.read_file_chunk(sha, n) for n in range(max(1, -(-info.size // CHUNK)))]
    return b"".join(c for c in chunks if c is not None)


async def test_a_data_url_is_stored_once_and_the_message_keeps_a_reference(store: Store) -> None:
    image = os.urandom(3000)
    sha = hashlib.sha256(image).hexdigest()
    await store.append_messages("s1", [file_message("m1", data_url(image))])
    await store.append_messages("s2", [file_message("m2", data_url(image), filename="b.png")])
    (m1,) = await store.get_history("s1")
    assert m1.parts[1] == {
        "type": "file",
        "mediaType": "image/png",
        "url": f"/files/{sha}",
        "filename": "a.png",
    }
    (m2,) = await store.get_history("s2")
    assert m2.parts[1]["url"] == f"/files/{sha}" and m2.parts[1]["filename"] == "b.png"
    info = await store.file_info(sha)
    assert info is not None and info.size == 3000 and info.media_type == "image/png"
    assert await read_all(store, sha) == image
    assert sorted(await store.file_sessions(sha)) == ["s1", "s2"]
    assert await store.session_files("s1") == [sha]
    # The events carry the reference, never the bytes.
    events = await store.read_events("s:s1")
    assert all(base64.b64encode(image[:30]).decode() not in str(e.data) for e in events)


async def test_a_big_file_goes_in_chunks_and_reads_back_whole(store: Store) -> None:
    blob = os.urandom(2 * CHUNK + 123)
    sha = hashlib.sha256(blob).hexdigest()
    info = await store.put_file(sha, "application/pdf", io.BytesIO(blob), subject="alice")
    assert info.size == len(blob)
    assert await store.read_file_chunk(sha, 2) == blob[2 * CHUNK :]
    assert await read_all(store, sha) == blob
    assert await store.file_uploaded_by(sha, "alice") and not await store.file_uploaded_by(sha, "bob")
    # Stored again: one copy, the second uploader recorded.
    await store.put_file(sha, "application/pdf", blob, subject="bob")
    assert await store.file_uploaded_by(sha, "bob")


async def test_bytes_that_do_not_hash_to_the_name_are_refused(store: Store) -> None:
    with pytest.raises(InvalidInput):
        await store.put_file("0" * 64, "image/png", b"not that")
    assert await store.file_info("0" * 64) is None
    with pytest.raises(InvalidInput):
        await store.put_file("not-a-hash", "image/png", b"x")


async def test_a_reference_to_an_unknown_file_is_refused_and_nothing_is_written(store: Store) -> None:
    with pytest.raises(InvalidInput, match="not stored"):
        await store.append_messages("s1", [file_message("m1", "/files/" + "a" * 64)])
    assert await store.get_history("s1") == []


async def test_bad_data_urls_are_refused_typed(store: Store) -> None:
    for url in ("data:image/png;base64,@@@", "data:image/png;base64"):
        with pytest.raises(InvalidInput):
            await store.append_messages("s1", [file_message("m1", url)])
    assert await store.get_history("s1") == []


async def test_a_writer_may_reference_only_what_it_may_read(store: Store) -> None:
    image = os.urandom(500)
    sha = hashlib.sha256(image).hexdigest()
    await store.append_messages("secret", [file_message("m1", data_url(image))])
    ref = file_message("m2", f"/files/{sha}")
    stranger = Writer(True, Grant(subject="mallory", scopes={"mine": "write"}, expires_at=LATER.timestamp()))
    token = WRITER.set(stranger)
    try:
        with pytest.raises(Forbidden):
            await store.append_messages("mine", [ref])
        assert await store.get_history("mine") == []
    finally:
        WRITER.reset(token)
    reader = Writer(
        True, Grant(subject="ann", scopes={"mine": "write", "secret": "read"}, expires_at=LATER.timestamp())
    )
    token = WRITER.set(reader)
    try:
        await store.append_messages("mine", [ref])
    finally:
        WRITER.reset(token)
    uploader = Writer(True, Grant(subject="mallory", scopes={"other": "write"}, expires_at=LATER.timestamp()))
    other = os.urandom(400)
    other_sha = hashlib.sha256(other).hexdigest()
    await store.put_file(other_sha, "image/png", other, subject="mallory")
    token = WRITER.set(uploader)
    try:
        await store.append_messages("other", [file_message("m3", f"/files/{other_sha}")])
    finally:
        WRITER.reset(token)
    assert [m.id for m in await store.get_history("other")] == ["m3"]


async def test_gc_collects_exactly_the_unreferenced(store: Store) -> None:
    kept, dropped, loose, fresh = (os.urandom(200 + i) for i in range(4))
    sha = {
        name: hashlib.sha256(b).hexdigest()
        for name, b in zip("kdlf", (kept, dropped, loose, fresh), strict=True)
    }
    await store.append_messages(
        "s1", [file_message("m1", data_url(kept)), file_message("m2", data_url(dropped))]
    )
    await store.put_file(sha["l"], "image/png", loose)
    await store.delete_messages("s1", ["m2"])
    # A deleted message's event still holds its body (and so the reference) until pruned.
    assert await store.collect_files(LATER) == [sha["l"]]
    await store.prune_events(keep_per_session=0)
    assert await store.collect_files(LATER) == [sha["d"]]
    # Never earlier than the grace: a file just stored is not collected.
    await store.put_file(sha["f"], "image/png", fresh)
    assert await store.collect_files(datetime.now(UTC) - timedelta(hours=1)) == []
    assert await store.file_info(sha["k"]) is not None
    assert await read_all(store, sha["k"]) == kept
    await store.clear_messages("s1")
    await store.prune_events(keep_per_session=0)
    assert sorted(await store.collect_files(LATER)) == sorted([sha["k"], sha["f"]])
    assert await store.file_info(sha["k"]) is None and await store.read_file_chunk(sha["k"], 0) is None


async def test_an_update_replaces_the_references(store: Store) -> None:
    a, b = os.urandom(100), os.urandom(101)
    await store.append_messages("s1", [file_message("m1", data_url(a))])
    await store.update_message("s1", file_message("m1", data_url(b)))
    sha_b = hashlib.sha256(b).hexdigest()
    assert await store.session_files("s1") == [sha_b]
    await store.update_message("s1", Message(id="m1", role="user", parts=[{"type": "text", "text": "none"}]))
    assert await store.session_files("s1") == []


async def test_export_import_export_carries_the_files_identically(store: Store, tmp_path: Path) -> None:
    from hub import SqliteStore
    from hub.dump import DumpError, export_lines, import_lines

    image, pdf = os.urandom(4000), os.urandom(300_000)  # the pdf spans several data lines
    await store.create_session("one", session_id="d1")
    await store.create_session("two", session_id="d2")
    await store.append_messages("d1", [file_message("m1", data_url(image))], managed=True)
    await store.append_messages(
        "d2",
        [
            file_message("m2", data_url(image)),
            file_message("m3", data_url(pdf, "application/pdf"), media="application/pdf"),
        ],
        managed=True,
    )
    first = [line async for line in export_lines(store)]
    kinds = [json.loads(line)["type"] for line in first[1:]]
    assert kinds.count("file") == 2  # the shared image once
    assert sum(len(line) for line in first) < 1.4 * (len(image) + len(pdf)) + 10_000
    async with await SqliteStore.open(tmp_path / "copy.db") as copy:
        await import_lines(copy, first)
        assert [line async for line in export_lines(copy)] == first
        for blob in (image, pdf):
            assert await read_all(copy, hashlib.sha256(blob).hexdigest()) == blob
    # A data line that does not hold the file's bytes: refused with its file line's number.
    broken = list(first)
    at = next(i for i, line in enumerate(broken) if json.loads(line).get("type") == "file_data")
    line = json.loads(broken[at])
    line["data"] = base64.b64encode(b"other bytes").decode()
    broken[at] = json.dumps(line)
    async with await SqliteStore.open(tmp_path / "bad.db") as bad:
        with pytest.raises(DumpError, match="data lines"):
            await import_lines(bad, broken)
        assert await bad.list_sessions() == []


async def test_uploads_at_once_pass_the_quota_together_only_if_they_fit(store: Store) -> None:
    """Each store judges the quota in the transaction that records the upload (Postgres
    under the subject's advisory lock): of four 2,000-byte files at once, a 5,000-byte
    quota admits two, whatever their order, and a file already the subject's is free."""
    blobs = [os.urandom(2000) for _ in range(4)]
    shas = [hashlib.sha256(b).hexdigest() for b in blobs]
    results = await asyncio.gather(
        *(
            store.put_file(s, "image/png", b, subject="dana", quota=5000)
            for s, b in zip(shas, blobs, strict=True)
        ),
        return_exceptions=True,
    )
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 2 and all(isinstance(r, UploadQuotaExceeded) for r in refused), results
    assert await store.uploaded_bytes("dana") == 4000
    kept = [s for s, r in zip(shas, results, strict=True) if not isinstance(r, BaseException)]
    assert [await store.file_info(s) is None for s in shas] == [s not in kept for s in shas]
    again = await store.put_file(kept[0], "image/png", blobs[shas.index(kept[0])], subject="dana", quota=5000)
    assert again.size == 2000  # already counted: sent again, it takes nothing more
