"""Following an event log in-process: the backlog from the store, then live events as
the bus rings. The hub's subscriptions are built on this."""

from __future__ import annotations

from collections.abc import AsyncIterator

from protocol import Event

from .store.base import Store

__all__ = ["follow"]


async def follow(
    store: Store, stream: str, after_seq: int = 0, *, epoch: str | None = None, batch: int = 500
) -> AsyncIterator[Event]:
    """Yield every event of ``stream`` after ``after_seq``, forever, gap-free and once each.

    Raises :class:`~protocol.errors.PositionLost` when the log cannot serve the position.
    An event committed while the backlog is being read is not missed: the bus remembers
    the highest seq it has seen, and waiting returns at once when that is past ours.
    """
    bus = store.bus
    seq = after_seq
    bus.follow(stream)
    try:
        while True:
            generation = bus.generation
            events = await store.read_events(stream, seq, batch, epoch=epoch)
            for event in events:
                if epoch is None:
                    epoch = event.epoch
                yield event
                seq = event.seq
            if len(events) < batch:
                await bus.wait(stream, seq, since=generation)
    finally:
        bus.unfollow(stream)
