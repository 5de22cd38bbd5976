"""Records the engine returns and the wire carries: sessions, overlays, search hits, events."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec

__all__ = [
    "Compaction",
    "ContextBlock",
    "Event",
    "PresenceEntry",
    "PruneResult",
    "SearchResult",
    "SessionInfo",
]


class SessionInfo(msgspec.Struct, kw_only=True):
    """One row of the sessions registry."""

    id: str
    name: str
    parent_session_id: str | None = None
    model: str | None = None
    source: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_cost: float = 0.0
    end_reason: str | None = None
    created_at: datetime
    updated_at: datetime


class Compaction(msgspec.Struct, kw_only=True):
    """A summary laid over the messages ``from_message_id``..``to_message_id`` of one path."""

    id: str
    summary: str
    from_message_id: str
    to_message_id: str
    created_at: datetime


class PresenceEntry(msgspec.Struct, kw_only=True):
    """One connection on one session. ``streaming``: the ids of the messages it is streaming
    into that session right now (oldest first; empty when it streams none)."""

    connection_id: str
    name: str | None = None
    role: str | None = None
    streaming: list[str] = msgspec.field(default_factory=list)


class SearchResult(msgspec.Struct, kw_only=True):
    """A full-text hit: the message's indexed text, its session and when it was stored."""

    id: str
    role: str
    content: str
    session_id: str
    created_at: datetime


class Event(msgspec.Struct, kw_only=True):
    """One entry of an event log.

    ``stream`` is ``"session"`` for a session's own log (``seq`` counts that session's
    changes) or ``"registry"`` for the log of session-registry changes (``seq`` counts
    registry changes; ``session_id`` names the session the change is about).
    """

    session_id: str
    seq: int
    epoch: str
    type: str
    data: dict[str, Any]
    created_at: datetime
    stream: Literal["session", "registry"] = "session"


class ContextBlock(msgspec.Struct, kw_only=True):
    """A loaded context block: what the system prompt shows and the tools address."""

    label: str
    description: str | None = None
    content: str
    tokens: int
    max_tokens: int | None = None
    writable: bool
    is_skill: bool
    is_searchable: bool


class PruneResult(msgspec.Struct, kw_only=True):
    """What pruning the event logs removed over the socket (``hub.sessions.prune_events``):
    the fields of the engine's ``hub.store.base.PruneResult``, events and the streams
    whose first seq moved."""

    events: int = 0
    streams: int = 0
