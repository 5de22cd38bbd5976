"""Wire-level types of sessionhub: messages, records, events and errors. No I/O here."""

from .errors import (
    Conflict,
    ContextError,
    InvalidInput,
    InvalidMessage,
    NotFound,
    PositionLost,
    SessionHubError,
    SessionNotFound,
    StoreClosed,
    StoreError,
    SummarizerError,
)
from .message import Message, coerce_message
from .records import Compaction, ContextBlock, Event, SearchResult, SessionInfo

__all__ = [
    "Compaction",
    "Conflict",
    "ContextBlock",
    "ContextError",
    "Event",
    "InvalidInput",
    "InvalidMessage",
    "Message",
    "NotFound",
    "PositionLost",
    "SearchResult",
    "SessionHubError",
    "SessionInfo",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
    "SummarizerError",
    "coerce_message",
]
