"""sessionhub engine: sessions as message trees, the registry, and their event logs."""

from protocol import Compaction, Event, Message, SearchResult, SessionInfo

from .errors import (
    InvalidInput,
    InvalidMessage,
    NotFound,
    PositionLost,
    SessionHubError,
    SessionNotFound,
    StoreClosed,
    StoreError,
)
from .manager import SessionManager
from .session import Session
from .store import LATEST, REGISTRY, SqliteStore, Store, session_stream

__all__ = [
    "LATEST",
    "REGISTRY",
    "Compaction",
    "Event",
    "InvalidInput",
    "InvalidMessage",
    "Message",
    "NotFound",
    "PositionLost",
    "SearchResult",
    "Session",
    "SessionHubError",
    "SessionInfo",
    "SessionManager",
    "SessionNotFound",
    "SqliteStore",
    "Store",
    "StoreClosed",
    "StoreError",
    "session_stream",
]
