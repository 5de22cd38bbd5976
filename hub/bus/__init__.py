"""Doorbells: "stream S has events up to seq N". They carry positions, never bodies;
the event log is the truth, and a listener reads what it missed from it.

One node needs only :class:`MemoryBus`. Several nodes on one database ring each other
through :class:`PgListenBus` (Postgres LISTEN/NOTIFY, extra ``sessionhub[postgres]``) or
:class:`RedisBus` (Redis pub/sub, extra ``sessionhub[redis]``); both are
:class:`RemoteBus`\\ es and must be started before use. Those two are imported on first
use, so that a SQLite hub loads neither driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..extras import load
from .memory import MemoryBus
from .remote import RemoteBus

if TYPE_CHECKING:
    from .postgres import PgListenBus
    from .redis import RedisBus

__all__ = ["Bus", "MemoryBus", "PgListenBus", "RedisBus", "RemoteBus"]

_LAZY = {"PgListenBus": ("hub.bus.postgres", "postgres"), "RedisBus": ("hub.bus.redis", "redis")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, extra = _LAZY[name]
        return getattr(load(module, extra), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Bus(Protocol):
    """What a store rings after each commit and what a follower waits on.

    A follower calls ``follow(stream)`` before its first read of the log (and ``unfollow``
    when done), reads ``generation`` *before* each read and passes it to the next ``wait``
    as ``since``; a bus that may have missed doorbells in between (a
    reconnection) changes its generation, and ``wait`` then returns at once.
    """

    @property
    def generation(self) -> int: ...

    def follow(self, stream: str) -> None: ...

    def unfollow(self, stream: str) -> None: ...

    def publish(self, stream: str, seq: int) -> None: ...

    def last_seq(self, stream: str) -> int: ...

    async def wait(
        self, stream: str, after_seq: int, timeout: float | None = None, *, since: int | None = None
    ) -> int: ...
