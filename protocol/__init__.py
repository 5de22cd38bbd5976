"""Wire-level types of sessionhub: messages, records, events and errors. No I/O here."""

from .errors import (
    Conflict,
    ContextError,
    Forbidden,
    InvalidInput,
    InvalidMessage,
    NotFound,
    PositionLost,
    SessionHubError,
    SessionNotFound,
    StoreClosed,
    StoreError,
    StoreUnavailable,
    SummarizerError,
)
from .markers import LATEST, Parent, ParentArg
from .message import Message, coerce_message
from .records import Compaction, ContextBlock, Event, PresenceEntry, PruneResult, SearchResult, SessionInfo

__all__ = [
    "LATEST",
    "Compaction",
    "Conflict",
    "ContextBlock",
    "ContextError",
    "Event",
    "Forbidden",
    "InvalidInput",
    "InvalidMessage",
    "Message",
    "NotFound",
    "Parent",
    "ParentArg",
    "PositionLost",
    "PresenceEntry",
    "PruneResult",
    "SearchResult",
    "SessionHubError",
    "SessionInfo",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
    "coerce_message",
]
