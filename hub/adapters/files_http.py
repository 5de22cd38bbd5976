"""Files over HTTP (docs/files.md): ``POST /files`` stores a file once by its SHA-256 and
answers its reference; ``GET``/``HEAD /files/{sha256}`` serve it, with ranges.

Every door's rules hold (docs/security.md, "Every door"): the origin and the token before a
byte of the body is read, the declared length against ``max_file_bytes`` before it too,
then the body counted as it streams to a spool file (memory up to one chunk, then disk) and
cut at the bound, so a refused upload stores nothing and holds no more than the bound.
Uploading needs ``write`` on some session (or ``*``); reading needs the uploader's token
(its subject) or ``read`` on a session whose messages reference the file: knowing a hash
is not a capability, and a file the caller may not read is answered as one not stored.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, BinaryIO, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive

from protocol import Forbidden, InvalidInput, SessionHubError

from ..store.attachments import CHUNK, StoredFile, check_media_type, check_sha256, file_url, may_read
from .body import BodyError, check_declared
from .caller import Caller, caller, cors_headers
from .chats import error_code, json_error, refused
from .port import Adapter, ChatHost, host_of

__all__ = ["PATHS", "adapter"]

#: The adapter's paths (a typed 405 answers any other method on them).
PATHS = ["/files", "/files/{sha256}"]
#: What a multipart body may carry beyond its file (boundaries, part headers).
_MULTIPART_SLACK = 64 << 10
_FILENAME = re.compile(r"[^\x00-\x1f\x7f/\\]{1,255}")
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def _cors(request: Request, hub: ChatHost) -> dict[str, str] | None:
    return cors_headers(request.headers, hub.config, expose="etag, content-range, content-length")


def _filename(value: str | None) -> str | None:
    if value is None or value == "":
        return None
    if not _FILENAME.fullmatch(value):
        raise InvalidInput("a filename is 1-255 characters, without control characters or slashes")
    return value


def _may_upload(who: Caller) -> bool:
    """``write`` on some session, or on ``*``: an upload is for a message to come."""
    if not who.auth:
        return True
    grant = who.grant
    return grant is not None and any(
        grant.allows("append", None if key == "*" else key) for key in grant.scopes
    )


async def _limit(hub: ChatHost, who: Caller) -> int:
    """The most this upload may hold: the file bound, and what is left of the token's (a
    bound on what is read; the store judges the quota again as it records the upload)."""
    limit = hub.config.max_file_bytes
    quota = hub.config.max_upload_bytes_per_token
    if quota is None or who.grant is None:
        return limit
    left = quota - await hub.store.uploaded_bytes(who.grant.subject)
    if left <= 0:
        raise BodyError(413, "too_large", f"this token has uploaded its {quota} bytes of files")
    return min(limit, left)


class _Spool:
    """A body on its way to the store: hashed and counted as it arrives, kept in memory up to
    one chunk and on disk past it."""

    def __init__(self) -> None:
        self.file = cast(BinaryIO, tempfile.SpooledTemporaryFile(max_size=CHUNK))  # noqa: SIM115
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.digest.update(data)
        self.size += len(data)
        self.file.write(data)


async def _raw(receive: Receive, limit: int) -> _Spool:
    spool = _Spool()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            spool.file.close()
            raise BodyError(400, "invalid", "the client went away before its body arrived")
        chunk: bytes = message.get("body", b"")
        if spool.size + len(chunk) > limit:
            spool.file.close()
            raise BodyError(413, "too_large", f"the file is over the {limit}-byte limit")
        spool.write(chunk)
        if not message.get("more_body", False):
            return spool


async def _multipart(request: Request, limit: int) -> tuple[_Spool, str | None, str | None]:
    """The ``file`` field of a ``multipart/form-data`` body: its bytes, media type and name."""
    if importlib.util.find_spec("python_multipart") is None:
        raise BodyError(415, "invalid", "multipart uploads need python-multipart: send the raw bytes instead")
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def bounded() -> AsyncGenerator[bytes, None]:
        seen = 0
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit + _MULTIPART_SLACK:
                raise BodyError(413, "too_large", f"the file is over the {limit}-byte limit")
            yield chunk

    try:
        form = await MultiPartParser(request.headers, bounded(), max_files=1, max_fields=16).parse()
    except MultiPartException as exc:
        raise BodyError(400, "invalid", f"the multipart body is not valid: {exc.message}") from None
    try:
        upload: Any = form.get("file")
        if upload is None or isinstance(upload, str):
            raise BodyError(400, "invalid", "the multipart body needs a file in the field `file`")
        spool = _Spool()
        while piece := await upload.read(CHUNK):
            if spool.size + len(piece) > limit:
                spool.file.close()
                raise BodyError(413, "too_large", f"the file is over the {limit}-byte limit")
            spool.write(piece)
        return spool, upload.content_type, upload.filename
    finally:
        await form.close()


async def _upload(request: Request) -> Response:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    if hub.closing:
        return json_error("unavailable", "the hub is shutting down", cors)
    try:
        who = caller(request.headers, hub.config)
    except Forbidden:
        return refused(request.headers, cors)
    if not _may_upload(who):
        return refused(request.headers, cors)
    try:
        limit = await _limit(hub, who)
    except BodyError as exc:
        return json_error(exc.code, str(exc), cors, exc.status)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    kind = request.headers.get("content-type", "")
    spool: _Spool | None = None
    try:
        filename = _filename(request.query_params.get("filename"))
        if kind.split(";", 1)[0].strip().lower() == "multipart/form-data":
            check_declared(request.headers, limit + _MULTIPART_SLACK)
            spool, part_kind, sent_name = await _multipart(request, limit)
            media, filename = check_media_type(part_kind), filename or _filename(sent_name)
        else:
            media = check_media_type(kind)  # before the body: a bad type reads nothing
            check_declared(request.headers, limit)
            spool = await _raw(request.receive, limit)
    except BodyError as exc:
        if spool is not None:
            spool.file.close()
        return json_error(exc.code, str(exc), cors, exc.status)
    except InvalidInput as exc:
        if spool is not None:
            spool.file.close()
        return json_error("invalid", str(exc), cors)
    try:
        sha = spool.digest.hexdigest()
        subject = None if who.grant is None else who.grant.subject
        quota = hub.config.max_upload_bytes_per_token
        stored = await hub.store.put_file(sha, media, spool.file, subject=subject, quota=quota)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    finally:
        spool.file.close()
    answer: dict[str, Any] = {
        "url": file_url(sha),
        "sha256": sha,
        "size": stored.size,
        "mediaType": stored.media_type,
        "filename": filename,
    }
    return JSONResponse(answer, status_code=201, headers={**cors, "location": file_url(sha)})


def _range(header: str | None, size: int) -> tuple[int, int] | bool | None:
    """``(start, end)`` (inclusive) of a single ``bytes=`` range; None: the whole file (no
    header, several ranges, or another unit: RFC 9110 lets a server ignore them); False: a
    range that cannot be satisfied (416)."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        n = int(last)
        return (max(0, size - n), size - 1) if n > 0 and size > 0 else False
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return False
    return start, end


