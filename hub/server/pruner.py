"""The hub's background pruner of the event logs.

``sessionhub serve --retain-events 30d --retain-events-per-session 10000`` runs a
:class:`Retention` in the hub: every ``interval`` seconds it calls
:meth:`Store.prune_events <hub.store.base.Store.prune_events>` with the policy. Several
nodes on one database may all run it: each batch re-reads its stream under the stream's
write lock (SQLite's write lock, a Postgres row lock), so nodes pruning at once share the
work and never delete an event twice; no node is elected. Each pass then collects the
files nothing references any more (docs/files.md), as ``sessionhub gc`` does. See
docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry, Counter, Gauge

from protocol import SessionHubError

from ..retention import prune_cutoff
from ..store.base import PruneResult, Store

__all__ = ["Retention"]

log = logging.getLogger("sessionhub.retention")


class Retention:
    """The hub's pruner and its metrics: ``sessionhub_log_events`` (events held in every
    log, read at each scrape) and ``sessionhub_events_pruned_total`` (by this node)."""

    def __init__(
        self,
        store: Store,
        registry: CollectorRegistry,
        *,
        older_than: timedelta | None = None,
        keep_per_session: int | None = None,
        interval: float = 60.0,
        batch: int = 1000,
        file_grace: timedelta = timedelta(hours=1),
    ) -> None:
        self.store = store
        self.older_than = older_than
        self.keep_per_session = keep_per_session
        self.interval = interval
        self.batch = batch
        self.task: asyncio.Task[None] | None = None
        #: Completed passes (tests and /metrics readers wait on it rather than on the clock).
        self.passes = 0
        self.log_events = Gauge(
            "sessionhub_log_events", "Events held in the event logs of the store", registry=registry
        )
        self.pruned = Counter(
            "sessionhub_events_pruned", "Events pruned from the logs by this node", registry=registry
        )
        #: A file stored this recently stays, referenced or not (an upload awaits its message).
        self.file_grace = file_grace
        self.files_collected = Counter(
            "sessionhub_files_collected", "Unreferenced files deleted by this node", registry=registry
        )

    @property
    def active(self) -> bool:
        return self.older_than is not None or self.keep_per_session is not None

    def start(self) -> None:
        if self.active and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run(), name="retention")

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None

    async def run_once(self) -> PruneResult:
        result = await self.store.prune_events(
            older_than=prune_cutoff(self.older_than), keep_per_session=self.keep_per_session, batch=self.batch
        )
        self.pruned.inc(result.events)
        # Pruning may drop the last reference to a file (a deleted message's event): what
        # `sessionhub gc` collects goes in the same pass.
        gone = await self.store.collect_files(datetime.now(UTC) - self.file_grace)
        self.files_collected.inc(len(gone))
        self.passes += 1
        if result.events:
            log.info("pruned %d events from %d logs", result.events, result.streams)
        return result

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except SessionHubError as exc:  # the store is down for now: the next pass retries
                log.warning("pruning the event logs failed: %s", exc)
            await asyncio.sleep(self.interval)

    async def observe(self) -> None:
        """Refresh ``sessionhub_log_events`` (at each scrape: one small query)."""
        with contextlib.suppress(SessionHubError):
            self.log_events.set(await self.store.count_events())
