"""An HTTP request's body, read within a byte bound and parsed by the socket's rules.

Every adapter route that takes a body (``POST /api/chat``, ``/mcp``) checks its token first, then
the declared ``Content-Length`` against ``HubConfig.max_body_bytes`` before a byte is read;
a body without a length (chunked) is counted as it arrives and cut at the bound, so no
request holds more than the bound in memory. The JSON is parsed by
:func:`protocol.codec.decode_document`, the decoder the WebSocket's frames go through: the
same nesting bound, strict numbers, nothing after the document. Each route renders a
:class:`BodyError` in its own protocol's form (the chat's JSON error, MCP's JSON-RPC error).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.types import Receive

from protocol.codec import FrameError, decode_document

__all__ = ["BodyError", "check_declared", "content_type_refused", "parse_body", "read_body"]


class BodyError(Exception):
    """A request body refused before it was used: the HTTP status, the hub's error code
    (``too_large``, ``invalid``) and why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _declared(headers: Headers) -> int | None:
    value = headers.get("content-length")
    if value is None:
        return None
    if not value.strip().isdigit():
        raise BodyError(400, "invalid", f"Content-Length {value[:40]!r} is not a number of bytes")
    return int(value)


def check_declared(headers: Headers, limit: int) -> None:
    """Refuse a body declared larger than ``limit``: nothing of it has been read."""
    declared = _declared(headers)
    if declared is not None and declared > limit:
        raise BodyError(413, "too_large", f"a body of {declared} bytes is over the {limit}-byte limit")


def content_type_refused(headers: Headers, *, required: bool = False) -> BodyError | None:
    """A body that says it is not JSON (a form, text/plain): refused unread. No
    ``Content-Type`` at all is read as JSON, as clients that post bytes send it, unless
    ``required`` (MCP's transport requires it)."""
    kind = headers.get("content-type")
    if kind is None:
        if required:
            return BodyError(415, "invalid", "the body must be sent as Content-Type: application/json")
        return None
    media = kind.split(";", 1)[0].strip().lower()
    if media == "application/json" or media.endswith("+json"):
        return None
    return BodyError(415, "invalid", f"the body must be application/json, not {kind[:60]!r}")


async def read_body(receive: Receive, headers: Headers, limit: int, *, type_required: bool = False) -> bytes:
    """The whole body, at most ``limit`` bytes: the declared length and the content type
    are checked first, and chunks are counted as they come (a chunked body, or one longer
    than it said)."""
    check_declared(headers, limit)
    refused = content_type_refused(headers, required=type_required)
    if refused is not None:
        raise refused
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise BodyError(400, "invalid", "the client went away before its body arrived")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyError(413, "too_large", f"the body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_body(data: bytes, type_: Any = Any) -> Any:
    """The body as ``type_``, by the socket's decoder; :class:`BodyError` 400 ``invalid``."""
    try:
        return decode_document(data, type_)
    except FrameError as exc:
        raise BodyError(400, "invalid", f"the body is not a valid request: {exc}") from None
