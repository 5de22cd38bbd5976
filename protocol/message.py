"""`Message`: one node of a conversation tree, in the Vercel AI SDK ``UIMessage`` shape.

A message read back equals the message written, field for field: parts are open-ended
dicts kept verbatim and unknown top-level keys travel in ``extra``. ``createdAt`` is
normalized to UTC with millisecond precision, the precision of a JavaScript ``Date``,
so the ISO string it renders to (``2026-01-02T03:04:05.678Z``) reads back as the same
instant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from .errors import InvalidMessage

__all__ = [
    "MAX_DEPTH",
    "Message",
    "check_json",
    "coerce_message",
    "format_js_iso",
    "message_from_stored",
    "parse_timestamp",
]

_RESERVED = frozenset({"id", "role", "parts", "createdAt", "created_at", "metadata"})

#: How deeply a message's JSON may nest (objects and arrays, the message itself being
#: depth 1). Decoders bound nesting by the interpreter's recursion limit (~1,000 frames,
#: fewer the deeper the caller already is), so a message accepted much deeper could be
#: stored and then fail every read of its session.
MAX_DEPTH = 128


def _normalize_dt(value: datetime) -> datetime:
    try:
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:30+01:00 is before datetime.min in UTC
        raise InvalidMessage("createdAt", "is outside the years 1..9999 in UTC") from None
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def format_js_iso(value: datetime) -> str:
    """Render like JavaScript's ``Date.prototype.toISOString``."""
    value = _normalize_dt(value)
    # Not strftime("%Y"): glibc renders the year 5 as "5", which fromisoformat refuses,
    # so such a message could be stored and never read back.
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d}T"
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond // 1000:03d}Z"
    )


def parse_timestamp(value: object, field: str) -> datetime:
    """Accept a datetime or an ISO-8601 string; anything else is an InvalidMessage."""
    if isinstance(value, datetime):
        return _normalize_dt(value)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidMessage(field, "is not an ISO-8601 timestamp") from None
        return _normalize_dt(parsed)
    raise InvalidMessage(field, f"must be an ISO-8601 string, got {type(value).__name__}")


def _path(trail: tuple[Any, ...] | None) -> str:
    keys: list[Any] = []
    while trail is not None:
        trail, key = trail
        keys.append(key)
    keys.reverse()
    if len(keys) > 12:  # a self-reference would name every level
        keys = [*keys[:6], "…", *keys[-3:]]
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else str(key))
    return out


def check_json(value: Any, field: str, depth: int = 1) -> None:
    """Refuse what JSON cannot carry faithfully: NaN and infinities (encoders write them as
    ``null``, so the value read back would differ), a non-string object key, and nesting
    deeper than :data:`MAX_DEPTH` (which also stops a self-referencing dict). Raises
    :class:`InvalidMessage` naming the offending path (``parts[2].input.x``).

    Types JSON has no name for (sets, objects...) are left to the encoder, which refuses
    them where the message is stored (:func:`hub.store.rows.message_json`). Iterative, so a
    deep value cannot exhaust the stack here either. ``depth``: the level ``value`` is at."""
    stack: list[tuple[Any, int, tuple[Any, ...] | None]] = [(value, depth, (None, field))]
    while stack:
        item, depth, trail = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidMessage(_path(trail), f"is {item!r}: JSON has no NaN or Infinity")
        elif isinstance(item, dict):
            if depth > MAX_DEPTH:
                raise InvalidMessage(_path(trail), f"nests deeper than {MAX_DEPTH} levels")
            for key, child in item.items():
                if not isinstance(key, str):
                    raise InvalidMessage(_path(trail), f"has a key of type {type(key).__name__}")
                stack.append((child, depth + 1, (trail, key)))
        elif isinstance(item, list | tuple):
            if depth > MAX_DEPTH:
                raise InvalidMessage(_path(trail), f"nests deeper than {MAX_DEPTH} levels")
            stack.extend((child, depth + 1, (trail, i)) for i, child in enumerate(item))


