"""Doorbells: "stream S has events up to seq N". They carry positions, never bodies;
the event log is the truth, and a listener reads what it missed from it."""

from typing import Protocol

from .memory import MemoryBus

__all__ = ["Bus", "MemoryBus"]


class Bus(Protocol):
    """What a store rings after each commit and what a follower waits on."""

    def publish(self, stream: str, seq: int) -> None: ...

    def last_seq(self, stream: str) -> int: ...

    async def wait(self, stream: str, after_seq: int, timeout: float | None = None) -> int: ...
