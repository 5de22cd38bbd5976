"""Stream tails: each followed stream's newest events, read once from the log for all its subscribers."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from protocol import PositionLost, StoreError
from protocol.codec import encode

from ..store.base import Store, StreamPosition
from .outbox import Held, frame_cost
from .wire import event_frame
from .wsframes import text_frame

log = logging.getLogger("sessionhub.server")


class Receiver(Protocol):
    """A live subscriber's connection, as the tail sees it: an outbox to put frames in."""

    def try_put(self, data: str, frame: bytes | None = None) -> bool:
        """Queue a frame if there is room right now; False: it was not queued. ``frame``:
        the same, framed as a WebSocket text frame once for every subscriber."""
        ...

    def try_write(self, frames: bytes) -> bool:
        """Write one or more framed events straight to the socket if nothing waits before
        them; False: nothing was written."""
        ...


@dataclass(slots=True)
class Live:
    """A caught-up subscriber the tail pushes to directly. It has no task of its own while
    live (an idle subscriber costs memory, not a task); ``resume`` starts one when the
    subscriber must continue on its own."""

    connection: Receiver
    tail: Tail
    seq: int
    epoch: str
    resume: Callable[[Live], None]


#: How long a push writes before it lets the loop run (appends, replies, pings), in
#: seconds; the clock is read every ``PUSH_CHUNK`` subscribers. Letting the writer's next
#: append in sooner is also what lets events gather for one write per socket: at 1,000
#: subscribers the burst's deliveries/s went from 0.93x to 3.5-4x the ``websockets``
#: broadcast (docs/benchmarks.md, session 12).
PUSH_SLICE = 0.0005
PUSH_CHUNK = 16
#: The most bytes of frames joined for one write. Past it a subscriber gets them one by
#: one, each write checked against the transport's high-water mark, so a batch of large
#: events never lands in a socket's buffer whole.
JOIN_BYTES = 64 << 10

#: One cached event: its seq, its epoch and its encoded frame (the only large part; the
#: tail keeps no decoded Event, which would cost as much again).
Entry = tuple[int, str, str]


