"""sessionhub's exceptions (defined in :mod:`protocol.errors`, shared with the client)."""

from protocol.errors import (
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

__all__ = [
    "Conflict",
    "ContextError",
    "InvalidInput",
    "InvalidMessage",
    "NotFound",
    "PositionLost",
    "SessionHubError",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
    "SummarizerError",
]