class Message(msgspec.Struct, kw_only=True, gc=False):
    """A conversation message.

    ``parts`` are AI SDK parts (``{"type": "text", "text": ...}``, ``"reasoning"``,
    ``"tool-<name>"``, ``"file"``, ``"data-*"``...), stored and returned unchanged.
    ``extra`` holds any other top-level keys of the dict the message came from.

    Construction checks the top-level types; each part's shape is checked where messages
    enter the engine (:func:`coerce_message`). Messages are not tracked by the garbage
    collector (``gc=False``): a 10,000-message history would otherwise trigger collections
    that cost more than decoding it. They hold JSON data, which cannot refer back to them.
    """

    id: str
    role: str
    parts: list[dict[str, Any]]
    created_at: datetime | None = None
    metadata: Any | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate_top(self.id, self.role, self.parts)
        if self.created_at is not None:
            self.created_at = _normalize_dt(self.created_at)
        if self.extra:
            overlap = _RESERVED.intersection(self.extra)
            if overlap:
                raise InvalidMessage(sorted(overlap)[0], "belongs in its own field, not in extra")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """Build from a ``UIMessage``-shaped dict (``createdAt`` or ``created_at``)."""
        if not isinstance(data, Mapping):
            raise InvalidMessage("message", f"must be a dict, got {type(data).__name__}")
        if "id" not in data:
            raise InvalidMessage("id", "is required")
        if "role" not in data:
            raise InvalidMessage("role", "is required")
        if "parts" not in data:
            raise InvalidMessage("parts", "is required")
        _validate_top(data["id"], data["role"], data["parts"])
        _validate_parts(data["parts"])
        raw_created = data.get("createdAt", data.get("created_at"))
        created = None if raw_created is None else parse_timestamp(raw_created, "createdAt")
        extra = {k: v for k, v in data.items() if k not in _RESERVED} if len(data) > 3 else {}
        return cls(
            id=data["id"],
            role=data["role"],
            parts=data["parts"],
            created_at=created,
            metadata=data.get("metadata"),
            extra=extra,
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``UIMessage`` dict: ``id``, ``role``, ``parts``, then what was given."""
        out: dict[str, Any] = {"id": self.id, "role": self.role, "parts": self.parts}
        if self.created_at is not None:
            out["createdAt"] = format_js_iso(self.created_at)
        if self.metadata is not None:
            out["metadata"] = self.metadata
        out.update(self.extra)
        return out

    def text(self) -> str:
        """The text parts joined by one space: what full-text search indexes."""
        return " ".join(
            p["text"] for p in self.parts if p.get("type") == "text" and isinstance(p.get("text"), str)
        )


def _validate_top(id_: object, role: object, parts: object) -> None:
    if not isinstance(id_, str):
        raise InvalidMessage("id", f"must be a string, got {type(id_).__name__}")
    if not id_:
        raise InvalidMessage("id", "must not be empty")
    if not isinstance(role, str):
        raise InvalidMessage("role", f"must be a string, got {type(role).__name__}")
    if not role:
        raise InvalidMessage("role", "must not be empty")
    if not isinstance(parts, list):
        raise InvalidMessage("parts", f"must be a list, got {type(parts).__name__}")


def _validate_parts(parts: list[Any]) -> None:
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise InvalidMessage(f"parts[{i}]", f"must be a dict, got {type(part).__name__}")
        kind = part.get("type")
        if not isinstance(kind, str):
            raise InvalidMessage(f"parts[{i}].type", "must be a string")


def coerce_message(value: Message | Mapping[str, Any]) -> Message:
    """Accept a :class:`Message` or a ``UIMessage`` dict."""
    message = value if isinstance(value, Message) else Message.from_dict(value)
    if message is value:
        _validate_parts(message.parts)
    # The message is level 1, so what it holds starts at level 2.
    check_json(message.parts, "parts", 2)
    if message.metadata is not None:
        check_json(message.metadata, "metadata", 2)
    if message.extra:
        check_json(message.extra, "message")
    return message


def message_from_stored(data: Any) -> Message | None:
    """A message read back from storage, or None when the row is not one (not an object,
    or ``id`` / ``role`` / ``parts`` missing or of the wrong type). Parts are not re-checked:
    they were checked on the way in, and a read must not fail on one odd part."""
    if type(data) is not dict:
        return None
    id_, role, parts = data.get("id"), data.get("role"), data.get("parts")
    if type(id_) is not str or type(role) is not str or type(parts) is not list or not id_ or not role:
        return None
    raw_created = data.get("createdAt")
    try:
        created = None if raw_created is None else parse_timestamp(raw_created, "createdAt")
    except InvalidMessage:
        return None
    extra = {k: v for k, v in data.items() if k not in _RESERVED} if len(data) > 3 else {}
    try:
        return Message(
            id=id_, role=role, parts=parts, created_at=created, metadata=data.get("metadata"), extra=extra
        )
    except InvalidMessage:
        return None
