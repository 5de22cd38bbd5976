"""Storage backends. Nothing outside this package writes SQL.

:class:`PostgresStore` (extra ``sessionhub[postgres]``) is imported on first use, so that
a SQLite hub does not load asyncpg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..extras import load
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
from .sqlite import SqliteStore

if TYPE_CHECKING:
    from .postgres import PostgresStore

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


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        return load("hub.store.postgres", "postgres").PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
