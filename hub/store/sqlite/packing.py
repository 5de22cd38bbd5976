"""How the SQLite store packs rows smaller than what they read back as (docs/operations.md,
"Sizes"): a message row's content leaves out the id and role its own columns hold, a long
one is deflated, and an event's type and a message's role are small codes. All read back
byte for byte as they were written before migration 6."""

from __future__ import annotations

import logging
import zlib
from typing import Any, Final

import msgspec

from protocol import Message
from protocol.message import message_from_stored

from ..rows import appended_ref, decode_message, rehydrated, text_of

__all__ = [
    "DEFLATE_AT",
    "EVENT_TYPES",
    "ROLES",
    "TEXT_HEAD",
    "TEXT_TAIL",
    "appended_data",
    "inflated",
    "packed",
    "role_code",
    "role_name",
    "stored_message",
    "stored_text",
    "type_code",
    "type_name",
    "unpacked",
]

log = logging.getLogger("sessionhub.store")

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

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


#: Stored roles, as EVENT_TYPES: the two of nearly every message take no bytes.
ROLES: Final = ("user", "assistant", "system", "tool")
_ROLE_CODES: Final = {name: code for code, name in enumerate(ROLES)}


def role_code(role: str) -> int | str:
    return _ROLE_CODES.get(role, role)


def role_name(stored: int | str) -> str:
    return ROLES[stored] if isinstance(stored, int) else stored


def type_code(type_: str) -> int | str:
    return _CODES.get(type_, type_)


def type_name(stored: int | str) -> str:
    return EVENT_TYPES[stored] if isinstance(stored, int) else stored


def _prefix(id_: str, role: str) -> str:
    # Message.to_dict starts with these two keys, and message_json encodes with msgspec.
    return '{"id":' + _encode(id_).decode() + _role(role)


_ROLE_JSON: dict[int | str, str] = {}


def _role(role: int | str) -> str:
    # A read unpacks every row: a handful of roles (as stored), encoded once each.
    found = _ROLE_JSON.get(role)
    if found is None:
        found = ',"role":' + _encode(role_name(role)).decode()
        if len(_ROLE_JSON) < 64:
            _ROLE_JSON[role] = found
    return found


#: What follows the id and role in a message of one text part, up to its text's string, and
#: what closes it: 37 bytes of a ~160-byte message of ~120 characters.
TEXT_HEAD: Final = ',"parts":[{"type":"text","text":'
TEXT_TAIL: Final = "}]}"


#: A stored form of this many characters or more is kept deflated, as a BLOB (the column's
#: type tells the two apart), when that saves at least a fifth. SQLite keeps a row of up to a
#: page whole in one page, so rows of 2-4 KB (messages of ~2,000 characters) took a 4 KB
#: page each: 2.4x the JSON, against 1.2x deflated. Shorter rows share pages (two or more to
#: a page), so deflating them would save less than it costs: an inflate is ~80,000
#: instructions for 2 KB, against ~5,000 to read the row (Postgres's TOAST also compresses
#: from ~2 KB; docs/operations.md, "Sizes").
DEFLATE_AT: Final = 2000


def _deflated(stored: str) -> str | bytes:
    if len(stored) < DEFLATE_AT:
        return stored
    raw = stored.encode()
    # Level 1: within 2 % of level 6's size on prose, at half its time on long messages.
    small = zlib.compress(raw, 1)
    return small if len(small) * 5 <= len(raw) * 4 else stored


def inflated(stored: str | bytes) -> str:
    """A stored form as :func:`packed` made it, before it was deflated. A BLOB that does not
    inflate to text (a row damaged on disk) reads as ``""``, which no reader takes for a
    message: the row is skipped, as one of bad JSON is."""
    if isinstance(stored, str):
        return stored
    try:
        return zlib.decompress(stored).decode()
    except (zlib.error, UnicodeDecodeError) as exc:
        log.warning("skipping a stored message that does not inflate: %s", exc)
        return ""


