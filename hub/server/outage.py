"""A node that cannot reach its database sends its clients elsewhere.

Requests already get ``unavailable`` within the store's timeouts, but a client connected to
a node cut off from its database (a partition: the other nodes are fine) would go on
asking that node. :class:`StoreWatch` reads the store every ``interval`` seconds (the read
``/healthz`` does); once every read for ``close_after`` seconds has failed or not answered,
it closes every WebSocket with **1013** (try again later) and, until a read succeeds again,
accepts new ones only to close them the same way, as a draining node does with 1001. A
client reconnects, through its balancer, to a node that can. See docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection
from typing import Protocol

from protocol import StoreError

from ..store.base import Store

__all__ = ["CLOSE_TRY_AGAIN_LATER", "OUTAGE_REASON", "StoreWatch"]

log = logging.getLogger("sessionhub.server")

CLOSE_TRY_AGAIN_LATER = 1013
OUTAGE_REASON = "the hub cannot reach its database; reconnect elsewhere"


class _Closable(Protocol):
    async def close(self, code: int, reason: str) -> None: ...


class StoreWatch:
    """``down`` is True from the moment the store has failed for ``close_after`` seconds
    until a read succeeds. ``close_after=None``: never close (the watch does not run)."""

    def __init__(
        self,
        store: Store,
        connections: Collection[_Closable],
        close_after: float | None,
        interval: float = 1.0,
    ) -> None:
        self.store = store
        #: The hub's live set of connections.
        self.connections = connections
        self.close_after = close_after
        self.interval = interval
        self.down = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.close_after is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        assert self.close_after is not None
        loop = asyncio.get_running_loop()
        failing_since: float | None = None
        while True:
            started = loop.time()
            try:
                # A read that does not answer counts as failed once it is as late as that.
                async with asyncio.timeout(self.close_after):
                    await self.store.get_session("")
            except (StoreError, TimeoutError) as exc:
                failing_since = started if failing_since is None else failing_since
                if not self.down and loop.time() - failing_since >= self.close_after:
                    self.down = True
                    log.warning(
                        "the store has failed for %.0f s (%s): closing %d connections with %d",
                        loop.time() - failing_since,
                        type(exc).__name__,
                        len(self.connections),
                        CLOSE_TRY_AGAIN_LATER,
                    )
                    await self._close_all()
            else:
                if self.down:
                    log.warning("the store answers again: accepting connections")
                failing_since, self.down = None, False
            await asyncio.sleep(self.interval)

    async def _close_all(self) -> None:
        await asyncio.gather(
            *(c.close(CLOSE_TRY_AGAIN_LATER, OUTAGE_REASON) for c in list(self.connections)),
            return_exceptions=True,
        )
