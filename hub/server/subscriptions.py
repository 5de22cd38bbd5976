"""Following a stream: catching up from the log, going live on the tail, resets.

A subscription is a task while it catches up: it reads what the stream's tail no longer
holds from the log, in batches bounded by the connection's ``replay_bytes``, and sends
each frame with backpressure. Once it holds everything the tail has, it goes *live*: the
task ends and the tail pushes new frames straight into the connection's outbox (see
:mod:`hub.server.tails`); a live subscriber that falls behind gets a task again. A position
the log cannot serve (pruned, another epoch, the future) gets a ``reset`` frame.

A read of the log that fails (the database restarting, out of reach) is retried with
backoff for up to ``subscription_retry`` seconds; past that the subscription ends with an
``unsubscribed`` frame (code ``unavailable``) and the client subscribes again from the
last event it holds. It never just stops.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from protocol import PositionLost, SessionHubError, SessionNotFound, StoreClosed, StoreError
from protocol import frames as f
from protocol.codec import encode
from protocol.serverconn import StreamKey

from ..store.base import REGISTRY, session_stream
from .outbox import STR_HEADER, Evicted, frame_cost
from .socket_shell import Connection
from .tails import Live, Tail
from .wire import error_frame, event_frame

__all__ = ["subscribe", "unsubscribe"]

T = TypeVar("T")

#: The first pause before a failed read of the log is retried, and the longest.
RETRY_FIRST = 0.05
RETRY_MAX = 1.0


def subscribe(connection: Connection, request: f.Subscribe) -> None:
    """Start following ``request.session_id`` (None: the registry). Registered at once,
    in the reader, so that an ``unsubscribe`` read after it finds it."""
    key = request.session_id
    connection.unpark(key)  # a stale live registration (resubscribed) goes
    connection.hub.metrics.subscriptions.inc()
    connection.register(key, asyncio.get_running_loop().create_task(follow(connection, request)))


def unsubscribe(connection: Connection, request: f.Unsubscribe) -> None:
    connection.end_subscription(request.session_id)
    connection.spawn(connection.send(f.ReplyFrame(id=request.id, result=None)))


async def follow(connection: Connection, request: f.Subscribe) -> None:
    key = request.session_id
    stream = REGISTRY if key is None else session_stream(key)
    store = connection.hub.store
    try:
        tail = await patiently(connection, lambda: connection.hub.tails.acquire(stream))
    except StoreError as exc:
        await ended(connection, key, exc)
        return
    handed_over = False  # from here on, pump owns the tail (and releases it)
    try:
        try:
            # One read of the position at most: none at the live head (the tail vouches
            # for it), and the session's row only for an empty stream, to tell a session
            # that is not there from one with no events yet.
            position = tail.head(request.after_seq)
            if position is None:
                position = await patiently(connection, lambda: store.current_position(stream))
            if (
                key is not None
                and position.last_seq == 0
                and await patiently(connection, lambda: store.get_session(key)) is None
            ):
                raise SessionNotFound(key)
        except StoreError as exc:
            await ended(connection, key, exc)
            return
        except SessionHubError as exc:
            await connection.send(error_frame(request.id, exc))
            return
        # The reply, or a reset for a position the log cannot serve (protocol.serverconn).
        answer = connection.protocol.opened(request, position.epoch, position.first_seq, position.last_seq)
        await connection.send(answer.frame)
        if isinstance(answer.frame, f.ResetFrame):
            return
        seq = request.after_seq
        # An empty stream has no epoch yet: its first event brings it.
        epoch: str | None = position.epoch if position.last_seq > 0 else None
        if key is not None:
            connection.hub.presence.join(connection, key)
        handed_over = True
    except Evicted:
        return
    finally:
        if not handed_over:
            connection.hub.tails.release(tail)
    await pump(connection, key, stream, tail, seq, epoch, caught_up=False)


def resume(connection: Connection, key: StreamKey, stream: str, live: Live) -> None:
    """The tail could not deliver to this live subscriber (full queue, new epoch): it
    continues with a task of its own, with backpressure, from what it has."""
    if not connection.take_parked(key, live):
        return
    if connection.closed:
        connection.hub.tails.release(live.tail)
        connection.hub.metrics.subscriptions.dec()
        return
    task = asyncio.get_running_loop().create_task(
        pump(connection, key, stream, live.tail, live.seq, live.epoch, caught_up=True)
    )
    connection.register(key, task)


async def pump(
    connection: Connection,
    key: StreamKey,
    stream: str,
    tail: Tail,
    seq: int,
    epoch: str | None,
    *,
    caught_up: bool,
) -> None:
    store = connection.hub.store
    parked = False
    largest = tail.largest  # of the frames seen: sizes the next batch read from the log
    try:
        while True:
            waiter = tail.changed
            events = tail.after(seq)
            replaying = events is None
            if events is None:
                try:
                    size = batch_size(connection, tail, largest)
                    backlog = await patiently(
                        connection, functools.partial(store.read_events, stream, seq, size)
                    )
                except PositionLost as exc:
                    await reset(connection, key, seq, exc.epoch, exc.first_seq, exc.last_seq)
                    return
                events = [(e.seq, e.epoch, encode(event_frame(e)).decode()) for e in backlog]
                del backlog
                tail.backfill(events)  # the next subscriber from here reads memory, not the log
                largest = max((len(data) for _, _, data in events), default=largest)
                connection.hold_replay(sum(frame_cost(data) for _, _, data in events))
            if not events:
                if tail.last_seq <= seq:
                    if not caught_up and key is not None:
                        # Caught up: streams running now go out as their state so far.
                        caught_up = True
                        for data in connection.hub.streams.states(key):
                            connection.offer(data)
                    events = None  # hold no events while idle
                    if epoch is None:  # an empty stream: wait for its first event
                        await waiter.wait()
                        continue
                    # Go live and end this task: the tail delivers from now on, and
                    # starts a new task only if this subscriber falls behind.
                    connection.park(
                        key,
                        tail.go_live(
                            connection, seq, epoch, functools.partial(resume, connection, key, stream)
                        ),
                    )
                    parked = True
                    return
                continue
            sent = 0
            batch = collections.deque(events)
            events = None  # the deque holds what is not sent yet, and lets go of the rest
            try:
                while batch:
                    event_seq, event_epoch, data = batch.popleft()
                    if replaying:
                        connection.release_replay(frame_cost(data))
                    if epoch is None:
                        epoch = event_epoch
                    if event_epoch != epoch:
                        current = await patiently(
                            connection, functools.partial(store.stream_position, stream)
                        )
                        await reset(connection, key, seq, current.epoch, current.first_seq, current.last_seq)
                        return
                    await connection.send_text(data, reply=False)
                    sent += 1
                    seq = event_seq
            finally:
                connection.hub.metrics.delivered.inc(sent)  # once per batch: the counter takes a lock
                if replaying and batch:
                    connection.release_replay(sum(frame_cost(data) for _, _, data in batch))
                batch.clear()
    except Evicted:
        return
    except StoreError as exc:
        await ended(connection, key, exc)
    finally:
        if not parked:
            connection.hub.tails.release(tail)


async def patiently(connection: Connection, read: Callable[[], Awaitable[T]]) -> T:
    """``read()``, retried with backoff while the store fails, for at most the hub's
    ``subscription_retry`` seconds (reads change nothing: a retry is always safe)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + connection.hub.config.subscription_retry
    pause = RETRY_FIRST
    while True:
        try:
            return await read()
        except StoreClosed:
            raise
        except StoreError:
            if connection.closed or loop.time() + pause > deadline:
                raise
        await asyncio.sleep(pause)
        pause = min(2 * pause, RETRY_MAX)


