"""One timer for the keepalive pings of every connection of a server (:mod:`.wsprotocol`).

uvicorn's protocols arm a timer per connection, and re-arm it at every ping and pong. On
uvloop a ``call_later`` is a libuv timer of its own: py-spy put 4.8% of a connect's server
CPU in arming the first one (issue 28, docs/benchmarks.md), and each connection held one.
Here one repeating tick visits the connections that ping: each sends its ping when it is
due (``ping_interval`` after its last pong, less the round trip, as uvicorn does) and is
failed with 1011 once a ping has waited ``ping_timeout``. The tick is a quarter of the
shorter of the two, so a ping goes out, and a silent peer is dropped, at most that much
later than its own timer would have done (5 s at the 20 s defaults).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

__all__ = ["Keepalive", "Pinged", "keepalive_for"]


class Pinged(Protocol):
    def keepalive_tick(self, now: float) -> None:
        """Send a ping that is due, or fail a peer whose pong is overdue."""


class Keepalive:
    """The connections of one loop that ping at one interval and timeout, and the timer
    that visits them; it stops when the last one leaves."""

    __slots__ = ("key", "loop", "members", "tick", "timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None) -> None:
        self.loop = loop
        self.key = (loop, interval, timeout)
        self.tick = max(0.01, min(interval, timeout if timeout else interval) / 4)
        self.members: dict[Pinged, None] = {}  # a set that keeps the order they came in
        self.timer: asyncio.TimerHandle | None = None

    def add(self, member: Pinged) -> None:
        self.members[member] = None
        if self.timer is None:
            self.timer = self.loop.call_later(self.tick, self.run)

    def discard(self, member: Pinged) -> None:
        self.members.pop(member, None)
        if not self.members:
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            if _KEEPALIVES.get(self.key) is self:
                del _KEEPALIVES[self.key]

    def run(self) -> None:
        self.timer = None
        now = self.loop.time()
        for member in list(self.members):  # a member may leave (fail) while visited
            member.keepalive_tick(now)
        if self.members and self.timer is None:
            self.timer = self.loop.call_later(self.tick, self.run)


_KEEPALIVES: dict[tuple[asyncio.AbstractEventLoop, float, float | None], Keepalive] = {}


def keepalive_for(loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None) -> Keepalive:
    """The keepalive of ``loop`` at ``interval``/``timeout`` (made on first use)."""
    keepalive = _KEEPALIVES.get((loop, interval, timeout))
    if keepalive is None:
        keepalive = _KEEPALIVES[(loop, interval, timeout)] = Keepalive(loop, interval, timeout)
    return keepalive