def packed(content: str, id_: str, role: str) -> str | bytes:
    """The stored form of a message's JSON: without the leading id and role (the row's
    columns), so it starts with ``,`` or ``}``; a message of one text part is only its
    text's JSON string, which starts with ``"``. JSON that does not start with the id and
    role (a row written by hand, say) is stored whole: every row sessionhub wrote before
    migration 6 starts with ``{``. A long form is deflated (:data:`DEFLATE_AT`)."""
    prefix = _prefix(id_, role)
    if not content.startswith(prefix) or content[len(prefix) : len(prefix) + 1] not in (",", "}"):
        return _deflated(content)
    rest = content[len(prefix) :]
    if rest.startswith(TEXT_HEAD + '"') and rest.endswith('"' + TEXT_TAIL):
        return _deflated(rest[len(TEXT_HEAD) : -len(TEXT_TAIL)])
    return _deflated(rest)


def unpacked(stored: str | bytes, id_: str, role: int | str) -> str:
    """The message's JSON, byte for byte, from :func:`packed` and the row's id and role (as
    stored: :func:`role_code`)."""
    if type(stored) is not str:
        stored = inflated(stored)
    first = stored[:1]
    if first == '"':
        return f'{{"id":{_encode(id_).decode()}{_role(role)}{TEXT_HEAD}{stored}{TEXT_TAIL}'
    if first == "," or first == "}":
        return f'{{"id":{_encode(id_).decode()}{_role(role)}{stored}'
    return stored


def stored_message(stored: str | bytes, id_: str, role: int | str) -> Message | None:
    """``decode_message(unpacked(stored, id_, role))``: for a message of one text part
    without reading the id, the role and the part's keys back from JSON (a history read
    decodes every row)."""
    if type(stored) is not str:
        stored = inflated(stored)
    if stored[:1] == '"':
        try:
            text = _decode(stored)
        except msgspec.DecodeError:
            pass  # more parts follow the first, or a bad row: decode_message reads it all
        else:
            if type(text) is str:
                parts = [{"type": "text", "text": text}]
                message = message_from_stored({"id": id_, "role": role_name(role), "parts": parts})
                if message is not None:
                    return message
    return decode_message(unpacked(stored, id_, role))


def appended_data(
    stored: str | bytes | None, id_: str, role: int | str, parent_ref: str | None, parent_id: str | None
) -> Any:
    """The decoded body of a ``message.appended`` event that refers to its message's row:
    ``{"message": ..., "parent_id": ...}`` as :func:`~hub.store.rows.rehydrated` spells it,
    the one-text-part message built without reading its id, role and keys back from JSON.
    ``parent_ref`` is the event's stored data, or None for the row's parent, ``parent_id``."""
    if parent_ref is None:
        parent_ref = appended_ref(parent_id)
    if stored is not None and type(stored) is not str:
        stored = inflated(stored)
    if stored is not None and stored[:1] == '"':
        try:
            text = _decode(stored)
            parent = _decode(parent_ref)
        except msgspec.DecodeError:
            pass
        else:
            message = {"id": id_, "role": role_name(role), "parts": [{"type": "text", "text": text}]}
            return {"message": message, "parent_id": parent}
    return _decode(rehydrated(unpacked(stored, id_, role) if stored else "null", parent_ref))


def stored_text(stored: str | bytes, id_: str, role: int | str) -> str:
    """``text_of(unpacked(stored, id_, role))``: a search hit's text, for a message of one
    text part its text's string alone."""
    if type(stored) is not str:
        stored = inflated(stored)
    if stored[:1] == '"':
        try:
            text = _decode(stored)
        except msgspec.DecodeError:
            pass  # not one string: more parts follow the first (text_of reads them all)
        else:
            if type(text) is str:
                return text
    return text_of(unpacked(stored, id_, role))
