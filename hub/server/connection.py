"""One client socket: its outgoing queue, the frames it sends and receives, its
subscriptions and its token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from starlette.websockets import WebSocket

from protocol.codec import encode
from protocol.connection import ServerConnection, StreamKey

from ..auth import Grant
from ..store.base import Store
from .asgiscope import RAW_SEND, TRANSPORT
from .config import HubConfig
from .metrics import Metrics
from .outbox import Evicted, Held, Outbox, frame_cost
from .presence import Presence
from .streams import Streams
from .tails import Live, Tails
from .turndispatch import Turns

if TYPE_CHECKING:
    from .workers import WorkerSummarizer

log = logging.getLogger("sessionhub.server")


#: Close code for a subscriber evicted because it does not read fast enough.
CLOSE_SLOW_CONSUMER = 4008
#: Close code for a connection whose token reached its ``exp`` without an ``auth`` renewal.
CLOSE_TOKEN_EXPIRED = 4001
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


class ConnectionHost(Protocol):
    """What a connection (and the ops run on it) needs of its hub: the limits, the byte
    accounting, the metrics, the tails, presence, streams, turns, the store; :class:`~hub.server.
    hub.Hub` is the one implementation. A Protocol, so that this module does not import
    the hub, which imports it."""

    @property
    def config(self) -> HubConfig: ...
    @property
    def held(self) -> Held: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def tails(self) -> Tails: ...
    @property
    def presence(self) -> Presence: ...
    @property
    def streams(self) -> Streams: ...
    @property
    def turns(self) -> Turns: ...
    @property
    def store(self) -> Store: ...
    @property
    def worker_summarizer(self) -> WorkerSummarizer | None: ...
    @property
    def closing(self) -> bool:
        """Draining: requests read from now on are refused."""
        ...

    def check_total(self) -> None:
        """Evict the heaviest connections while the hub holds over ``outbox_bytes_total``."""
        ...


class Connection:
    """One client socket: a bounded outgoing queue, drained by a task that runs only while
    frames wait (an idle connection keeps no writer task)."""

    # Slots: a hub holds thousands of these; an attribute dict would cost ~1 KiB each.
    __slots__ = (
        "announced",
        "closed",
        "closer",
        "closing_output",
        "connection_id",
        "drainer",
        "dump_import",
        "expiry",
        "grant",
        "hub",
        "name",
        "parked",
        "presence_watch",
        "protocol",
        "queue",
        "replay",
        "requests",
        "role",
        "room",
        "serve_task",
        "subscriptions",
        "summarizer",
        "waiting",
        "websocket",
    )

    def __init__(self, hub: ConnectionHost, websocket: WebSocket) -> None:
        self.hub = hub
        self.websocket = websocket
        self.protocol = ServerConnection(
            max_frame_bytes=hub.config.max_frame_bytes, max_subscriptions=hub.config.max_subscriptions
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
        self.grant: Grant | None = None
        self.expiry: asyncio.TimerHandle | None = None  # closes the socket at the grant's exp
        self.connection_id = uuid.uuid4().hex[:12]
        self.name: str | None = None
        self.role: str | None = None
        self.announced: frozenset[str] = frozenset()  # sessions declared with hello
        self.summarizer = False  # declared with hello: this peer writes summaries
        self.presence_watch: frozenset[str] = frozenset()  # subscriptions asking for join/leave
        self.waiting = 0  # bytes of replies waiting for room in the outbox
        self.replay = 0  # bytes of backlog batches read for catching-up subscriptions
        #: Set while the reader waits for requests in flight to drop below the bound.
        self.room: asyncio.Future[None] | None = None
        #: Sends the close frame (or cuts the peer off); the app must not end before it.
        self.closer: asyncio.Task[None] | None = None
        #: An ``import`` in progress on this socket (hub/server/ops.py), gone with it.
        self.dump_import: Any = None

    def entry(self) -> dict[str, Any]:
        return {"connection_id": self.connection_id, "name": self.name, "role": self.role}

    @property
    def unsent(self) -> int:
        """Bytes held for this peer: its outbox, replies waiting for room, replay batches."""
        return self.queue.bytes + self.waiting + self.replay

    async def send(self, frame: Any) -> None:
        """Queue a frame; if the queue stays full past the send timeout, evict the peer."""
        await self.send_text(encode(frame).decode())

    def try_put(self, data: str) -> bool:
        """Queue a frame if there is room right now."""
        if self.closed:
            return False
        try:
            self.queue.put_nowait(data)
        except asyncio.QueueFull:
            return False
        self._queued()
        return True

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
        if isinstance(transport, asyncio.WriteTransport):
            asyncio.get_running_loop().call_later(grace, _abort_if_stuck, transport)

    def _abort(self, transport: object) -> None:
        if isinstance(transport, asyncio.WriteTransport):
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
        if self.hub.config.auth_secret is None:
            return True
        return self.grant is not None and self.grant.allows("summarize", session_id)

    def spawn(self, coro: Awaitable[object]) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Evicted):
                await coro

        task = asyncio.get_running_loop().create_task(guarded())
        if not isinstance(self.requests, set):
            self.requests = set()
        requests = self.requests
        requests.add(task)
        task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        if isinstance(self.requests, set):
            self.requests.discard(task)
        if self.room is not None and len(self.requests) < self.hub.config.max_in_flight:
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
            self.protocol.subscription_ended(key)
            if key is not None:
                self.presence_watch = self.presence_watch - {key}
            if key is not None and key not in self.announced:
                self.hub.presence.leave(self, key)


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, up to its first wait; the rest, if it waits at all, in a task
    (what Python 3.12's eager task factory does, on 3.11). Returns that task, or None
    when ``coro`` finished without waiting."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    except BaseException:
        coro.close()
        raise
    return asyncio.get_running_loop().create_task(_carry_on(coro, first))


async def _carry_on(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """Drive ``coro`` on from a suspension, as a task would: wait for the future it
    yielded, then resume it (it takes the result itself), or throw the future's error or
    this task's cancellation into it."""
    while True:
        try:
            if waiting is None:  # a bare yield (asyncio.sleep(0)): one loop iteration
                await asyncio.sleep(0)
            else:
                # What a task does with a future its coroutine yielded: take it over
                # (clear the flag the yield set, or awaiting it here would be refused).
                waiting._asyncio_future_blocking = False
                await waiting
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waiting = coro.send(None)
            except StopIteration:
                return


def _abort_if_stuck(transport: asyncio.WriteTransport) -> None:
    """A grace period is over: a peer that has not read its close frame by now never will,
    and a graceful transport close would keep its buffer forever. (A closing transport
    with an empty buffer is gone already: asyncio cannot abort it twice.)"""
    if not transport.is_closing() or transport.get_write_buffer_size():
        transport.abort()
