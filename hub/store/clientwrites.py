"""What every write of a message goes through on its way into a store, whoever sends it
(docs/engine.md, "Client writes"; docs/files.md): the one path the WebSocket ops, the chat
adapters and the engine's own ``Session`` and ``SessionManager`` share.

- A message whose id is a compaction overlay's (``compaction_...``) is dropped, silently:
  overlays are derived on read, and a chat client posts its transcript back, overlays
  included, after every compaction. The original does the same (agents 0.32,
  ``Session.appendMessage``); an import keeps such a row (``importMessage``), and so does
  ours (``Store.import_sessions`` does not come here).
- A write a door sends on a client's behalf (:data:`WRITER` set) loses the metadata keys the
  hub reserves (``serve --reserved-metadata-key``; agents 0.32's ``reservedMetadataKeys``,
  stripped from ``source: "client"`` writes), so a page cannot forge what the server writes
  there (a turn's usage, say). The engine's own writes keep them.
- Inline ``data:`` files are stored and become references (:func:`.attachments.attach_files`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import msgspec

from protocol import Message

from ..auth import Grant
from .overlays import COMPACTION_PREFIX

__all__ = ["WRITER", "Writer", "client_messages", "is_overlay_id"]


@dataclass(frozen=True)
class Writer:
    """Who is writing, as the door that serves them saw it: ``auth`` False is a hub without
    an auth secret (anyone may reference any stored file); with it, ``grant`` is the
    writer's verified token (None: none, so no stored file). ``reserved``: the metadata keys
    its messages may not set; ``quota``: the bytes of stored files its subject may have
    uploaded (``max_upload_bytes_per_token``), inline ``data:`` files included."""

    auth: bool
    grant: Grant | None
    reserved: frozenset[str] = frozenset()
    quota: int | None = None

    @property
    def subject(self) -> str | None:
        return None if self.grant is None else self.grant.subject


#: The writer of the request being served (each door sets it); None: trusted engine code.
WRITER: ContextVar[Writer | None] = ContextVar("sessionhub_writer", default=None)


def is_overlay_id(message_id: str) -> bool:
    return message_id.startswith(COMPACTION_PREFIX)


def _strip(message: Message, reserved: frozenset[str]) -> Message:
    metadata = message.metadata
    if not isinstance(metadata, dict) or reserved.isdisjoint(metadata):
        return message
    kept = {k: v for k, v in metadata.items() if k not in reserved}
    return msgspec.structs.replace(message, metadata=kept or None)


def client_messages(messages: Sequence[Message]) -> Sequence[Message]:
    """``messages`` without overlay ids, and, for a door's writer, without reserved keys."""
    writer = WRITER.get()
    if not any(is_overlay_id(m.id) for m in messages) and (writer is None or not writer.reserved):
        return messages
    kept = [m for m in messages if not is_overlay_id(m.id)]
    if writer is not None and writer.reserved:
        kept = [_strip(m, writer.reserved) for m in kept]
    return kept
