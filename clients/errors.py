"""The client's exceptions: :class:`HubError` (an error frame with no engine exception),
:class:`ConnectionLost`, and :func:`error_from`, which turns an error frame back into the
exception the engine would have raised."""

from __future__ import annotations

import ast
import re

from protocol import (
    Conflict,
    InvalidInput,
    InvalidMessage,
    NotFound,
    PositionLost,
    SessionHubError,
    SessionNotFound,
    StoreError,
    SummarizerError,
)
from protocol.frames import ResetFrame

__all__ = ["ConnectionLost", "HubError", "error_from", "position_lost"]


class HubError(SessionHubError):
    """An error frame whose code has no engine exception (``bad_frame``, ``unknown_op``,
    ``too_large``, ``too_many``, ``forbidden``, ``unavailable``). ``code`` is the wire code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ConnectionLost(HubError):
    """No answer can come: the socket dropped while the request was in flight, the hub
    could not be reached, or the client was closed. Code ``unavailable``."""

    def __init__(self, message: str = "the connection to the hub was lost") -> None:
        super().__init__("unavailable", message)


_SESSION_NOT_FOUND = re.compile(r"session not found: ('.*'|\".*\")\Z", re.DOTALL)
_INVALID_MESSAGE = re.compile(r"invalid message: (\S+) (.*)\Z", re.DOTALL)


def error_from(code: str, message: str) -> SessionHubError:
    """The exception the engine would have raised for an error frame, as near as the frame
    tells: ``SessionNotFound`` and ``InvalidMessage`` are recognised by their messages."""
    if code == "invalid":
        found = _INVALID_MESSAGE.match(message)
        if found:
            return InvalidMessage(found.group(1), found.group(2))
        return InvalidInput(message)
    if code == "not_found":
        found = _SESSION_NOT_FOUND.match(message)
        if found:
            try:
                session_id = ast.literal_eval(found.group(1))
            except (ValueError, SyntaxError):
                session_id = None
            if isinstance(session_id, str):
                return SessionNotFound(session_id)
        return NotFound(message)
    if code == "conflict":
        return Conflict(message)
    if code == "upstream":
        return SummarizerError(message)
    if code == "internal":
        return StoreError(message)
    return HubError(code, message)


def position_lost(frame: ResetFrame) -> PositionLost:
    stream = "registry" if frame.session_id is None else frame.session_id
    return PositionLost(
        stream, frame.after_seq, epoch=frame.epoch, first_seq=frame.first_seq, last_seq=frame.last_seq
    )