async def _body(hub: ChatHost, sha: str, start: int, end: int) -> AsyncIterator[bytes]:
    """Bytes ``start..end`` of the file, a stored chunk at a time (one held at once)."""
    for n in range(start // CHUNK, end // CHUNK + 1):
        data = await hub.store.read_file_chunk(sha, n)
        if data is None:  # collected while being read: the response is cut short
            return
        base = n * CHUNK
        yield data[max(0, start - base) : end + 1 - base]


def _headers(info: StoredFile, cors: dict[str, str]) -> dict[str, str]:
    return {
        **cors,
        "content-type": info.media_type,
        "etag": f'"{info.sha256}"',
        "accept-ranges": "bytes",
        # Content-addressed: the bytes behind a URL never change.
        "cache-control": "private, max-age=31536000, immutable",
        # A stored page or script must not run as the hub's origin (the inspector's).
        "content-security-policy": "default-src 'none'; sandbox",
        "x-content-type-options": "nosniff",
    }


async def _download(request: Request) -> Response:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    try:
        who = caller(request.headers, hub.config)
    except Forbidden:
        return refused(request.headers, cors)
    try:
        sha = check_sha256(request.path_params["sha256"])
        info = await hub.store.file_info(sha)
        if info is not None and who.auth and not await may_read(hub.store, sha, who.grant):
            info = None  # not told apart from a file never stored
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    if info is None:
        return json_error("not_found", f"no file {sha} that this token may read", cors)
    headers = _headers(info, cors)
    if request.headers.get("if-none-match") in (headers["etag"], "*"):
        return Response(status_code=304, headers=headers)
    span = _range(request.headers.get("range"), info.size)
    if span is False:
        return Response(status_code=416, headers={**headers, "content-range": f"bytes */{info.size}"})
    status, start, end = 200, 0, info.size - 1
    if isinstance(span, tuple):
        status, (start, end) = 206, span
        headers["content-range"] = f"bytes {start}-{end}/{info.size}"
    headers["content-length"] = str(end - start + 1)
    if request.method == "HEAD" or end < start:
        return Response(status_code=status, headers=headers)
    return StreamingResponse(_body(hub, sha, start, end), status_code=status, headers=headers)


async def _preflight(request: Request) -> Response:
    cors = _cors(request, host_of(request))
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    allow = {"access-control-allow-headers": "authorization, content-type, range"} if cors else {}
    return Response(status_code=204, headers={**cors, **allow})


def adapter() -> Adapter:
    """Files over HTTP, as ``create_app`` mounts them."""
    upload, download = PATHS
    routes: list[BaseRoute] = [
        Route(upload, _upload, methods=["POST"]),
        Route(download, _download, methods=["GET", "HEAD"]),
    ]
    routes += [Route(path, _preflight, methods=["OPTIONS"]) for path in PATHS]
    return Adapter("files_http", routes, PATHS)
