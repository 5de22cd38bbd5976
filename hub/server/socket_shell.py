"""The I/O shell of one client socket: it reads frames, hands them to the connection's
sans-I/O state (:class:`protocol.serverconn.ServerConnection`, which decides) and performs
what comes back (sends, closes, the expiry timer, presence, subscription tasks). It owns
the outgoing queue and its drainer, the subscription tasks and live tail registrations,
the requests in flight and the bytes held for the peer. Other modules change a
connection only through its methods (tests/project/test_connection_writes.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Iterable
from typing import Any

from starlette.websockets import WebSocket

from protocol import frames as f
from protocol.codec import encode
from protocol.serverconn import (
    CLOSE_TOKEN_EXPIRED,
    ArmExpiry,
    Close,
    EndSubscription,
    Join,
    Leave,
    Reannounce,
    Refused,
    Resume,
    Send,
    ServerConnection,
    ServerEffect,
    StreamKey,
)

from ..auth import Grant
from .asgiscope import RAW_SEND, TRANSPORT, WRITE_FRAME, Cuttable
from .eager import start_eagerly
from .host import ConnectionHost
from .outbox import Evicted, Outbox, frame_cost
from .tails import Live

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_SLOW_CONSUMER",
    "CLOSE_TOKEN_EXPIRED",
    "CLOSE_UNSUPPORTED",
    "RAW_SEND",
    "TRANSPORT",
    "Connection",
    "ConnectionHost",
    "start_eagerly",
]

log = logging.getLogger("sessionhub.server")

#: Close code for a subscriber evicted because it does not read fast enough.
CLOSE_SLOW_CONSUMER = 4008
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


class Connection:
    """One client socket: a bounded outgoing queue, drained by a task that runs only while
    frames wait (an idle connection keeps no writer task)."""

    # Slots: a hub holds thousands of these; an attribute dict would cost ~1 KiB each.
    __slots__ = (
        "closed",
        "closer",
        "closing_output",
        "connection_id",
        "drainer",
        "dump_import",
        "expiry",
        "hub",
        "parked",
        "protocol",
        "queue",
        "replay",
        "requests",
        "room",
        "serve_task",
        "subscriptions",
        "waiting",
        "websocket",
    )

    def __init__(self, hub: ConnectionHost, websocket: WebSocket) -> None:
        self.hub = hub
        self.websocket = websocket
        config = hub.config
        tokens = hub.tokens
        #: The protocol state: who the peer is, its grant, its subscriptions, its requests
        #: in flight. Read freely; changed only by this shell, through its methods.
        self.protocol: ServerConnection[Grant] = ServerConnection(
            max_frame_bytes=config.max_frame_bytes,
            max_subscriptions=config.max_subscriptions,
            max_in_flight=config.max_in_flight,
            verify=None if tokens is None else tokens.verify,
        )
        self.queue = Outbox(hub.config.queue_frames, hub.config.outbox_bytes, hub.held)
        # Empty sets cost ~200 bytes each; thousands of idle connections have none of these
        # in use, so they start as the shared empty frozenset and become sets when needed.
        self.requests: set[asyncio.Task[None]] | frozenset[asyncio.Task[None]] = frozenset()
        self.subscriptions: dict[StreamKey, asyncio.Task[None]] = {}
        self.parked: dict[StreamKey, Live] = {}  # live subscriptions, whose task has ended
        self.closed = False
        self.serve_task: asyncio.Task[Any] | None = None
        self.drainer: asyncio.Task[None] | None = None
        self.closing_output = False
        self.expiry: asyncio.TimerHandle | None = None  # ticks the protocol at the grant's exp
        # 48 random bits name a connection (presence, logs) within one hub; uuid4 (16
        # random bytes, a UUID object, then its hex cut to 12) cost several times as much.
        self.connection_id = os.urandom(6).hex()
        self.waiting = 0  # bytes of replies waiting for room in the outbox
        self.replay = 0  # bytes of backlog batches read for catching-up subscriptions
        #: Set while the reader waits for requests in flight to drop below the bound.
        self.room: asyncio.Future[None] | None = None
        #: Sends the close frame (or cuts the peer off); the app must not end before it.
        self.closer: asyncio.Task[None] | None = None
        #: An ``import`` in progress on this socket (hub/server/ops.py), gone with it.
        self.dump_import: Any = None

    # -- what the protocol state knows, read through (ports.Peer) ---------------------------

    @property
    def name(self) -> str | None:
        return self.protocol.name

    @property
    def role(self) -> str | None:
        return self.protocol.role

    @property
    def announced(self) -> frozenset[str]:
        """Sessions declared with ``hello``."""
        return self.protocol.announced

    @property
    def summarizer(self) -> bool:
        """Declared with ``hello``: this peer writes summaries."""
        return self.protocol.summarizer

    @property
    def presence_watch(self) -> frozenset[str]:
        """Sessions whose joins and leaves a subscription asked for."""
        return self.protocol.presence_watch

    @property
    def grant(self) -> Grant | None:
        return self.protocol.grant

    def entry(self) -> dict[str, Any]:
        return {"connection_id": self.connection_id, "name": self.name, "role": self.role}

    @property
    def unsent(self) -> int:
        """Bytes held for this peer: its outbox, replies waiting for room, replay batches."""
        return self.queue.bytes + self.waiting + self.replay

    async def send(self, frame: Any) -> None:
        """Queue a frame; if the queue stays full past the send timeout, evict the peer."""
        await self.send_text(encode(frame).decode())

    def try_put(self, data: str, frame: bytes | None = None) -> bool:
        """Queue a frame if there is room right now. ``frame``: the same event framed
        already, shared by every subscriber: written straight to the socket when nothing
        waits before it (no outbox, no drainer, no ASGI message; docs/benchmarks.md)."""
        if self.closed:
            return False
        if frame is not None and self.try_write(frame):
            return True
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            return False
        self._queued()
        return True

    def try_write(self, frames: bytes) -> bool:
        """Write ``frames`` (one or more text frames framed already, shared by every
        subscriber) straight to the socket if nothing waits before them: no outbox entry
        (not even the close), no drainer mid-send, the transport below its high-water mark.
        False: nothing was written; the caller queues them the ordinary way."""
        if self.closed or self.closing_output or self.queue.qsize():
            return False
        drainer = self.drainer
        if drainer is not None and not drainer.done():
            return False
        write = self.websocket.scope.get(WRITE_FRAME)
        return write is not None and bool(write(frames))

    async def send_text(self, data: str, *, reply: bool = True) -> None:
        """Queue an encoded frame (see :meth:`send`). ``reply=False``: a subscription's
        event, whose waiting is bounded by the subscription count, not in bytes."""
        if self.closed:
            raise Evicted
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            if not await self._wait_to_send(data, reply=reply):
                raise Evicted from None
            return
        self._queued()

    def offer(self, data: str) -> None:
        """Queue an already-encoded frame without waiting (fan-out). Bounded by bytes only
        (a burst of small frames is not a slow peer); a peer that has ``outbox_bytes``
        unread already is evicted, rather than a task per frame waiting for room."""
        if self.closed:
            return
        try:
            self.queue.put_nowait(data, count_frames=False)
        except asyncio.QueueFull:
            self.evict(
                f"slow consumer: over {self.hub.config.outbox_bytes} bytes unread; resume from your last seq"
            )
            return
        self._queued()

    async def _wait_to_send(self, data: str, *, reply: bool = True) -> bool:
        """The queue is full: wait for room up to the send timeout, else evict the peer.
        Replies waiting are bounded in bytes too (``outbox_bytes``): past it, the peer is
        evicted at once. Returns whether the frame was queued."""
        config = self.hub.config
        cost = frame_cost(data)
        if reply and self.waiting and self.waiting + cost > config.outbox_bytes:
            self.evict(
                f"slow consumer: over {config.outbox_bytes} bytes of replies unread; "
                "resume from your last seq"
            )
            return False
        self.waiting += cost
        self.hub.held.waiting += cost
        self.hub.check_total()
        try:
            await asyncio.wait_for(self.queue.put(data), config.send_timeout)
        except TimeoutError:
            self.evict(
                f"slow consumer: outgoing queue full for {config.send_timeout:g}s; resume from your last seq"
            )
            return False
        finally:
            self.waiting -= cost
            self.hub.held.waiting -= cost
        if self.closed:
            return False
        self._queued()
        return True

    def _queued(self) -> None:
        self.kick()
        if self.hub.held.unsent > self.hub.config.outbox_bytes_total:
            self.hub.check_total()

    def kick(self) -> None:
        """Make sure a drainer runs. It exists only while frames wait, so an idle
        connection keeps no writer task (measured: a task and its frame per idle subscriber).

        It starts eagerly: it writes what it can right here, and becomes a task only if
        the socket makes it wait (write flow control). A live push to a subscriber whose
        socket has room is then one call, not a task created, scheduled and run a loop
        iteration later for every subscriber and every event (docs/benchmarks.md)."""
        if self.drainer is None or self.drainer.done():
            self.drainer = start_eagerly(self._drain())

    async def _drain(self) -> None:
        raw = self.websocket.scope.get(RAW_SEND)
        while True:
            try:
                data = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if data is None:  # the hub is closing this socket: nothing after this
                self.closing_output = True
                return
            if self.closing_output:
                continue
            try:
                if raw is not None:
                    await raw({"type": "websocket.send", "text": data})
                else:
                    await self.websocket.send_text(data)
            except Exception:
                # The socket went away (uvicorn's ClientDisconnected, starlette's state
                # errors): the serve loop receives the disconnect and cleans up. Not
                # raised, since an eager drain runs inside a tail's push to everyone.
                log.debug("connection %s: send failed", self.connection_id, exc_info=True)
                return

    def evict(self, reason: str) -> None:
        """Close with 4008 now, dropping every frame not yet sent: the peer resumes from
        the last seq it read. Counted once per connection, whatever called it."""
        if self.closed:
            return
        self.hub.metrics.evictions.inc()
        log.info("evicting connection %s: %s", self.connection_id, reason)
        self._stop()
        # Not behind the backlog: the drainer is gone, so the close frame is the next
        # thing written once the transport has room (see _close_frame).
        self.queue.close()
        drainer = self.drainer
        if drainer is not None and drainer is not asyncio.current_task():
            drainer.cancel()
        self.closer = asyncio.get_running_loop().create_task(
            self._close_frame(CLOSE_SLOW_CONSUMER, reason[:120], self.hub.config.close_grace)
        )

    def _stop(self) -> None:
        self.closed = True
        current = asyncio.current_task()
        for task in self.subscriptions.values():
            if task is not current:
                task.cancel()
        self._make_room()

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code`` after what is queued. Called from a subscription task too,
        so it never cancels the task it runs in; a peer that cannot even take the close
        frame within two seconds is cut off."""
        if self.closed:
            return
        self._stop()
        self.closer = asyncio.get_running_loop().create_task(self._close_frame(code, reason, 2.0))
        await self.closer

    async def _close_frame(self, code: int, reason: str, grace: float) -> None:
        """Send the close frame; uvicorn writes it once the transport is below its high
        water mark. A peer that does not read even that within ``grace`` has its TCP
        connection aborted (a graceful transport close would wait forever on a peer
        that never reads), and so does one that stops reading after the close frame."""
        transport = self.websocket.scope.get(TRANSPORT)
        try:
            async with asyncio.timeout(grace):
                await self.websocket.close(code, reason)
        except Exception:
            self._abort(transport)
            return
        if isinstance(transport, Cuttable):
            asyncio.get_running_loop().call_later(grace, _abort_if_stuck, transport)

    def _abort(self, transport: object) -> None:
        if isinstance(transport, Cuttable):
            _abort_if_stuck(transport)
        elif self.serve_task is not None and self.serve_task is not asyncio.current_task():
            self.serve_task.cancel()  # another ASGI server: end the app, it closes the socket

    def _make_room(self) -> None:
        room = self.room
        if room is not None and not room.done():
            room.set_result(None)

    async def wait_for_room(self) -> None:
        """Wait until fewer than ``max_in_flight`` requests are unanswered (or the
        connection closes). Meanwhile the socket is not read: the peer's sends back up."""
        self.hub.metrics.reads_paused.inc()
        self.room = asyncio.get_running_loop().create_future()
        try:
            await self.room
        finally:
            self.room = None

    def may_summarize(self, session_id: str | None) -> bool:
        """Whether this connection may be sent summary prompts about ``session_id`` (None:
        a session not named, judged on ``*``) and answer them: ``write`` on it."""
        return self.protocol.may_summarize(session_id, time.time())

    def spawn(self, coro: Awaitable[object]) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Evicted):
                await coro

        task = asyncio.get_running_loop().create_task(guarded())
        if not isinstance(self.requests, set):
            self.requests = set()
        requests = self.requests
        requests.add(task)
        self.protocol.started()
        task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        if isinstance(self.requests, set):
            self.requests.discard(task)
        if self.protocol.finished() is not None and self.room is not None:
            self._make_room()

    def unpark(self, key: StreamKey) -> bool:
        """End a live subscription that has no task; True if there was one."""
        live = self.parked.pop(key, None)
        if live is None:
            return False
        live.tail.leave(live)
        self.hub.tails.release(live.tail)
        return True

    def unpark_all(self) -> None:
        for key in list(self.parked):
            self.unpark(key)
            self.hub.metrics.subscriptions.dec()

    def register(self, key: StreamKey, task: asyncio.Task[None]) -> None:
        self.subscriptions[key] = task

        def done(_task: asyncio.Task[None], key: StreamKey = key) -> None:
            self.subscription_done(key)

        task.add_done_callback(done)

    def follows(self, key: StreamKey) -> bool:
        """Whether this connection is subscribed to ``key`` (with a task, or live)."""
        return key in self.subscriptions or key in self.parked

    def subscription_done(self, key: StreamKey) -> None:
        current = self.subscriptions.get(key)
        if current is not None and current.done():
            del self.subscriptions[key]  # a live subscription keeps no finished task
        if key in self.parked:  # its task ended because it went live: still subscribed
            return
        self.hub.metrics.subscriptions.dec()
        if not self.follows(key):
            leave = self.protocol.ended(key)
            if leave is not None:
                self.hub.presence.leave(self, leave.session_id)

    def end_subscription(self, key: StreamKey) -> None:
        """Stop following ``key`` now: its task (whose done callback does the bookkeeping)
        or its live registration."""
        task = self.subscriptions.pop(key, None)
        if task is not None:
            task.cancel()
        if self.unpark(key) and task is None:
            self.subscription_done(key)

    def park(self, key: StreamKey, live: Live) -> None:
        """``key`` went live: the tail delivers to it from now on, and it keeps no task."""
        self.parked[key] = live

    def take_parked(self, key: StreamKey, live: Live) -> bool:
        """Take ``live`` back from the tail (it fell behind, to go on with a task); False
        when it is no longer this connection's registration for ``key``."""
        if self.parked.get(key) is not live:
            return False
        del self.parked[key]
        return True

    def hold_replay(self, size: int) -> None:
        """``size`` bytes of backlog read for a catching-up subscription are held."""
        self.replay += size
        self.hub.held.replay += size
        if self.hub.held.unsent > self.hub.config.outbox_bytes_total:
            self.hub.check_total()

    def release_replay(self, size: int) -> None:
        self.replay -= size
        self.hub.held.replay -= size

    def begin_import(self, state: object) -> None:
        """An ``import`` in progress on this socket (hub/server/ops.py), gone with it."""
        self.dump_import = state

    def end_import(self, state: object | None = None) -> None:
        """The import in progress ends (only if it is still ``state``, when given)."""
        if state is None or self.dump_import is state:
            self.dump_import = None

    # -- the protocol's decisions, performed --------------------------------------------------

    def read(self, data: str) -> f.Request | Refused:
        """One text frame read: the request to run, or its refusal (sent already)."""
        hub = self.hub
        parsed = self.protocol.receive_text(data, time.time(), hub.closing)
        if self.protocol.presence_watch:  # a subscribe asked for presence: told from now on
            hub.presence.watch(self)
        if isinstance(parsed, Refused):
            if parsed.reason == "bad_frame":
                hub.metrics.bad_frames.labels(parsed.frame.code).inc()
            self.spawn(self.send(parsed.frame))
        return parsed

    def open(self, token: str | None) -> None:
        """The socket was accepted with ``token`` (verified when the hub has a secret), in
        the task that serves it (``Hub.serve``, which reads its frames)."""
        self.serve_task = asyncio.current_task()
        self.perform(self.protocol.connect(token, time.time()))

    def renew(self, request: f.Auth) -> None:
        """The ``auth`` op. Run in the reader, not in a task: the requests read after it
        are judged by the new grant."""
        self.perform(self.protocol.renew(request, time.time()))

    def hello(self, request: f.Hello) -> dict[str, Any]:
        """Who this connection is, and the sessions it is on without subscribing."""
        self.perform(self.protocol.hello(request))
        return {"connection_id": self.connection_id}

    def perform(self, effects: Iterable[ServerEffect]) -> None:
        """Do what the protocol state decided, in its order."""
        presence = self.hub.presence
        for effect in effects:
            if isinstance(effect, Send):
                self.spawn(self.send(effect.frame))
            elif isinstance(effect, EndSubscription):
                self.end_subscription(effect.key)
            elif isinstance(effect, Join):
                presence.join(self, effect.session_id)
            elif isinstance(effect, Leave):
                presence.leave(self, effect.session_id)
            elif isinstance(effect, Reannounce):
                for sid in presence.present_on(self):
                    presence.announce(self, sid)
            elif isinstance(effect, ArmExpiry):
                self._arm(effect.at)
            elif isinstance(effect, Close):
                self.spawn(self.close(effect.code, effect.reason))
            elif isinstance(effect, Resume):
                self._make_room()
            elif isinstance(effect, Refused):
                self.spawn(self.send(effect.frame))

    def _arm(self, at: float | None) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if at is not None and not self.closed:
            delay = max(0.0, at - time.time())
            self.expiry = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self.expiry = None
        if not self.closed:
            self.perform(self.protocol.tick(time.time()))

    # -- the socket's life ----------------------------------------------------------------------

    def end_output(self) -> None:
        """The hub drains: what is queued goes out, nothing after it."""
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(None)
            self.kick()

    async def finish(self) -> None:
        """The socket is done: stop everything that runs for it (the hub then takes it
        off turns, streams and presence)."""
        if self.closer is not None:
            # Returning from the app would close the transport before the close frame.
            with contextlib.suppress(BaseException):
                await asyncio.shield(self.closer)
        self.closed = True
        if self.expiry is not None:  # no expiry timer outlives the connection
            self.expiry.cancel()
            self.expiry = None
        for task in self.subscriptions.values():
            task.cancel()
        self.unpark_all()
        drainer = self.drainer
        if drainer is not None and not drainer.done():
            drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await drainer


def _abort_if_stuck(transport: Cuttable) -> None:
    """A grace period is over: a peer that has not read its close frame by now never will,
    and a graceful transport close would keep its buffer forever. (A closing transport
    with an empty buffer is gone already: asyncio cannot abort it twice.)"""
    if not transport.is_closing() or transport.get_write_buffer_size():
        transport.abort()
