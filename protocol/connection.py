"""Deprecated alias, kept for 0.1 (docs/architecture.md, "Renamed in 0.x"): the client
side is :mod:`protocol.clientconn`, the server side :mod:`protocol.serverconn`."""

from .clientconn import (
    ClientConnection,
    ClientEffect,
    Delivered,
    Dumped,
    Failed,
    Ignored,
    Position,
    PresenceChanged,
    Reset,
    Resolved,
    Streamed,
    Subscribed,
    SubscribeFailed,
    SummaryWanted,
    TurnGiven,
    TurnStopped,
    Unsubscribed,
)
from .serverconn import ServerConnection, StreamKey

__all__ = [
    "ClientConnection",
    "ClientEffect",
    "Delivered",
    "Dumped",
    "Failed",
    "Ignored",
    "Position",
    "PresenceChanged",
    "Reset",
    "Resolved",
    "ServerConnection",
    "StreamKey",
    "Streamed",
    "SubscribeFailed",
    "Subscribed",
    "SummaryWanted",
    "TurnGiven",
    "TurnStopped",
    "Unsubscribed",
]
