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
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random

from .doorbell import stream_hash
from .memory import MemoryBus

__all__ = ["RemoteBus"]

log = logging.getLogger("sessionhub.bus")


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
        self._task: asyncio.Task[None] | None = None
        self._closing = False

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
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=type(self).__name__)

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._connected.clear()
        await self._disconnect()
        self.wake_all()

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
            while not self._closing:
                try:
                    await asyncio.wait_for(self._connect(), 10.0)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning(
                        "%s: reconnect failed (%s); retrying in %.2fs", type(self).__name__, exc, delay
                    )
                    await self._disconnect()
                    await asyncio.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, self.max_backoff)
            self.reconnects += 1
            self.generation += 1
            self._connected.set()
            self.wake_all()
            log.info("%s listening again (generation %d)", type(self).__name__, self.generation)

    @abc.abstractmethod
    async def _connect(self) -> None:
        """Open the connection(s) and start listening; doorbells go to :meth:`heard`."""

    @abc.abstractmethod
    async def _listen(self) -> None:
        """Run until the connection is lost (raise) or closed."""

    @abc.abstractmethod
    async def _disconnect(self) -> None:
        """Drop the connection(s); must not raise."""