class Tail:
    """The newest events of one stream, read once from the log for all its subscribers.

    Subscribers that have caught up are *live*: the tail puts each new frame straight into
    their queues (no task wakes per subscriber per event). One whose queue is full, or that
    meets an epoch change, is woken to continue on its own, with backpressure.

    The cache is bounded in events (``size``) and in bytes (``max_bytes``, and the hub's
    ``tail_bytes_total`` through :class:`Tails`): what falls out is read from the log by
    whoever is behind it. What a catching-up subscriber reads from the log right before the
    cache joins it (:meth:`backfill`), so the next subscriber from the same position is
    served from memory.

    A subscriber at the live head is answered by :meth:`head`, without reading the store,
    while the tail's own view of the log is current (see there)."""

    def __init__(self, store: Store, stream: str, size: int, max_bytes: int = 1 << 62) -> None:
        self.store = store
        self.stream = stream
        self.size = size
        self.max_bytes = max_bytes
        self.entries: collections.deque[Entry] = collections.deque()
        self.bytes = 0
        #: The largest frame this tail has read: how catching-up subscribers size a batch.
        self.largest = 0
        self.last_seq = 0
        #: The log's epoch and first seq as of the tail's last read (what ``head`` tells).
        self.epoch = ""
        self.first_seq = 1
        #: Whether the tail's last read of the log succeeded; whether it knows the epoch
        #: and first seq (events of a new epoch leave the first seq unknown); and the bus
        #: generation read before that read. ``head`` trusts only a current view.
        self.ok = False
        self.known = False
        self.generation = -1
        self.changed = asyncio.Event()
        self.users = 0
        self.task: asyncio.Task[None] | None = None
        self.live: dict[int, Live] = {}
        self.on_delivered: Callable[[int], None] = lambda n: None
        #: Called with the change in cached bytes and the number of entries dropped.
        self.on_resized: Callable[[Tail, int, int], None] = lambda tail, delta, dropped: None

    async def start(self) -> None:
        bus = self.store.bus
        bus.follow(self.stream)
        try:
            generation = bus.generation
            position = await self.store.current_position(self.stream)
        except BaseException:
            bus.unfollow(self.stream)
            raise
        self._at(position.epoch, position.first_seq, position.last_seq, generation)
        self.task = asyncio.get_running_loop().create_task(self._run(generation), name=f"tail {self.stream}")

    async def _run(self, generation: int) -> None:
        try:
            await self._follow(generation)
        finally:
            self.store.bus.unfollow(self.stream)
            self.clear()

    async def _follow(self, generation: int) -> None:
        bus = self.store.bus
        while True:
            # ``since``: a bus that reconnected after our last read may have missed a doorbell.
            await bus.wait(self.stream, self.last_seq, since=generation)
            generation = bus.generation
            try:
                events = self.store.read_events_nowait(self.stream, self.last_seq, 1000)
                if events is None:
                    events = await self.store.read_events(self.stream, self.last_seq, 1000)
            except PositionLost as exc:
                # Pruned or re-epoched under us: start over at the log's end; subscribers
                # notice the gap or the epoch and get a reset.
                self.clear()
                self._at(exc.epoch, exc.first_seq, exc.last_seq, generation)
                events = []
            except StoreError as exc:  # the database out of reach: the store logs the outage once
                self.ok = False
                log.debug("reading the log of %s failed (%s); retrying", self.stream, exc)
                await asyncio.sleep(0.5)
                continue
            except Exception:
                self.ok = False
                log.exception("reading the log of %s failed; retrying", self.stream)
                await asyncio.sleep(0.5)
                continue
            else:
                self.ok = True
                self.generation = generation
                if events:
                    newest = events[-1].epoch
                    # Events of another epoch than the tail knew (the log was rebuilt with
                    # more events than we had): its first seq is unknown until a read says.
                    self.known = self.known and (self.last_seq == 0 or newest == self.epoch)
                    self.epoch = newest
            if events:
                entries = [(e.seq, e.epoch, encode(event_frame(e)).decode()) for e in events]
                del events  # the decoded events are not kept: the frames are what is sent
                added = 0
                for entry in entries:
                    added += frame_cost(entry[2])
                    self.largest = max(self.largest, len(entry[2]))
                self.entries.extend(entries)
                self.bytes += added
                self.last_seq = entries[-1][0]
                self.trim(self.max_bytes, added)
                await self._push(entries)
            waiter, self.changed = self.changed, asyncio.Event()
            waiter.set()

    def _at(self, epoch: str, first_seq: int, last_seq: int, generation: int) -> None:
        """The log stands at this position, read after the bus's ``generation``."""
        self.epoch, self.first_seq, self.last_seq = epoch, first_seq, last_seq
        self.generation = generation
        self.ok = self.known = True

    def head(self, after_seq: int) -> StreamPosition | None:
        """The stream's position for a subscriber at the live head (``after_seq`` is the
        tail's ``last_seq``), without reading the store; None when the tail cannot vouch
        for it and the caller must read: the tail's task is not running, its last read of
        the log failed or left the epoch unknown, or the bus reconnected since that read
        (doorbells may have been missed, so the log may be ahead of the tail).

        A position vouched for may still trail a commit whose doorbell the tail has not
        handled yet: that is safe, as the subscriber goes live at ``last_seq`` and the tail
        pushes everything after it, once."""
        task = self.task
        if (
            task is None
            or task.done()
            or not (self.ok and self.known)
            or after_seq != self.last_seq
            or self.generation != self.store.bus.generation
        ):
            return None
        return StreamPosition(
            stream=self.stream, epoch=self.epoch, first_seq=self.first_seq, last_seq=self.last_seq
        )

    def backfill(self, entries: list[Entry]) -> None:
        """Keep what a subscriber just read from the log (``entries``: contiguous, oldest
        first) if it ends right where the cache begins (or, with nothing cached, at
        ``last_seq``) in the cache's epoch, as far as ``size`` and ``max_bytes`` allow,
        the newest first: many subscribers from the same position (a dashboard's page
        load, a reconnect wave) then read the log once, not once each."""
        cache = self.entries
        if not entries:
            return
        last_seq, epoch = entries[-1][0], entries[-1][1]
        joins = cache[0][0] - 1 if cache else self.last_seq
        if last_seq != joins or epoch != (cache[0][1] if cache else self.epoch) or not self.known:
            return
        if entries[0][0] + len(entries) - 1 != last_seq:
            return  # not contiguous: nothing is cached rather than a gap
        added = 0
        for entry in reversed(entries):
            cost = frame_cost(entry[2])
            if len(cache) >= self.size or self.bytes + cost > self.max_bytes or entry[1] != epoch:
                break
            cache.appendleft(entry)
            self.bytes += cost
            added += cost
            self.largest = max(self.largest, len(entry[2]))
        if added:
            self.on_resized(self, added, 0)

    def trim(self, max_bytes: int, added: int = 0) -> None:
        """Drop the oldest entries until the cache is within ``size`` and ``max_bytes``."""
        delta, dropped = added, 0
        entries = self.entries
        while entries and (len(entries) > self.size or self.bytes > max_bytes):
            cost = frame_cost(entries.popleft()[2])
            self.bytes -= cost
            delta -= cost
            dropped += 1
        if delta or dropped:
            self.on_resized(self, delta, dropped)

    def clear(self) -> None:
        dropped = len(self.entries)
        freed = self.bytes
        self.entries.clear()
        self.bytes = 0
        if freed or dropped:
            self.on_resized(self, -freed, 0)

    async def _push(self, entries: list[Entry]) -> None:
        """Deliver ``entries`` (new, contiguous) to every live subscriber, in slices of
        about ``PUSH_SLICE`` seconds with the loop let go in between.

        Each event is framed once, its bytes shared by every subscriber's socket (issue 28:
        the encode and the framing were per subscriber, as ``websockets.broadcast`` avoids).
        A subscriber owed several events gets them in one write: under load (events
        committed while a push is under way, which the loop's turns between slices let
        happen) the next push carries them all, one syscall per socket instead of one per
        event; at 19,000 subscribers a push no longer holds the loop for ~95 ms."""
        if not self.live:
            return
        framed = [(seq, epoch, data, text_frame(data.encode())) for seq, epoch, data in entries]
        first, n = framed[0][0], len(framed)
        # One epoch and no gap in seq (always, but for a log re-epoched under the tail):
        # a subscriber's place in the batch is then an index, not a scan.
        uniform = framed[0][1] if all(f[1] == framed[0][1] for f in framed) else None
        if framed[-1][0] - first != n - 1:
            uniform = None
        joined: dict[int, bytes] = {}  # the frames from index i on, written as one
        # Bytes of frames from index i on (a joined write stays within JOIN_BYTES); only a
        # batch of several events is ever joined.
        tail_bytes = [0] * n
        if n > 1 and uniform is not None:
            tail_bytes = list(itertools.accumulate(reversed([len(f[3]) for f in framed])))[::-1]
        delivered = 0
        pending = list(self.live.items())
        clock = time.perf_counter
        until = clock() + PUSH_SLICE
        for start in range(0, len(pending), PUSH_CHUNK):
            if start and clock() >= until:
                self.on_delivered(delivered)
                delivered = 0
                await asyncio.sleep(0)  # let appends, replies and pings in between slices
                until = clock() + PUSH_SLICE
            for key, live in pending[start : start + PUSH_CHUNK]:
                if self.live.get(key) is not live:
                    continue  # left or was resumed while the loop was let go
                todo = framed
                if uniform is not None:
                    i = max(0, live.seq + 1 - first)
                    if i >= n:
                        continue
                    if i < n - 1 and uniform == live.epoch and tail_bytes[i] <= JOIN_BYTES:
                        frames = joined.get(i)
                        if frames is None:
                            frames = joined[i] = b"".join(f[3] for f in framed[i:])
                        if live.connection.try_write(frames):
                            delivered += n - i
                            live.seq = framed[-1][0]
                            continue
                    todo = framed[i:] if i else framed
                for seq, epoch, data, frame in todo:
                    if seq <= live.seq:
                        continue
                    if epoch != live.epoch or not live.connection.try_put(data, frame):
                        del self.live[key]
                        live.resume(live)
                        break
                    live.seq = seq
                    delivered += 1
        if delivered:
            self.on_delivered(delivered)

    def go_live(self, connection: Receiver, seq: int, epoch: str, resume: Callable[[Live], None]) -> Live:
        """Register a subscriber that holds everything up to ``seq`` (== ``last_seq``)."""
        live = Live(connection, self, seq, epoch, resume)
        self.live[id(live)] = live
        return live

    def leave(self, live: Live) -> None:
        self.live.pop(id(live), None)

    def after(self, seq: int) -> list[Entry] | None:
        """Entries after ``seq`` if this tail holds all of them, else None. The deque is
        contiguous in seq, so this is a slice, not a scan."""
        if seq >= self.last_seq:
            return []
        if not self.entries:
            return None
        first = self.entries[0][0]
        if seq + 1 < first:
            return None
        return list(itertools.islice(self.entries, seq + 1 - first, None))


