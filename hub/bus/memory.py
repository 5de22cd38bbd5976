"""The in-process doorbell, for one hub node."""

from __future__ import annotations

import asyncio

__all__ = ["MemoryBus"]


class MemoryBus:
    """Remembers the highest published seq per followed stream and wakes whoever waits for
    more.

    ``wait`` returns at once when a newer seq is already known, so a reader that drained
    the log and then waits cannot miss an event committed in between, provided it called
    :meth:`follow` before reading. Only followed (or waited-on) streams are remembered, so a
    node that has seen writes to millions of sessions holds only those it serves.
    """

    #: Never changes here: an in-process bus cannot miss a doorbell (see ``RemoteBus``).
    generation = 0

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._followers: dict[str, int] = {}
        self._count: dict[str, int] = {}  # waiters per stream

    def follow(self, stream: str) -> None:
        """Start remembering ``stream``'s doorbells (counted: call :meth:`unfollow` as often)."""
        self._followers[stream] = self._followers.get(stream, 0) + 1

    def unfollow(self, stream: str) -> None:
        left = self._followers.get(stream, 0) - 1
        if left > 0:
            self._followers[stream] = left
            return
        self._followers.pop(stream, None)
        if stream not in self._count:
            self._last.pop(stream, None)

    def publish(self, stream: str, seq: int) -> None:
        if stream not in self._followers and stream not in self._count:
            return  # nobody here reads it: nothing to remember
        if seq <= self._last.get(stream, 0):
            return
        self._last[stream] = seq
        waiter = self._waiters.pop(stream, None)
        if waiter is not None:
            waiter.set()

    def last_seq(self, stream: str) -> int:
        """The highest seq published here (0 when none was)."""
        return self._last.get(stream, 0)

    def waiting(self) -> list[str]:
        """The streams somebody follows or waits on right now."""
        return list(self._followers.keys() | self._count.keys())

    def wake_all(self) -> None:
        """Wake every waiter, whatever its stream (they re-read the log and wait again)."""
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.set()

    async def wait(
        self, stream: str, after_seq: int, timeout: float | None = None, *, since: int | None = None
    ) -> int:
        """Wait until a seq above ``after_seq`` is published; return the highest known.

        On timeout the highest known seq is returned, which may still be ``<= after_seq``;
        so does a wake-up by :meth:`wake_all`. ``since`` is the :attr:`generation` the
        caller read before it last read the log: when it differs, the caller may have
        missed a doorbell, and the call returns at once.
        """
        self._count[stream] = self._count.get(stream, 0) + 1
        try:
            while self._last.get(stream, 0) <= after_seq:
                if since is not None and since != self.generation:
                    break
                waiter = self._waiters.get(stream)
                if waiter is None:
                    waiter = self._waiters[stream] = asyncio.Event()
                try:
                    await asyncio.wait_for(waiter.wait(), timeout)
                except TimeoutError:
                    break
                if self._last.get(stream, 0) <= after_seq:
                    break  # woken without a newer seq: wake_all
            return self._last.get(stream, 0)
        finally:
            # Cancelled or done: the last waiter of a stream takes its Event (and, if nobody
            # follows the stream, its seq) with it.
            left = self._count[stream] - 1
            if left:
                self._count[stream] = left
            else:
                del self._count[stream]
                self._waiters.pop(stream, None)
                if stream not in self._followers:
                    self._last.pop(stream, None)
