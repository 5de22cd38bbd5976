"""sessionhub engine: sessions as message trees, context blocks, the registry, event logs."""

from protocol import Compaction, ContextBlock, Event, Message, SearchResult, SessionInfo

from .context import ContextBlocks, ContextConfig, context_entry_key
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
    SummarizerError,
)
from .manager import SessionManager
from .providers import ReadonlyText, StoreContextProvider, StoreSearchProvider
from .session import Session
from .skills import FileSkillProvider
from .store import LATEST, REGISTRY, PostgresStore, SqliteStore, Store, session_stream
from .tools import Tool

__all__ = [
    "LATEST",
    "REGISTRY",
    "Compaction",
    "Conflict",
    "ContextBlock",
    "ContextBlocks",
    "ContextConfig",
    "ContextError",
    "Event",
    "FileSkillProvider",
    "Forbidden",
    "InvalidInput",
    "InvalidMessage",
    "Message",
    "NotFound",
    "PositionLost",
    "PostgresStore",
    "ReadonlyText",
    "SearchResult",
    "Session",
    "SessionHubError",
    "SessionInfo",
    "SessionManager",
    "SessionNotFound",
    "SqliteStore",
    "Store",
    "StoreClosed",
    "StoreContextProvider",
    "StoreError",
    "StoreSearchProvider",
    "SummarizerError",
    "Tool",
    "context_entry_key",
    "session_stream",
]
