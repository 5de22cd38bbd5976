"""Storage backends. Nothing outside this package writes SQL."""

from .base import (
    LATEST,
    REGISTRY,
    AppendResult,
    LogEntry,
    Parent,
    ParentArg,
    Store,
    StreamPosition,
    session_stream,
)
from .postgres import PostgresStore
from .sqlite import SqliteStore

__all__ = [
    "LATEST",
    "REGISTRY",
    "AppendResult",
    "LogEntry",
    "Parent",
    "ParentArg",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "StreamPosition",
    "session_stream",
]
