"""What every cross-node bus shares: a local :class:`MemoryBus` fed by a remote listener,
and the rules that keep a lost connection from losing an event.

Doorbells are hints. The log is the truth, and every follower reads it by seq, so a
doorbell heard twice costs one empty read and never a duplicate. A doorbell *not* heard
is the danger: while the listener is down, commits on other nodes ring nobody. Three
rules cover it:

- While disconnected, :meth:`wait` returns every ``poll_interval`` seconds, so followers
  poll the log (slower, never stuck).
- When the listener is back, :attr:`generation` goes up and every waiter is woken: each
  re-reads the log, which now holds whatever was committed while nobody listened.
- A follower that read the log *before* the reconnection but reaches :meth:`wait` only
  after it passes the ``generation`` it saw before that read; the mismatch makes ``wait``
  return at once, and it reads again.

Besides doorbells, a remote bus *relays* what lives only in memory (a streamed message's
deltas) to the other nodes: best effort and in order, with no log behind it. What a relay
loses the log still ends right (the stream's end is a logged event).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import logging
import random
import uuid
from collections.abc import Callable

from .doorbell import stream_hash
from .memory import MemoryBus

__all__ = ["RemoteBus", "stop"]

log = logging.getLogger("sessionhub.bus")


async def stop(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it to end. On Python 3.11 a cancellation that lands
    while an ``asyncio.timeout`` expires turns into a TimeoutError, which a client library
    may swallow (redis-py's ``get_message(timeout=...)`` does, and returns None): the task
    then runs on. So cancel until it has ended; the loops also check ``_closing``."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=0.5)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()


class RemoteBus(MemoryBus, abc.ABC):
    """A bus whose doorbells also come from other nodes. ``await start()`` before use
    (it returns once the first connection listens), ``await close()`` at the end."""

    def __init__(self, *, poll_interval: float = 1.0, max_backoff: float = 5.0) -> None:
        super().__init__()
        self.generation = 0
        self.poll_interval = poll_interval
        self.max_backoff = max_backoff
        #: Times the listener was re-established after a loss.
        self.reconnects = 0
        self._connected = asyncio.Event()
        self._retry_now = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: This process, so that it can skip its own relayed messages.
        self.node_id = uuid.uuid4().hex[:16]
        #: Called with ``(node_id, message)`` for each message another node relays.
        self.on_relay: Callable[[str, str], None] | None = None
        #: Relayed messages dropped: sending failed, or the backlog overflowed.
        self.relay_dropped = 0
        self._relay_out: collections.deque[str] = collections.deque()
        self._relay_ready = asyncio.Event()
        self._relay_idle = asyncio.Event()
        self._relay_idle.set()
        self._relay_task: asyncio.Task[None] | None = None
        self._relay_count = 0
        self._partial: dict[str, tuple[int, list[str]]] = {}

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self, timeout: float = 10.0) -> None:
        """Connect and listen; raises the connection error if the first attempt fails."""
        try:
            await asyncio.wait_for(self._connect(), timeout)
        except BaseException:
            await self._disconnect()
            raise
        self._connected.set()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._supervise(), name=type(self).__name__)
        self._relay_task = loop.create_task(self._send_relayed(), name=f"{type(self).__name__} relay")

    async def close(self) -> None:
        if self._relay_task is not None:
            # What was relayed last (a node's goodbye) should still leave.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._relay_idle.wait(), 1.0)
        self._closing = True
        for task in (self._task, self._relay_task):
            if task is not None:
                await stop(task)
        self._connected.clear()
        await self._disconnect()
        self.wake_all()

    def retry_soon(self) -> None:
        """The server is back (the store's writes work again): a reconnect waiting out its
        backoff tries now, so the node is not reported degraded for seconds after it works."""
        if not self.connected:
            self._retry_now.set()

    async def wait(
        self, stream: str, after_seq: int, timeout: float | None = None, *, since: int | None = None
    ) -> int:
        if not self.connected:
            timeout = self.poll_interval if timeout is None else min(timeout, self.poll_interval)
        return await super().wait(stream, after_seq, timeout, since=since)

    def heard(self, stream: str, seq: int) -> None:
        """A doorbell from the remote side (``stream`` may be a ``#hash``, see doorbell)."""
        # Local only: a doorbell heard from the bus must not be sent back to it.
        if stream.startswith("#"):
            for name in self.waiting():
                if stream_hash(name) == stream:
                    MemoryBus.publish(self, name, seq)
            return
        MemoryBus.publish(self, stream, seq)

    async def _supervise(self) -> None:
        while not self._closing:
            try:
                await self._listen()
                lost: BaseException | None = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                lost = exc
            if self._closing:
                return
            self._connected.clear()
            log.warning("%s lost its connection (%s); reconnecting", type(self).__name__, lost)
            self.wake_all()  # start polling now rather than at the next poll tick
            await self._disconnect()
            delay = 0.05
            level = logging.WARNING  # the first failed attempt says so; the rest are expected
            while not self._closing:
                try:
                    await asyncio.wait_for(self._connect(), 10.0)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.log(
                        level, "%s: reconnect failed (%s); retrying in %.2fs", type(self).__name__, exc, delay
                    )
                    level = logging.DEBUG
                    await self._disconnect()
                    self._retry_now.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._retry_now.wait(), delay * (0.5 + random.random()))
                    delay = min(delay * 2, self.max_backoff)
            self.reconnects += 1
            self.generation += 1
            self._connected.set()
            self.wake_all()
            log.info("%s listening again (generation %d)", type(self).__name__, self.generation)

    # -- relaying ------------------------------------------------------------------------
    #: Largest relayed message piece in bytes (Postgres NOTIFY: under 8,000 with the header).
    relay_chunk = 1 << 24
    #: Messages kept while sending lags; older ones are dropped beyond this.
    relay_backlog = 10_000

    def relay(self, data: str) -> None:
        """Send ``data`` to every other node's :attr:`on_relay`: best effort, in order."""
        if len(self._relay_out) >= self.relay_backlog:
            self._relay_out.popleft()
            self.relay_dropped += 1
        self._relay_out.append(data)
        self._relay_ready.set()
        self._relay_idle.clear()

    def _pieces(self, data: str) -> list[str]:
        """``data`` as wire payloads: ``"<node> <number> <i> <count> <piece>"``."""
        self._relay_count += 1
        raw = data.encode()
        room = self.relay_chunk - 64
        chunks: list[str] = []
        start = 0
        while start < len(raw) or not chunks:
            cut = min(len(raw), start + room)
            while cut < len(raw) and (raw[cut] & 0xC0) == 0x80:
                cut -= 1  # never split a UTF-8 sequence
            chunks.append(raw[start:cut].decode())
            start = cut
        n = self._relay_count
        return [f"{self.node_id} {n} {i} {len(chunks)} {chunk}" for i, chunk in enumerate(chunks)]

    def relayed(self, payload: str) -> None:
        """A relayed piece from the wire: deliver whole messages from other nodes."""
        try:
            node, n, i, count, piece = payload.split(" ", 4)
            number, index, total = int(n), int(i), int(count)
        except ValueError:
            log.warning("ignoring a foreign relay payload")
            return
        if node == self.node_id or self.on_relay is None:
            return
        if total == 1:
            self.on_relay(node, piece)
            return
        current = self._partial.get(node)
        if index == 0 or current is None or current[0] != number or len(current[1]) != index:
            # A piece went missing (or this is the first): start over from piece 0.
            current = (number, []) if index == 0 else None
        if current is None:
            self._partial.pop(node, None)
            return
        current[1].append(piece)
        if len(current[1]) == total:
            self._partial.pop(node, None)
            self.on_relay(node, "".join(current[1]))
        else:
            self._partial[node] = current

    async def _send_relayed(self) -> None:
        while True:
            await self._relay_ready.wait()
            self._relay_ready.clear()
            batch = list(self._relay_out)
            self._relay_out.clear()
            payloads = [piece for data in batch for piece in self._pieces(data)]
            try:
                await self._send_relay(payloads)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.relay_dropped += len(batch)
                log.warning("%s: relaying %d messages failed (%s)", type(self).__name__, len(batch), exc)
                await asyncio.sleep(0.05)
            if not self._relay_out:
                self._relay_idle.set()

    @abc.abstractmethod
    async def _send_relay(self, payloads: list[str]) -> None:
        """Send relay payloads, in order."""

    @abc.abstractmethod
    async def _connect(self) -> None:
        """Open the connection(s) and start listening; doorbells go to :meth:`heard`."""

    @abc.abstractmethod
    async def _listen(self) -> None:
        """Run until the connection is lost (raise) or closed."""

    @abc.abstractmethod
    async def _disconnect(self) -> None:
        """Drop the connection(s); must not raise."""
