"""A LangGraph thread's saved state, as the store keeps it and the wire carries it.

The hub never decodes a checkpoint: ``data`` and a write's ``value`` are LangGraph's own
serializer output (``serde.dumps_typed`` gives ``(type, bytes)``), kept as bytes (a BLOB on
SQLite, bytea on Postgres; base64 only on the JSON wire). The metadata is JSON, as
LangGraph's own savers keep it, because ``list(filter=...)`` matches on its keys.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["CheckpointRecord", "CheckpointWrite"]


class CheckpointWrite(msgspec.Struct, kw_only=True):
    """One pending write of a task: ``idx`` is LangGraph's (negative for the special
    channels, ``WRITES_IDX_MAP``)."""

    task_id: str
    idx: int
    channel: str
    type: str
    value: bytes
    task_path: str = ""


class CheckpointRecord(msgspec.Struct, kw_only=True):
    """One checkpoint of ``thread_id`` (a session id) in namespace ``ns``; ``writes`` are
    its pending writes (filled on reads, ignored on a put)."""

    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    type: str
    data: bytes
    metadata: dict[str, Any]
    writes: list[CheckpointWrite] = msgspec.field(default_factory=list)