async def ended(connection: Connection, key: StreamKey, exc: StoreError) -> None:
    """Tell the client its subscription ended because the log could not be read: it
    subscribes again from where it is."""
    # A closed store is the hub shutting down: "unavailable" too, as for its requests.
    code = "unavailable" if isinstance(exc, StoreClosed) else exc.code
    if code not in f.ERROR_CODES:
        code = "internal"
    with contextlib.suppress(Evicted):
        await connection.send(
            f.UnsubscribedFrame(
                session_id=key,
                code=code,  # type: ignore[arg-type]
                message=f"the subscription ended: {exc}; subscribe again from your last event",
            )
        )


def batch_size(connection: Connection, tail: Tail, largest: int) -> int:
    """How many events to read from the log: what fits in the connection's
    ``replay_bytes`` left, judged by the largest frame seen, at least one (progress),
    at most ``backlog_batch``; a few while nothing is known of the stream's sizes."""
    config = connection.hub.config
    if largest <= 0:
        return min(config.backlog_batch, 8)
    room = config.replay_bytes - connection.replay
    return max(1, min(config.backlog_batch, room // (largest + STR_HEADER)))


async def reset(connection: Connection, key: StreamKey, seq: int, epoch: str, first: int, last: int) -> None:
    await connection.send(connection.protocol.reset(key, seq, epoch, first, last).frame)