class Tails:
    """The tails of the followed streams, and their bytes across the hub."""

    def __init__(
        self,
        store: Store,
        size: int,
        max_bytes: int = 1 << 62,
        max_total: int = 1 << 62,
        held: Held | None = None,
    ) -> None:
        self.store = store
        self.size = size
        self.max_bytes = max_bytes
        self.max_total = max_total
        self.held = held if held is not None else Held()
        self._tails: dict[str, Tail] = {}
        self._lock = asyncio.Lock()
        self.on_delivered: Callable[[int], None] = lambda n: None
        self.on_dropped: Callable[[int], None] = lambda n: None

    async def acquire(self, stream: str) -> Tail:
        async with self._lock:
            tail = self._tails.get(stream)
            if tail is None:
                tail = Tail(self.store, stream, self.size, self.max_bytes)
                tail.on_delivered = self.on_delivered
                tail.on_resized = self._resized
                await tail.start()
                self._tails[stream] = tail
            tail.users += 1
            return tail

    def _resized(self, tail: Tail, delta: int, dropped: int) -> None:
        self.held.tail += delta
        if dropped:
            self.on_dropped(dropped)
        if delta > 0 and self.held.tail > self.max_total:
            self._shrink()

    def _shrink(self) -> None:
        """Over ``tail_bytes_total``: halve the largest caches until the hub is 10 % under
        it, so that the scan over tails runs once per many events, not on every one."""
        goal = self.max_total * 9 // 10
        while self.held.tail > goal:
            largest = max(self._tails.values(), key=lambda t: t.bytes, default=None)
            if largest is None or largest.bytes == 0:
                return
            largest.trim(min(largest.bytes // 2, largest.bytes - (self.held.tail - goal)))

    def release(self, tail: Tail) -> None:
        tail.users -= 1
        if tail.users == 0 and self._tails.get(tail.stream) is tail:
            del self._tails[tail.stream]
            if tail.task is not None:
                tail.task.cancel()
            else:
                tail.clear()

    async def close(self) -> None:
        for tail in list(self._tails.values()):
            if tail.task is not None:
                tail.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tail.task
        self._tails.clear()
