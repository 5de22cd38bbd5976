"""The doorbell's wire form, shared by every cross-node bus: ``"<seq> <stream>"``.

Postgres refuses NOTIFY payloads of 8,000 bytes or more, and a session id is the
caller's to choose, so a stream key that would not fit travels as ``#`` and its SHA-256.
A listener only rings streams somebody on its node waits on, and it knows those names,
so it can map a hash back (:meth:`hub.bus.postgres.PgListenBus`).
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["CHANNEL", "MAX_PAYLOAD", "decode", "encode", "stream_hash", "stream_key"]

#: The LISTEN/NOTIFY channel and the Redis pub/sub channel.
CHANNEL: Final = "sessionhub"
#: Postgres' limit is "shorter than 8000 bytes"; keep well inside it.
MAX_PAYLOAD: Final = 7900


def stream_hash(stream: str) -> str:
    return "#" + hashlib.sha256(stream.encode()).hexdigest()


def stream_key(stream: str) -> str:
    """What a payload names ``stream`` by: itself, or its hash when a payload with the
    longest seq (20 digits) would not fit. A store that builds the payload in SQL, where
    the seq is known only there, sends ``"<seq> " || stream_key(stream)``."""
    return stream if len(stream.encode()) + 21 <= MAX_PAYLOAD else stream_hash(stream)


def encode(stream: str, seq: int) -> str:
    """The payload announcing that ``stream`` has events up to ``seq``."""
    return f"{seq} {stream_key(stream)}"


def decode(payload: str) -> tuple[str, int]:
    """``(stream or #hash, seq)``; raises ValueError on a payload this module did not write."""
    seq, sep, stream = payload.partition(" ")
    if not sep or not stream:
        raise ValueError(f"not a doorbell payload: {payload[:80]!r}")
    return stream, int(seq)
