"""What the hub holds for its peers, in bytes, and the bounded outgoing queue of one connection."""

from __future__ import annotations

import asyncio
import collections


class Evicted(Exception):
    """A frame could not be queued: the peer is closed, or was evicted for not reading
    (its outbox stayed full). Raised by a connection's ``send``; whoever sends to a peer
    outside the connection module (turns, subscriptions) catches it from here."""


class Held:
    """Bytes the hub holds for its peers, summed over connections and tails: what
    ``outbox_bytes_total`` and ``tail_bytes_total`` bound and ``/metrics`` shows."""

    __slots__ = ("outbox", "replay", "tail", "waiting")

    def __init__(self) -> None:
        self.outbox = 0
        self.waiting = 0
        self.replay = 0
        self.tail = 0

    @property
    def unsent(self) -> int:
        return self.outbox + self.waiting + self.replay


def frame_cost(data: str | None) -> int:
    """What a queued frame costs: its characters (the JSON is ASCII but for non-ASCII text,
    and CPython stores an ASCII str in one byte a character) and the str header."""
    return 0 if data is None else len(data) + STR_HEADER


#: sys.getsizeof("") on 64-bit CPython: the header of a compact ASCII str.
STR_HEADER = 49


class Outbox:
    """One connection's bounded FIFO of outgoing frames, bounded in frames (``maxsize``)
    and in bytes (``max_bytes``; an empty outbox takes one frame of any size, or a large
    reply could never be sent).

    ``asyncio.Queue`` allocates three deques and an event up front (about 2.5 KiB); this
    allocates its deque when a frame is queued and drops it when drained, so an idle
    subscriber costs less (docs/benchmarks.md). What the hub uses: ``put_nowait`` raises
    ``asyncio.QueueFull``, ``put`` waits for room, ``get_nowait`` raises
    ``asyncio.QueueEmpty``, ``close`` drops everything (an evicted peer's frames go at once)."""

    __slots__ = ("_items", "_putters", "bytes", "closed", "held", "max_bytes", "maxsize")

    def __init__(self, maxsize: int, max_bytes: int = 1 << 62, held: Held | None = None) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.held = held if held is not None else Held()
        self.bytes = 0
        self.closed = False
        self._items: collections.deque[str | None] | None = None
        self._putters: list[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return 0 if self._items is None else len(self._items)

    def fits(self, item: str | None, *, count_frames: bool = True) -> bool:
        if not self._items:
            return True
        if count_frames and len(self._items) >= self.maxsize:
            return False
        return self.bytes + frame_cost(item) <= self.max_bytes

    def put_nowait(self, item: str | None, *, count_frames: bool = True) -> None:
        """Queue ``item`` if it fits; ``count_frames=False``: bounded by bytes only."""
        if self.closed:
            return  # the peer was evicted: nothing more is sent to it
        if not self.fits(item, count_frames=count_frames):
            raise asyncio.QueueFull
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)
        cost = frame_cost(item)
        self.bytes += cost
        self.held.outbox += cost

    async def put(self, item: str | None) -> None:
        while not self.closed and not self.fits(item):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._putters is None:
                self._putters = []
            self._putters.append(waiter)
            try:
                await waiter
            finally:
                if self._putters is not None and waiter in self._putters:
                    self._putters.remove(waiter)
        self.put_nowait(item)

    def get_nowait(self) -> str | None:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        cost = frame_cost(item)
        self.bytes -= cost
        self.held.outbox -= cost
        if not self._items:
            self._items = None
        if self._putters:
            for waiter in self._putters:
                if not waiter.done():
                    waiter.set_result(None)
                    break
        return item

    def close(self) -> None:
        """Drop every queued frame and refuse new ones; waiting putters return."""
        self.closed = True
        self.held.outbox -= self.bytes
        self.bytes = 0
        self._items = None
        for waiter in self._putters or ():
            if not waiter.done():
                waiter.set_result(None)
