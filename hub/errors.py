"""sessionhub's exceptions (defined in :mod:`protocol.errors`, shared with the client)."""

from protocol.errors import (
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

__all__ = [
    "Conflict",
    "ContextError",
    "Forbidden",
    "InvalidInput",
    "InvalidMessage",
    "NotFound",
    "PositionLost",
    "SessionHubError",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
    "StoreUnavailable",
    "SummarizerError",
]
