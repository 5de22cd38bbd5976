"""Files in messages (docs/files.md): stored once by SHA-256, referenced as ``/files/{sha256}``.

A message's AI SDK ``file`` part (``{type: "file", mediaType, url, filename}``) keeps a
reference URL, never the bytes: a part that comes in with an inline ``data:`` URL is
converted on the way in, by :func:`attach_files`, which every store's append, upsert and
update run (so every door, the WebSocket ops, the chat adapters and the engine's own
writes, gets it once, in the one path they share). The bytes go to the store's file table
(its own short transaction: the same content is written once whoever sends it, and a
file whose message then fails is unreferenced, which ``gc`` collects); the message's
references are written with the message, in its transaction.

Knowing a hash is no capability: a message may reference a stored file only if its writer
may read it, i.e. it uploaded it (the token's subject) or a session it may read references
it. The writer is :data:`WRITER`, set by each door for the request it serves (None: the
engine's own code, trusted, as a hub without an auth secret trusts everyone).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, BinaryIO, Protocol
from urllib.parse import unquote_to_bytes

import msgspec

from protocol import Forbidden, InvalidInput, Message, SessionHubError

from ..auth import Grant
from .clientwrites import WRITER, Writer, client_messages

__all__ = [
    "CHUNK",
    "FILE_PATH",
    "FileStore",
    "StoredFile",
    "UploadQuotaExceeded",
    "attach_files",
    "check_sha256",
    "chunks_of",
    "file_url",
    "has_files",
    "message_refs",
    "parse_data_url",
    "refs_in",
]

#: Files are stored in chunks of this many bytes (the last may be shorter): a range request
#: reads only the chunks it needs, and no statement carries a whole 20 MB value.
CHUNK = 1 << 20
#: A reference URL's path; the file's hash follows.
FILE_PATH = "/files/"
#: Media type of a file whose sender named none.
OCTETS = "application/octet-stream"

_SHA = re.compile(r"[0-9a-f]{64}")
_REF = re.compile(r"/files/([0-9a-f]{64})")
_MEDIA = re.compile(r"[A-Za-z0-9!#$&^_.+-]{1,127}/[A-Za-z0-9!#$&^_.+-]{1,127}")


class UploadQuotaExceeded(SessionHubError):
    """A file would take its uploader's stored files past ``max_upload_bytes_per_token``:
    nothing of it is stored (``too_large``, 413 on the HTTP doors)."""

    code = "too_large"

    def __init__(self, quota: int) -> None:
        super().__init__(f"this token has uploaded its {quota} bytes of files")


def over_quota(used: int, size: int, quota: int | None) -> None:
    """Refuse a new upload of ``size`` bytes by a subject whose files hold ``used``: the check
    each store makes in the transaction that records the upload, so two at once cannot both
    pass it."""
    if quota is not None and used + size > quota:
        raise UploadQuotaExceeded(quota)


class StoredFile(msgspec.Struct, kw_only=True, frozen=True):
    """A stored file: its hash, size in bytes, media type (the first upload's) and when it
    was last stored or re-sent (a file unreferenced for longer than ``gc``'s grace goes)."""

    sha256: str
    size: int
    media_type: str
    touched_at: datetime


class FileStore(Protocol):
    """What :func:`attach_files` needs of a store (:class:`~.base.Store` has it all)."""

    async def put_file(
        self,
        sha256: str,
        media_type: str,
        data: bytes | BinaryIO,
        *,
        subject: str | None = None,
        quota: int | None = None,
    ) -> StoredFile: ...

    async def file_info(self, sha256: str) -> StoredFile | None: ...

    async def file_uploaded_by(self, sha256: str, subject: str) -> bool: ...

    async def file_sessions(self, sha256: str) -> list[str]: ...


def file_url(sha256: str) -> str:
    return FILE_PATH + sha256


def check_sha256(value: str) -> str:
    """``value`` if it is a lowercase hex SHA-256, else :class:`~protocol.InvalidInput`."""
    if not _SHA.fullmatch(value):
        raise InvalidInput("a file is named by its SHA-256: 64 lowercase hex digits")
    return value


def check_media_type(value: str | None) -> str:
    """A media type's ``type/subtype`` (parameters dropped), :data:`OCTETS` for none."""
    if not value:
        return OCTETS
    media = value.split(";", 1)[0].strip().lower()
    if not _MEDIA.fullmatch(media):
        raise InvalidInput(f"{value[:60]!r} is not a media type")
    return media


def parse_data_url(url: str) -> tuple[str, bytes]:
    """``(media type, bytes)`` of a ``data:`` URL (RFC 2397: base64 or percent-encoded)."""
    head, comma, payload = url.partition(",")
    if not comma:
        raise InvalidInput("a data: URL without a comma")
    params = head[5:].split(";")
    is_base64 = params[-1].strip().lower() == "base64"
    media = check_media_type(params[0] if params[0] else "text/plain")
    if is_base64:
        try:
            return media, base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInput("a data: URL whose base64 is not valid") from None
    return media, unquote_to_bytes(payload)


def chunks_of(data: bytes | BinaryIO) -> Iterator[bytes]:
    """``data`` in :data:`CHUNK` pieces (at least one, empty for an empty file)."""
    if isinstance(data, bytes):
        yield data[:CHUNK]
        for start in range(CHUNK, len(data), CHUNK):
            yield data[start : start + CHUNK]
        return
    first = True
    while True:
        piece = data.read(CHUNK)
        if piece or first:
            yield piece
        first = False
        if len(piece) < CHUNK:
            return


def _file_parts(message: Message) -> Iterator[dict[str, Any]]:
    for part in message.parts:
        if part.get("type") == "file" and isinstance(part.get("url"), str):
            yield part


def has_files(messages: Sequence[Message]) -> bool:
    """Whether any message has a file part: the fast path of every write is a no."""
    return any(part.get("type") == "file" for m in messages for part in m.parts)


def message_refs(message: Message) -> list[str]:
    """The hashes a message's file parts reference (each once, in order)."""
    found: dict[str, None] = {}
    for part in _file_parts(message):
        url: str = part["url"]
        if url.startswith(FILE_PATH) and _SHA.fullmatch(url[len(FILE_PATH) :]):
            found[url[len(FILE_PATH) :]] = None
    return list(found)


def refs_in(text: str) -> set[str]:
    """Every hash a stored text (an event's data, a dumped message) references."""
    return set(_REF.findall(text))


async def attach_files(store: FileStore, messages: Sequence[Message]) -> Sequence[Message]:
    """``messages`` as :func:`.clientwrites.client_messages` leaves them, with inline
    ``data:`` file parts stored and replaced by references, and every reference checked:
    the file is stored and the writer (:data:`~.clientwrites.WRITER`) may read it, else
    :class:`~protocol.InvalidInput` (unknown file) or :class:`~protocol.Forbidden`, and
    nothing is written."""
    messages = client_messages(messages)
    if not has_files(messages):
        return messages
    writer = WRITER.get()
    sent: set[str] = set()
    out: list[Message] = []
    for message in messages:
        parts: list[dict[str, Any]] | None = None
        for i, part in enumerate(message.parts):
            url = part.get("url") if part.get("type") == "file" else None
            if not isinstance(url, str) or url[:5].lower() != "data:":
                continue
            media, data = parse_data_url(url)
            media = check_media_type(part.get("mediaType") or media)
            sha = hashlib.sha256(data).hexdigest()
            if writer is None:
                await store.put_file(sha, media, data)
            else:  # an inline file is an upload too: the writer's quota counts it
                await store.put_file(sha, media, data, subject=writer.subject, quota=writer.quota)
            sent.add(sha)
            if parts is None:
                parts = list(message.parts)
            parts[i] = {**part, "url": file_url(sha), "mediaType": media}
        out.append(message if parts is None else msgspec.structs.replace(message, parts=parts))
    for sha in {sha for m in out for sha in message_refs(m)} - sent:
        await check_reference(store, sha, writer)
    return out


async def check_reference(store: FileStore, sha: str, writer: Writer | None) -> None:
    """Refuse a reference to a file that is not stored, or that ``writer`` may not read."""
    if await store.file_info(sha) is None:
        raise InvalidInput(f"file {sha} is not stored: upload it first (POST /files)")
    if writer is None or not writer.auth or await may_read(store, sha, writer.grant):
        return
    raise Forbidden(f"file {sha} is not yours to reference: upload it, or read a session that has it")


async def may_read(store: FileStore, sha: str, grant: Grant | None) -> bool:
    """Whether ``grant`` may read the stored file ``sha``: its uploader (the token's subject),
    or ``read`` on a session that references it (None: no token, so no)."""
    if grant is None:
        return False
    if await store.file_uploaded_by(sha, grant.subject):
        return True
    return any(grant.level(session_id) >= 0 for session_id in await store.file_sessions(sha))
