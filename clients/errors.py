"""The client's exceptions: :class:`HubError` (an error frame with no engine exception),
:class:`ConnectionLost`, and :func:`error_from`, which turns an error frame back into the
exception the engine would have raised."""

from __future__ import annotations

from typing import Any

from protocol import PositionLost, SessionHubError
from protocol.errors import from_wire
from protocol.frames import ResetFrame

__all__ = [
    "CLOSE_TOKEN_EXPIRED",
    "CONNECTION_LOST_CODE",
    "ConnectionLost",
    "HubError",
    "TokenExpired",
    "error_from",
    "position_lost",
]

#: The code of :class:`ConnectionLost`: a wire code (the closed set of ``ERROR_CODES``), so
#: that code-based handling covers it; the JS client's ``ConnectionLost`` uses the same one.
CONNECTION_LOST_CODE = "unavailable"


class HubError(SessionHubError):
    """An error frame whose code has no engine exception (``bad_frame``, ``unknown_op``,
    ``too_large``, ``too_many``, ``forbidden``, ``unavailable``). ``code`` is the wire code,
    ``detail`` the frame's structured detail (or None)."""

    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self._detail = detail

    @property
    def detail(self) -> dict[str, Any] | None:
        return self._detail


class ConnectionLost(HubError):
    """No answer can come: the socket dropped while the request was in flight, the hub
    could not be reached, or the client was closed. Code ``unavailable``."""

    def __init__(self, message: str = "the connection to the hub was lost") -> None:
        super().__init__(CONNECTION_LOST_CODE, message)


class TokenExpired(HubError):
    """The hub closed the connection (code 4001) because its token reached ``exp`` and
    was not renewed (:meth:`HubClient.renew`). Code ``forbidden``. The client does not
    reconnect with the expired token: its subscriptions end with this error, and so does
    every later request until :meth:`HubClient.renew` brings a new token."""

    def __init__(self, message: str = "the token expired (close 4001): renew it before its exp") -> None:
        super().__init__("forbidden", message)


#: The close code of a connection whose token expired (hub.server.CLOSE_TOKEN_EXPIRED).
CLOSE_TOKEN_EXPIRED = 4001


def error_from(code: str, message: str, detail: dict[str, Any] | None = None) -> SessionHubError:
    """The exception the engine raised for an error frame: rebuilt from its ``detail``
    (``SessionNotFound(session_id)``, ``InvalidMessage(field, problem)``) by
    :func:`protocol.errors.from_wire`, or a :class:`HubError` carrying the wire code."""
    error = from_wire(code, message, detail)
    return HubError(code, message, detail) if error is None else error


def position_lost(frame: ResetFrame) -> PositionLost:
    stream = "registry" if frame.session_id is None else frame.session_id
    return PositionLost(
        stream, frame.after_seq, epoch=frame.epoch, first_seq=frame.first_seq, last_seq=frame.last_seq
    )
