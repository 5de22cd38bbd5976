"""sessionhub's exceptions (defined in :mod:`protocol.errors`, shared with the client)."""

from protocol.errors import (
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
    "InvalidInput",
    "InvalidMessage",
    "NotFound",
    "PositionLost",
    "SessionHubError",
    "SessionNotFound",
    "StoreClosed",
    "StoreError",
]
