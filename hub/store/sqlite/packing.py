"""How the SQLite store packs rows smaller than what they read back as (docs/operations.md,
"Sizes"): a message row's content leaves out the id and role its own columns hold, and an
event's type is a small code. Both read back byte for byte as written before (migration 6)."""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["EVENT_TYPES", "packed", "type_code", "type_name", "unpacked"]

_encode = msgspec.json.Encoder().encode

#: Stored event types: a known type is stored as its index here (``message.appended``,
#: most of every log, as 0, which SQLite stores in no bytes at all). Append only: a code
#: on disk must keep its meaning. Any other type is stored as its text.
EVENT_TYPES: Final = (
    "message.appended",
    "message.updated",
    "message.deleted",
    "messages.cleared",
    "compaction.added",
    "session.created",
    "session.renamed",
    "session.ended",
    "session.deleted",
    "session.forked",
    "session.usage",
    "context.updated",
    "context.added",
    "context.removed",
    "context.entry_set",
    "context.skill_loaded",
    "context.skill_unloaded",
)
_CODES: Final = {name: code for code, name in enumerate(EVENT_TYPES)}


def type_code(type_: str) -> int | str:
    return _CODES.get(type_, type_)


def type_name(stored: int | str) -> str:
    return EVENT_TYPES[stored] if isinstance(stored, int) else stored


def _prefix(id_: str, role: str) -> str:
    # Message.to_dict starts with these two keys, and message_json encodes with msgspec.
    return '{"id":' + _encode(id_).decode() + ',"role":' + _encode(role).decode()


def packed(content: str, id_: str, role: str) -> str:
    """The stored form of a message's JSON: without the leading id and role (the row's
    columns), so it starts with ``,`` or ``}``. JSON that does not start with them (a row
    written by hand, say) is stored whole: it starts with anything else."""
    prefix = _prefix(id_, role)
    if content.startswith(prefix) and content[len(prefix) : len(prefix) + 1] in (",", "}"):
        return content[len(prefix) :]
    return content


def unpacked(stored: str, id_: str, role: str) -> str:
    """The message's JSON, byte for byte, from :func:`packed` and the row's id and role."""
    if stored[:1] in (",", "}"):
        return _prefix(id_, role) + stored
    return stored
