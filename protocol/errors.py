"""The one exception hierarchy of sessionhub.

Shallow on purpose (after httpx): catch :class:`SessionHubError` for everything, or one of
its direct subclasses for a specific answer. Each class carries the wire ``code`` the hub
uses in an error frame, so the engine in-process and the client over a socket raise the
same types for the same mistakes.

    SessionHubError
    ├── InvalidInput          code "invalid"     bad arguments or a malformed message
    │   ├── InvalidMessage                       ...naming the offending field
    │   └── ContextError                         a refused context-block operation
    ├── NotFound              code "not_found"
    │   └── SessionNotFound                      an unknown session id
    ├── Forbidden             code "forbidden"   the token does not allow this
    ├── Conflict              code "conflict"    the state changed under the operation
    ├── PositionLost          code "reset"       the event log cannot serve a position
    ├── SummarizerError       code "upstream"    a summarizer (LLM) failed
    └── StoreError            code "internal"    the database failed (driver errors translated)
        ├── StoreClosed                          the store was used after close()
        └── StoreUnavailable  code "unavailable" the database cannot be reached now; retry
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Conflict",
    "ContextError",
    "Forbidden",
    "InvalidInput",
    "InvalidMessage",
    "NotFound",
    "PositionLost",
    "SessionHubError",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "from_wire",
]


class SessionHubError(Exception):
    """Base class of every error sessionhub raises on purpose."""

    code: str = "internal"

    @property
    def detail(self) -> dict[str, Any] | None:
        """What an error frame carries besides the message, so that a client can rebuild
        this exception without parsing the text (:func:`from_wire`); None for most."""
        return None


class InvalidInput(SessionHubError, ValueError):
    """An argument is malformed; nothing was written."""

    code = "invalid"


class InvalidMessage(InvalidInput):
    """A message is malformed. ``field`` names the offending field (``parts[2].type``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"invalid message: {field} {problem}")
        self.field = field
        self.problem = problem

    @property
    def detail(self) -> dict[str, Any]:
        return {"field": self.field, "problem": self.problem}


class ContextError(InvalidInput):
    """A context-block operation was refused (readonly block, over ``max_tokens``, unknown
    label...). The message is the original's, e.g. ``Block "soul" is readonly``."""


class NotFound(SessionHubError, LookupError):
    """Something addressed by id does not exist."""

    code = "not_found"


class SessionNotFound(NotFound):
    """The session id is not in the sessions registry."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session not found: {session_id!r}")
        self.session_id = session_id

    @property
    def detail(self) -> dict[str, Any]:
        return {"session_id": self.session_id}


class Forbidden(SessionHubError):
    """The connection's token is missing, invalid, expired, or does not grant this
    operation on this session. The message never says which."""

    code = "forbidden"


class Conflict(SessionHubError):
    """The operation was computed against a state that changed before it could commit
    (a compacted span deleted or re-parented meanwhile, say); nothing was written."""

    code = "conflict"


class SummarizerError(SessionHubError):
    """A summarizer failed: the LLM endpoint was unreachable, timed out, refused the
    request or answered with something that is not a summary."""

    code = "upstream"


class PositionLost(SessionHubError):
    """The event log can no longer serve events after ``after_seq``.

    Raised when the position was pruned, belongs to another epoch of the stream, or lies
    beyond its end. The reader must reload a snapshot and continue from ``last_seq``.
    """

    code = "reset"

    def __init__(self, stream: str, after_seq: int, *, epoch: str, first_seq: int, last_seq: int) -> None:
        super().__init__(
            f"event log of {stream!r} cannot serve events after seq {after_seq} "
            f"(epoch {epoch}, available {first_seq}..{last_seq}); reload a snapshot"
        )
        self.stream = stream
        self.after_seq = after_seq
        self.epoch = epoch
        self.first_seq = first_seq
        self.last_seq = last_seq

    @property
    def detail(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "after_seq": self.after_seq,
            "epoch": self.epoch,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
        }


class StoreError(SessionHubError):
    """The storage backend failed. The change, if any, was rolled back."""

    code = "internal"


class StoreClosed(StoreError):
    """The store was used after it was closed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached now (connection lost, server restarting, timed out).

    ``outcome`` says what became of the write: ``"not_applied"`` when it certainly was not
    (it failed before its commit was sent: retrying is safe), ``"unknown"`` when the commit
    may have reached the server (an idempotent retry, such as appending the same message id
    again, tells which). Reads say ``"not_applied"``."""

    code = "unavailable"

    def __init__(self, message: str, outcome: str = "not_applied") -> None:
        super().__init__(message)
        self.outcome = outcome

    @property
    def detail(self) -> dict[str, Any] | None:
        return {"outcome": self.outcome}


def _text(detail: dict[str, Any], key: str) -> str | None:
    value = detail.get(key)
    return value if isinstance(value, str) else None


def _position(detail: dict[str, Any]) -> PositionLost | None:
    stream, epoch = _text(detail, "stream"), _text(detail, "epoch")
    seqs = [detail.get(k) for k in ("after_seq", "first_seq", "last_seq")]
    if stream is None or epoch is None or not all(type(n) is int for n in seqs):
        return None
    after, first, last = seqs
    assert isinstance(after, int) and isinstance(first, int) and isinstance(last, int)
    return PositionLost(stream, after, epoch=epoch, first_seq=first, last_seq=last)


def from_wire(code: str, message: str, detail: dict[str, Any] | None = None) -> SessionHubError | None:
    """The exception the engine raised, rebuilt from an error frame's ``code``, ``message``
    and ``detail``; None for a code the client answers with its own ``HubError`` (``bad_frame``,
    ``too_many``, ``forbidden``...).
    The subclass (``SessionNotFound``, ``InvalidMessage``, and ``PositionLost`` for a
    ``not_found`` carrying a position) comes from ``detail`` only."""
    detail = detail if isinstance(detail, dict) else {}
    if code == "invalid":
        field, problem = _text(detail, "field"), _text(detail, "problem")
        if field is not None and problem is not None:
            return InvalidMessage(field, problem)
        return InvalidInput(message)
    if code == "not_found":
        lost = _position(detail)
        if lost is not None:
            return lost
        session_id = _text(detail, "session_id")
        return NotFound(message) if session_id is None else SessionNotFound(session_id)
    if code == "conflict":
        return Conflict(message)
    if code == "upstream":
        return SummarizerError(message)
    if code == "internal":
        return StoreError(message)
    if code == "unavailable":
        outcome = _text(detail, "outcome")
        # Without an outcome, "unavailable" is the hub shutting down (or the client's own
        # ConnectionLost): the client answers it with its own error type.
        return None if outcome is None else StoreUnavailable(message, outcome)
    return None
