"""sessionhub engine: sessions as message trees, context blocks, the registry, event logs.

:class:`PostgresStore` needs the ``sessionhub[postgres]`` extra and is imported on first
use: ``import hub`` on SQLite loads neither asyncpg nor redis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    StoreUnavailable,
    SummarizerError,
)
from .manager import SessionManager
from .providers import ReadonlyText, StoreContextProvider, StoreSearchProvider
from .session import Session
from .skills import FileSkillProvider
from .store import LATEST, REGISTRY, SqliteStore, Store, session_stream
from .tools import Tool

if TYPE_CHECKING:
    from .store.postgres import PostgresStore
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
    "StoreUnavailable",
    "SummarizerError",
    "Tool",
    "context_entry_key",
    "session_stream",
]


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .extras import load

        return load("hub.store.postgres", "postgres").PostgresStore
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("sessionhub")
        except PackageNotFoundError:  # a source checkout that was never installed
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
