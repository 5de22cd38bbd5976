"""sessionhub's exceptions (defined in :mod:`protocol.errors`, shared with the client)."""

from protocol.errors import (
    ContextError,
    InvalidInput,
    InvalidMessage,
    NotFound,
    PositionLost,
    SessionHubError,
    SessionNotFound,
    StoreClosed,
    StoreError,
)

__all__ = [
    "ContextError",
    "InvalidInput",
    "InvalidMessage",
    "NotFound",
    "PositionLost",
    "SessionHubError",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
]
