"""Encoding and decoding frames, with long-lived msgspec encoders and decoders."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .frames import REQUEST_TYPES, ErrorCode, ErrorFrame, Request, ServerFrame

__all__ = ["FrameError", "decode_document", "decode_frame", "decode_request", "encode"]

_requests: msgspec.json.Decoder[Request] = msgspec.json.Decoder(Request)
_frames: msgspec.json.Decoder[ServerFrame] = msgspec.json.Decoder(ServerFrame)
_encoder = msgspec.json.Encoder()


class _Peek(msgspec.Struct):
    id: Any = None
    op: Any = None


_peek = msgspec.json.Decoder(_Peek)
_AT_OP = re.compile(r"at `\$\.op`")


class FrameError(Exception):
    """A client frame that cannot be run: the error frame to answer with."""

    def __init__(self, code: ErrorCode, message: str, request_id: str | int | None = None) -> None:
        super().__init__(message)
        self.frame = ErrorFrame(id=request_id, code=code, message=message)


def _request_id(data: str | bytes) -> str | int | None:
    try:
        return _echoable(_peek.decode(data).id)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


def _echoable(value: Any) -> str | int | None:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


def decode_request(data: str | bytes, max_bytes: int = 1 << 20) -> Request:
    """Parse one client frame, or raise :class:`FrameError` carrying the answer: the
    request id is echoed whenever the frame had a readable one."""
    size = len(data.encode() if isinstance(data, str) else data)
    if size > max_bytes:
        raise FrameError(
            "too_large", f"frame of {size} bytes is over the {max_bytes}-byte limit", _request_id(data)
        )
    try:
        return _requests.decode(data)
    except RecursionError:
        # msgspec bounds nesting by the interpreter's recursion limit. Left to propagate,
        # this RuntimeError ended the connection without an answer (the socket loop reads
        # a RuntimeError as "the socket went away").
        raise FrameError("invalid", "the frame is nested too deeply to decode", _request_id(data)) from None
    except msgspec.ValidationError as exc:
        raise _invalid(data, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise FrameError("bad_frame", f"not a JSON object: {exc}") from None


def _invalid(data: str | bytes, text: str) -> FrameError:
    """The answer to a frame msgspec refused while validating. Validation stops at the first
    wrong field, before the parser has seen the rest of the text, so the frame may not be
    JSON at all (``{}x``): it is parsed whole again first, and that parse's own failure is
    the answer (before, it escaped from this handler and dropped the connection)."""
    try:
        peek = _peek.decode(data)
    except msgspec.ValidationError as exc:  # (a DecodeError too) not an object
        return FrameError("bad_frame", f"a request is a JSON object: {exc}")
    except msgspec.DecodeError as exc:
        return FrameError("bad_frame", f"not a JSON object: {exc}")
    except RecursionError:
        return FrameError("invalid", "the frame is nested too deeply to decode")
    rid = _echoable(peek.id)
    if text.startswith("Expected `object`") and " - at `$" not in text:
        return FrameError("bad_frame", f"a request is a JSON object: {text}", rid)
    if _AT_OP.search(text) or text.startswith("Object missing required field `op`"):
        if isinstance(peek.op, str) and peek.op not in REQUEST_TYPES:
            return FrameError("unknown_op", f"unknown op {peek.op!r}", rid)
        return FrameError("bad_frame", f"every request needs an `op` string: {text}", rid)
    if "`$.id`" in text or "missing required field `id`" in text:
        return FrameError("bad_frame", f"every request needs an `id` (string or integer): {text}", rid)
    return FrameError("invalid", text, rid)


def decode_frame(data: str | bytes) -> ServerFrame:
    """Parse one server frame (the client side)."""
    return _frames.decode(data)


def encode(frame: Any) -> bytes:
    return _encoder.encode(frame)


def decode_document(data: str | bytes, type_: Any = Any) -> Any:
    """Parse one JSON document (an HTTP body) by the rules a frame is parsed by: strict JSON
    (one value, nothing after it, no NaN, every float a double), nesting bounded as the
    socket's decoder bounds it, ``type_`` validated. Raises :class:`FrameError`: ``invalid``
    for a document that parses but does not fit (too deep included), ``bad_frame`` for one
    that is not JSON. One decoder for both doors, so what the socket refuses, HTTP does."""
    try:
        return msgspec.json.decode(data, type=type_)
    except RecursionError:
        # As for a frame: msgspec bounds nesting by the interpreter's recursion limit, and
        # the RecursionError it raises is no DecodeError (it escaped as a 500).
        raise FrameError("invalid", "the body is nested too deeply to decode") from None
    except msgspec.ValidationError as exc:
        raise FrameError("invalid", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise FrameError("bad_frame", f"not JSON: {exc}") from None
