"""What both stores do alike between a row and a record: the JSON a message is stored as,
the ``message.appended`` event body, session and overlay rows, epochs and timestamps."""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import msgspec

from protocol import Compaction, InvalidMessage, Message, SessionInfo
from protocol.message import message_from_stored

from .base import COST_MAX, INT64_MAX, INT64_MIN

__all__ = [
    "SESSION_COLS",
    "Row",
    "appended_json",
    "appended_ref",
    "aware",
    "compaction",
    "decode_message",
    "message_json",
    "new_epoch",
    "rehydrated",
    "session_info",
    "text_of",
    "ts",
    "updated_json",
]

log = logging.getLogger("sessionhub.store")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class Row(Protocol):
    """A result row of either driver (a tuple, sqlite3.Row or an asyncpg Record)."""

    def __getitem__(self, index: int) -> Any: ...


#: The sessions table's columns, in the order :func:`session_info` reads them.
SESSION_COLS = (
    "id, name, parent_session_id, model, source, input_tokens, output_tokens, "
    "estimated_cost, end_reason, created_at, updated_at"
)


def ts(value: float) -> datetime:
    """A stored epoch-seconds float as an aware UTC datetime. One beyond the calendar (a
    row written by hand, or before imports checked their times) reads as its first or last
    instant, logged, instead of failing every list and export that meets it."""
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        log.warning("a stored time %r is outside the calendar; read as its nearest end", value)
        return _END if value > 0 else _START


_START = datetime.min.replace(tzinfo=UTC)
_END = datetime.max.replace(tzinfo=UTC)


def aware(value: datetime) -> datetime:
    """A timestamptz as read, with its zone. asyncpg reads the infinities as naive
    ``datetime.min``/``max`` (a row stored before imports checked their times): read as UTC,
    so that sorting sessions by time, and so every export, still works."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def new_epoch() -> str:
    return uuid.uuid4().hex[:16]


def decode_message(content: str | bytes) -> Message | None:
    """A stored message, or None (logged) for a row that is not one."""
    try:
        message = message_from_stored(_decode(content))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        # ValidationError: a number msgspec cannot hold; RecursionError: nested too deeply
        # (rows written before MAX_DEPTH was enforced). Either way one row, not the read.
        log.warning("skipping a stored message that cannot be decoded: %s", exc)
        return None
    if message is None:
        log.warning("skipping a stored row that is not a message")
    return message


def message_json(message: Message) -> str:
    """The JSON a message is stored as. What the encoder refuses (an object JSON has no
    type for, a lone surrogate, a self-reference, an integer too long to print) is an
    :class:`~protocol.errors.InvalidMessage`, raised before anything is written."""
    try:
        return _encode(message.to_dict()).decode()
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        # UnicodeEncodeError (a lone surrogate) is a ValueError.
        raise InvalidMessage("message", f"cannot be stored as JSON: {exc}") from None


def _count(value: Any) -> int:
    """A stored token total as an int64, whatever a poisoned row holds (SQLite turns an
    integer overflow into a REAL, and a NaN into NULL)."""
    if type(value) is int:
        return min(max(value, INT64_MIN), INT64_MAX)
    if isinstance(value, float) and not math.isnan(value):
        return INT64_MAX if value >= INT64_MAX else INT64_MIN if value <= INT64_MIN else int(value)
    return 0


def _cost(value: Any) -> float:
    """A stored cost as a finite float: an infinity reads as the largest finite one."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        cost = float(value)
        if math.isnan(cost):
            return 0.0
        return max(min(cost, COST_MAX), -COST_MAX)
    return 0.0


def appended_json(content: str, parent_id: str | None) -> str:
    """The ``message.appended`` event body: the stored JSON verbatim, no second encode."""
    return f'{{"message":{content},"parent_id":{_encode(parent_id).decode()}}}'


def appended_ref(parent_id: str | None) -> str:
    """What a ``message.appended`` event that refers to its message stores as data: only
    the parent id; :func:`appended_json` of the message's row and this gives the body back."""
    return _encode(parent_id).decode()


def rehydrated(content: str, parent_ref: str) -> str:
    """The body of a referring ``message.appended`` event, byte for byte what
    :func:`appended_json` wrote before events referred to their message."""
    return f'{{"message":{content},"parent_id":{parent_ref}}}'


class _Part(msgspec.Struct):
    type: Any = None
    text: Any = None


class _Parts(msgspec.Struct):
    parts: list[_Part] = []


_decode_parts = msgspec.json.Decoder(_Parts).decode


def text_of(content: str | bytes) -> str:
    """``Message.text()`` of a stored message, decoding only its parts (a search hit's
    text: the index keeps no copy). A row that cannot be decoded has no text."""
    try:
        parts = _decode_parts(content).parts
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ""
    return " ".join(p.text for p in parts if p.type == "text" and isinstance(p.text, str))


def updated_json(content: str) -> str:
    """The ``message.updated`` event body, from the stored JSON as ``appended_json``."""
    return f'{{"message":{content}}}'


def session_info(row: Row, when: Callable[[Any], datetime] = aware) -> SessionInfo:
    """A :data:`SESSION_COLS` row; ``when`` turns the stored timestamps into datetimes."""
    return SessionInfo(
        id=row[0],
        name=row[1],
        parent_session_id=row[2],
        model=row[3],
        source=row[4],
        # Sanitized, not trusted: one bad row must not make every list() fail.
        input_tokens=_count(row[5]),
        output_tokens=_count(row[6]),
        estimated_cost=_cost(row[7]),
        end_reason=row[8],
        created_at=when(row[9]),
        updated_at=when(row[10]),
    )


def compaction(row: Row, when: Callable[[Any], datetime] = aware) -> Compaction:
    """An ``id, summary, from_message_id, to_message_id, created_at`` row."""
    return Compaction(
        id=row[0], summary=row[1], from_message_id=row[2], to_message_id=row[3], created_at=when(row[4])
    )
