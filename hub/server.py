"""The hub: the engine served over a WebSocket (``/ws``), plus ``/healthz`` and ``/metrics``.

One connection runs a reader (frames in, via the sans-I/O :class:`protocol.connection.
ServerConnection`), one task per request, one task per subscription that is catching up,
and a drainer that empties a bounded outgoing queue into the socket while frames wait.
Nothing ever waits on a slow peer but that peer's own tasks: a subscriber whose queue stays
full past ``send_timeout`` is closed (code 4008) and resumes from its last seq elsewhere.

Subscriptions are served from the event log. Each followed stream has one *tail*: a task
that reads each new event once from the store (woken by the store's bus) and keeps the
newest ones in memory, so 1,000 subscribers of one session cost one read per change, and a
subscriber that fell behind the tail reads the rest from the log. Positions the log cannot
serve (pruned, another epoch, the future) get a ``reset`` frame, never a silent skip.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol import Event, Forbidden, Message, PositionLost, SessionHubError, SessionNotFound
from protocol import frames as f
from protocol.codec import encode
from protocol.connection import ServerConnection, StreamKey

from .auth import Grant, verify_token
from .backends import open_backend
from .bus import Bus, RemoteBus
from .chat_http import chat_routes
from .compaction import CompactResult
from .manager import SessionManager
from .relay import Relay
from .session import Session
from .store.base import LATEST, REGISTRY, ParentArg, Store, session_stream
from .streams import Streams
from .tools import Tool
from .turns import Turns
from .workers import WorkerSummarizer

__all__ = ["HubConfig", "create_app"]

log = logging.getLogger("sessionhub.server")

#: Close code for a subscriber evicted because it does not read fast enough.
CLOSE_SLOW_CONSUMER = 4008
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


@dataclass(frozen=True)
class HubConfig:
    """Limits of one hub. ``queue_frames`` bounds each connection's outgoing queue;
    ``send_timeout`` is how long a full queue may stay full before the peer is evicted."""

    max_frame_bytes: int = 1 << 20
    #: HS256 secret: when set, every WebSocket request needs a token granting it.
    auth_secret: str | None = None
    #: Origins a browser may connect from; empty: the hub's own origin only.
    allowed_origins: tuple[str, ...] = ()
    max_subscriptions: int = 64
    queue_frames: int = 1024
    send_timeout: float = 10.0
    tail_events: int = 1024
    backlog_batch: int = 500
    shutdown_grace: float = 10.0
    #: With several nodes: how often each relays its presence table, and how long a silent
    #: node's connections stay listed.
    presence_heartbeat: float = 10.0
    presence_ttl: float = 30.0
    #: How long a turn waits for a responder to start answering it (hub/turns.py).
    turn_timeout: float = 30.0


# -- wire conversion -----------------------------------------------------------------------


def wire(value: Any) -> Any:
    """An engine result as JSON-ready data (messages as UIMessage dicts)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, CompactResult):
        return {
            "from_message_id": value.from_message_id,
            "to_message_id": value.to_message_id,
            "summary": value.summary,
        }
    if isinstance(value, Tool):
        return {"name": value.name, "description": value.description, "input_schema": value.input_schema}
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    raise TypeError(f"cannot send {type(value).__name__} over the wire")


def event_frame(event: Event) -> f.EventFrame:
    return f.EventFrame(
        stream=event.stream,
        session_id=event.session_id,
        seq=event.seq,
        epoch=event.epoch,
        type=event.type,
        data=event.data,
        created_at=event.created_at.isoformat(),
    )


def _parent(value: Any) -> ParentArg:
    return LATEST if value is msgspec.UNSET else value


# -- metrics -------------------------------------------------------------------------------


class Metrics:
    """Prometheus metrics of one app (its own registry, so several apps can coexist)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge(
            "sessionhub_connections", "Open WebSocket connections", registry=self.registry
        )
        self.subscriptions = Gauge("sessionhub_subscriptions", "Active subscriptions", registry=self.registry)
        self.delivered = Counter(
            "sessionhub_events_delivered", "Event frames queued to subscribers", registry=self.registry
        )
        self.evictions = Counter(
            "sessionhub_evictions", "Connections closed for reading too slowly", registry=self.registry
        )
        self.bad_frames = Counter(
            "sessionhub_bad_frames",
            "Frames answered with an error before running",
            ["code"],
            registry=self.registry,
        )
        self.op_seconds = Histogram(
            "sessionhub_op_seconds",
            "Time to run one request",
            ["op"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
        )

    def watch_bus(self, bus: RemoteBus) -> None:
        """Export a cross-node bus's state (read at scrape time)."""
        Gauge(
            "sessionhub_bus_connected", "1 while the cross-node bus listens", registry=self.registry
        ).set_function(lambda: float(bus.connected))
        Gauge(
            "sessionhub_bus_reconnects", "Times the bus listener was re-established", registry=self.registry
        ).set_function(lambda: float(bus.reconnects))
        Gauge(
            "sessionhub_relay_dropped",
            "Relayed frames (stream deltas, presence) dropped: send failures or backlog",
            registry=self.registry,
        ).set_function(lambda: float(bus.relay_dropped))


# -- stream tails --------------------------------------------------------------------------


class Outbox:
    """One connection's bounded FIFO of outgoing frames.

    ``asyncio.Queue`` allocates three deques and an event up front (about 2.5 KiB); this
    allocates its deque when a frame is queued and drops it when drained, so an idle
    subscriber costs less (docs/benchmarks.md). What the hub uses: ``put_nowait`` raises
    ``asyncio.QueueFull``, ``put`` waits for room, ``get_nowait`` raises
    ``asyncio.QueueEmpty``."""

    __slots__ = ("_items", "_putters", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: collections.deque[str | None] | None = None
        self._putters: list[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return 0 if self._items is None else len(self._items)

    def put_nowait(self, item: str | None) -> None:
        if self.qsize() >= self.maxsize:
            raise asyncio.QueueFull
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)

    async def put(self, item: str | None) -> None:
        while self.qsize() >= self.maxsize:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if self._putters is None:
                self._putters = []
            self._putters.append(waiter)
            try:
                await waiter
            finally:
                if self._putters is not None and waiter in self._putters:
                    self._putters.remove(waiter)
        self.put_nowait(item)

    def get_nowait(self) -> str | None:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        if not self._items:
            self._items = None
        if self._putters:
            for waiter in self._putters:
                if not waiter.done():
                    waiter.set_result(None)
                    break
        return item


@dataclass(slots=True)
class _Live:
    """A caught-up subscriber the tail pushes to directly. It has no task of its own while
    live (an idle subscriber costs memory, not a task); ``resume`` starts one when the
    subscriber must continue on its own."""

    connection: Connection
    tail: Tail
    seq: int
    epoch: str
    resume: Callable[[_Live], None]


class Tail:
    """The newest events of one stream, read once from the log for all its subscribers.

    Subscribers that have caught up are *live*: the tail puts each new frame straight into
    their queues (no task wakes per subscriber per event). One whose queue is full, or that
    meets an epoch change, is woken to continue on its own, with backpressure."""

    def __init__(self, store: Store, stream: str, size: int) -> None:
        self.store = store
        self.stream = stream
        self.events: collections.deque[Event] = collections.deque(maxlen=size)
        # The event frames, encoded once here for every subscriber (same positions).
        self.frames: collections.deque[str] = collections.deque(maxlen=size)
        self.last_seq = 0
        self.changed = asyncio.Event()
        self.users = 0
        self.task: asyncio.Task[None] | None = None
        self.live: dict[int, _Live] = {}
        self.on_delivered: Callable[[int], None] = lambda n: None

    async def start(self) -> None:
        bus = self.store.bus
        bus.follow(self.stream)
        try:
            generation = bus.generation
            self.last_seq = (await self.store.stream_position(self.stream)).last_seq
        except BaseException:
            bus.unfollow(self.stream)
            raise
        self.task = asyncio.get_running_loop().create_task(self._run(generation), name=f"tail {self.stream}")

    async def _run(self, generation: int) -> None:
        try:
            await self._follow(generation)
        finally:
            self.store.bus.unfollow(self.stream)

    async def _follow(self, generation: int) -> None:
        bus = self.store.bus
        while True:
            # ``since``: a bus that reconnected after our last read may have missed a doorbell.
            await bus.wait(self.stream, self.last_seq, since=generation)
            generation = bus.generation
            try:
                events = await self.store.read_events(self.stream, self.last_seq, 1000)
            except PositionLost as exc:
                # Pruned or re-epoched under us: start over at the log's end; subscribers
                # notice the gap or the epoch and get a reset.
                self.events.clear()
                self.frames.clear()
                self.last_seq = exc.last_seq
                events = []
            except Exception:
                log.exception("reading the log of %s failed; retrying", self.stream)
                await asyncio.sleep(0.5)
                continue
            if events:
                frames = [encode(event_frame(e)).decode() for e in events]
                self.events.extend(events)
                self.frames.extend(frames)
                self.last_seq = events[-1].seq
                self._push(events, frames)
            waiter, self.changed = self.changed, asyncio.Event()
            waiter.set()

    def _push(self, events: list[Event], frames: list[str]) -> None:
        delivered = 0
        for key, live in list(self.live.items()):
            for event, data in zip(events, frames, strict=True):
                if event.seq <= live.seq:
                    continue
                if event.epoch != live.epoch or not live.connection.try_put(data):
                    del self.live[key]
                    live.resume(live)
                    break
                live.seq = event.seq
                delivered += 1
        if delivered:
            self.on_delivered(delivered)

    def go_live(self, connection: Connection, seq: int, epoch: str, resume: Callable[[_Live], None]) -> _Live:
        """Register a subscriber that holds everything up to ``seq`` (== ``last_seq``)."""
        live = _Live(connection, self, seq, epoch, resume)
        self.live[id(live)] = live
        return live

    def leave(self, live: _Live) -> None:
        self.live.pop(id(live), None)

    def after(self, seq: int) -> list[tuple[Event, str]] | None:
        """Events after ``seq`` (with their encoded frames) if this tail holds all of them,
        else None. The deque is contiguous in seq, so this is a slice, not a scan."""
        if seq >= self.last_seq:
            return []
        if not self.events:
            return None
        first = self.events[0].seq
        if seq + 1 < first:
            return None
        start = seq + 1 - first
        events = itertools.islice(self.events, start, None)
        return list(zip(events, itertools.islice(self.frames, start, None), strict=True))


class Tails:
    def __init__(self, store: Store, size: int) -> None:
        self.store = store
        self.size = size
        self._tails: dict[str, Tail] = {}
        self._lock = asyncio.Lock()
        self.on_delivered: Callable[[int], None] = lambda n: None

    async def acquire(self, stream: str) -> Tail:
        async with self._lock:
            tail = self._tails.get(stream)
            if tail is None:
                tail = self._tails[stream] = Tail(self.store, stream, self.size)
                tail.on_delivered = self.on_delivered
                await tail.start()
            tail.users += 1
            return tail

    def release(self, tail: Tail) -> None:
        tail.users -= 1
        if tail.users == 0 and self._tails.get(tail.stream) is tail:
            del self._tails[tail.stream]
            if tail.task is not None:
                tail.task.cancel()

    async def close(self) -> None:
        for tail in list(self._tails.values()):
            if tail.task is not None:
                tail.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await tail.task
        self._tails.clear()


# -- connections ---------------------------------------------------------------------------


class Evicted(Exception):
    pass


class Connection:
    """One client socket: a bounded outgoing queue, drained by a task that runs only while
    frames wait (an idle connection keeps no writer task)."""

    # Slots: a hub holds thousands of these; an attribute dict would cost ~1 KiB each.
    __slots__ = (
        "announced",
        "closed",
        "closing_output",
        "connection_id",
        "drainer",
        "grant",
        "hub",
        "name",
        "parked",
        "presence_watch",
        "protocol",
        "queue",
        "requests",
        "role",
        "serve_task",
        "subscriptions",
        "summarizer",
        "websocket",
    )

    def __init__(self, hub: Hub, websocket: WebSocket) -> None:
        self.hub = hub
        self.websocket = websocket
        self.protocol = ServerConnection(
            max_frame_bytes=hub.config.max_frame_bytes, max_subscriptions=hub.config.max_subscriptions
        )
        self.queue = Outbox(hub.config.queue_frames)
        # Empty sets cost ~200 bytes each; thousands of idle connections have none of these
        # in use, so they start as the shared empty frozenset and become sets when needed.
        self.requests: set[asyncio.Task[None]] | frozenset[asyncio.Task[None]] = frozenset()
        self.subscriptions: dict[StreamKey, asyncio.Task[None]] = {}
        self.parked: dict[StreamKey, _Live] = {}  # live subscriptions, whose task has ended
        self.closed = False
        self.serve_task: asyncio.Task[Any] | None = None
        self.drainer: asyncio.Task[None] | None = None
        self.closing_output = False
        self.grant: Grant | None = None
        self.connection_id = uuid.uuid4().hex[:12]
        self.name: str | None = None
        self.role: str | None = None
        self.announced: frozenset[str] = frozenset()  # sessions declared with hello
        self.summarizer = False  # declared with hello: this peer writes summaries
        self.presence_watch: frozenset[str] = frozenset()  # subscriptions asking for join/leave

    def entry(self) -> dict[str, Any]:
        return {"connection_id": self.connection_id, "name": self.name, "role": self.role}

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
        self._kick()
        return True

    async def send_text(self, data: str) -> None:
        """Queue an encoded frame (see :meth:`send`)."""
        if self.closed:
            raise Evicted
        try:
            self.queue.put_nowait(data)
            self._kick()
        except asyncio.QueueFull:
            if not await self._wait_to_send(data):
                raise Evicted from None

    def offer(self, data: str) -> None:
        """Queue an already-encoded frame without waiting (fan-out): when the queue is full,
        a task waits for room, and evicts the peer if none comes in time."""
        if self.closed:
            return
        try:
            self.queue.put_nowait(data)
            self._kick()
        except asyncio.QueueFull:
            self._spawn(self._wait_to_send(data))

    async def _wait_to_send(self, data: str) -> bool:
        """The queue is full: wait for room up to the send timeout, else evict the peer.
        Returns whether the frame was queued."""
        try:
            await asyncio.wait_for(self.queue.put(data), self.hub.config.send_timeout)
        except TimeoutError:
            self.hub.metrics.evictions.inc()
            await self.close(
                CLOSE_SLOW_CONSUMER,
                f"slow consumer: outgoing queue full for {self.hub.config.send_timeout:g}s; "
                "resume from your last seq",
            )
            return False
        self._kick()
        return True

    def _kick(self) -> None:
        """Make sure a drainer runs. It exists only while frames wait, so an idle
        connection keeps no writer task (measured: a task and its frame per idle subscriber)."""
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
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
            await self.websocket.send_text(data)

    async def close(self, code: int, reason: str) -> None:
        """Close with ``code``. Called from a subscription task too (eviction), so it never
        cancels the task it runs in; a peer that cannot even take the close frame within
        two seconds is cut off."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.current_task()
        for task in self.subscriptions.values():
            if task is not current:
                task.cancel()
        try:
            async with asyncio.timeout(2.0):
                await self.websocket.close(code, reason)
        except Exception:
            if self.serve_task is not None and self.serve_task is not current:
                self.serve_task.cancel()

    # -- requests ------------------------------------------------------------------------
    def on_frame(self, data: str) -> None:
        parsed = self.protocol.receive_text(data)
        if self.hub.closing and not isinstance(parsed, f.ErrorFrame):
            # Refused when read; requests read before the drain began run to the end.
            if isinstance(parsed, f.Subscribe):
                self.protocol.subscription_ended(parsed.session_id)
            refusal = f.ErrorFrame(id=parsed.id, code="unavailable", message="the hub is shutting down")
            self._spawn(self.send(refusal))
            return
        if isinstance(parsed, f.ErrorFrame):
            self.hub.metrics.bad_frames.labels(parsed.code).inc()
            self._spawn(self.send(parsed))
            return
        if self.hub.config.auth_secret is not None and not self._allowed(parsed):
            if isinstance(parsed, f.Subscribe | f.Unsubscribe):
                self.protocol.subscription_ended(parsed.session_id)
            # One message whatever the reason (no token, bad signature, expired, no scope).
            self._spawn(self.send(f.ErrorFrame(id=parsed.id, code="forbidden", message="forbidden")))
            return
        if isinstance(parsed, f.Subscribe):
            key = parsed.session_id
            if parsed.presence and key is not None:
                self.presence_watch = self.presence_watch | {key}
            self._unpark(key)  # a stale live registration (resubscribed) goes
            self.hub.metrics.subscriptions.inc()
            self._register(key, asyncio.get_running_loop().create_task(self._follow(parsed)))
            return
        if isinstance(parsed, f.Hello):
            self._spawn(self._hello(parsed))
            return
        if isinstance(parsed, f.Presence):
            self._spawn(self._presence(parsed))
            return
        if isinstance(parsed, f.StreamStart | f.StreamDelta | f.StreamEnd):
            self._spawn(self._stream(parsed))
            return
        if isinstance(parsed, f.TakeTurns | f.TurnFailed):
            self._spawn(self._turns(parsed))
            return
        if isinstance(parsed, f.Summary):
            workers = self.hub.worker_summarizer
            if workers is not None and workers.answer(self, parsed):
                self._spawn(self.send(f.ReplyFrame(id=parsed.id, result=None)))
            else:
                message = "no summary was asked of this connection with that request_id"
                self._spawn(self.send(f.ErrorFrame(id=parsed.id, code="not_found", message=message)))
            return
        if isinstance(parsed, f.Unsubscribe):
            stopped = self.subscriptions.pop(parsed.session_id, None)
            if stopped is not None:
                stopped.cancel()
            if self._unpark(parsed.session_id):
                self._subscription_done(parsed.session_id)
            self._spawn(self.send(f.ReplyFrame(id=parsed.id, result=None)))
            return
        self._spawn(self._run(parsed))

    def _allowed(self, request: f.Request) -> bool:
        if isinstance(request, f.Ping):
            return True
        if self.grant is None:
            return False
        if isinstance(request, f.Hello):  # any valid token; each session named is checked
            return all(self.grant.allows("presence", sid) for sid in request.sessions)
        if isinstance(request, f.Summary | f.TakeTurns | f.TurnFailed):
            return True  # answers only what this connection was asked; turns check the grant
        op = str(type(request).__struct_config__.tag)
        session_id = getattr(request, "session_id", None)
        registry = isinstance(request, f.Subscribe | f.Unsubscribe) and session_id is None
        return self.grant.allows(op, session_id if isinstance(session_id, str) else None, registry=registry)

    def _spawn(self, coro: Awaitable[object]) -> None:
        async def guarded() -> None:
            with contextlib.suppress(Evicted):
                await coro

        task = asyncio.get_running_loop().create_task(guarded())
        if not isinstance(self.requests, set):
            self.requests = set()
        requests = self.requests
        requests.add(task)
        task.add_done_callback(requests.discard)

    def _unpark(self, key: StreamKey) -> bool:
        """End a live subscription that has no task; True if there was one."""
        live = self.parked.pop(key, None)
        if live is None:
            return False
        live.tail.leave(live)
        self.hub.tails.release(live.tail)
        return True

    def unpark_all(self) -> None:
        for key in list(self.parked):
            self._unpark(key)
            self.hub.metrics.subscriptions.dec()

    def _register(self, key: StreamKey, task: asyncio.Task[None]) -> None:
        self.subscriptions[key] = task

        def done(_task: asyncio.Task[None], key: StreamKey = key) -> None:
            self._subscription_done(key)

        task.add_done_callback(done)

    def follows(self, key: StreamKey) -> bool:
        """Whether this connection is subscribed to ``key`` (with a task, or live)."""
        return key in self.subscriptions or key in self.parked

    def _subscription_done(self, key: StreamKey) -> None:
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
                self.hub.leave(self, key)

    async def _hello(self, request: f.Hello) -> None:
        self.name, self.role = request.name, request.role
        self.summarizer = request.summarizer
        before = self.announced
        self.announced = frozenset(request.sessions)
        for sid in before - self.announced:
            if not self.follows(sid):
                self.hub.leave(self, sid)
        for sid in self.hub.present_on(self):
            self.hub.announce(self, sid)  # name or role may have changed: join again
        for sid in self.announced:
            self.hub.join(self, sid)
        await self.send(f.ReplyFrame(id=request.id, result={"connection_id": self.connection_id}))

    async def _stream(self, request: f.StreamStart | f.StreamDelta | f.StreamEnd) -> None:
        streams = self.hub.streams
        try:
            if isinstance(request, f.StreamStart):
                result: Any = await self.hub.turns.start_stream(self, request)
            elif isinstance(request, f.StreamDelta):
                result = await streams.delta(self, request)
            else:
                await streams.end(self, request, request.status)
                result = None
            frame: Any = f.ReplyFrame(id=request.id, result=result)
        except SessionHubError as exc:
            frame = f.ErrorFrame(id=request.id, code=_code(exc), message=str(exc))
        await self.send(frame)

    async def _turns(self, request: f.TakeTurns | f.TurnFailed) -> None:
        try:
            if isinstance(request, f.TakeTurns):
                self.hub.turns.serve(self)
            else:
                self.hub.turns.refused(self, request)
            frame: Any = f.ReplyFrame(id=request.id, result=None)
        except SessionHubError as exc:
            frame = f.ErrorFrame(id=request.id, code=_code(exc), message=str(exc))
        await self.send(frame)

    async def _presence(self, request: f.Presence) -> None:
        await self.send(f.ReplyFrame(id=request.id, result=self.hub.present(request.session_id)))

    async def _run(self, request: f.Request) -> None:
        op = str(type(request).__struct_config__.tag)
        started = time.perf_counter()
        try:
            result = await self.hub.ops[op](request)
            frame: Any = f.ReplyFrame(id=request.id, result=wire(result))
        except SessionHubError as exc:
            frame = f.ErrorFrame(id=request.id, code=_code(exc), message=str(exc))
        except Exception:
            log.exception("op %s failed", op)
            frame = f.ErrorFrame(
                id=request.id, code="internal", message="internal error; nothing was changed"
            )
        finally:
            self.hub.metrics.op_seconds.labels(op).observe(time.perf_counter() - started)
        await self.send(frame)

    # -- subscriptions -------------------------------------------------------------------
    async def _follow(self, request: f.Subscribe) -> None:
        key = request.session_id
        stream = REGISTRY if key is None else session_stream(key)
        store = self.hub.store
        try:
            if key is not None and await store.get_session(key) is None:
                position = await store.stream_position(stream)
                if position.last_seq == 0:
                    raise SessionNotFound(key)
            tail = await self.hub.tails.acquire(stream)
        except SessionHubError as exc:
            await self.send(f.ErrorFrame(id=request.id, code=_code(exc), message=str(exc)))
            return
        handed_over = False  # from here on, _pump owns the tail (and releases it)
        try:
            position = await store.stream_position(stream)
            asked = request.epoch
            seq = request.after_seq
            if (
                (asked is not None and position.last_seq > 0 and asked != position.epoch)
                or seq > position.last_seq
                or seq < position.first_seq - 1
            ):
                await self._reset(key, seq, position.epoch, position.first_seq, position.last_seq)
                return
            # An empty stream has no epoch yet: its first event brings it.
            epoch: str | None = position.epoch if position.last_seq > 0 else None
            await self.send(
                f.ReplyFrame(id=request.id, result={"epoch": position.epoch, "last_seq": position.last_seq})
            )
            if key is not None:
                self.hub.join(self, key)
            handed_over = True
        except Evicted:
            return
        finally:
            if not handed_over:
                self.hub.tails.release(tail)
        await self._pump(key, stream, tail, seq, epoch, caught_up=False)

    def _resume(self, key: StreamKey, stream: str, live: _Live) -> None:
        """The tail could not deliver to this live subscriber (full queue, new epoch): it
        continues with a task of its own, with backpressure, from what it has."""
        if self.parked.get(key) is not live:
            return
        del self.parked[key]
        if self.closed:
            self.hub.tails.release(live.tail)
            self.hub.metrics.subscriptions.dec()
            return
        task = asyncio.get_running_loop().create_task(
            self._pump(key, stream, live.tail, live.seq, live.epoch, caught_up=True)
        )
        self._register(key, task)

    async def _pump(
        self, key: StreamKey, stream: str, tail: Tail, seq: int, epoch: str | None, *, caught_up: bool
    ) -> None:
        store = self.hub.store
        parked = False
        try:
            while True:
                waiter = tail.changed
                events = tail.after(seq)
                if events is None:
                    try:
                        backlog = await store.read_events(stream, seq, self.hub.config.backlog_batch)
                    except PositionLost as exc:
                        await self._reset(key, seq, exc.epoch, exc.first_seq, exc.last_seq)
                        return
                    events = [(e, encode(event_frame(e)).decode()) for e in backlog]
                if not events:
                    if tail.last_seq <= seq:
                        if not caught_up and key is not None:
                            # Caught up: streams running now go out as their state so far.
                            caught_up = True
                            for data in self.hub.streams.states(key):
                                self.offer(data)
                        events = None  # hold no events while idle
                        if epoch is None:  # an empty stream: wait for its first event
                            await waiter.wait()
                            continue
                        # Go live and end this task: the tail delivers from now on, and
                        # starts a new task only if this subscriber falls behind.
                        self.parked[key] = tail.go_live(
                            self, seq, epoch, functools.partial(self._resume, key, stream)
                        )
                        parked = True
                        return
                    continue
                sent = 0
                try:
                    for event, data in events:
                        if epoch is None:
                            epoch = event.epoch
                        if event.epoch != epoch:
                            current = await store.stream_position(stream)
                            await self._reset(key, seq, current.epoch, current.first_seq, current.last_seq)
                            return
                        await self.send_text(data)
                        sent += 1
                        seq = event.seq
                finally:
                    self.hub.metrics.delivered.inc(sent)  # once per batch: the counter takes a lock
        except Evicted:
            return
        finally:
            if not parked:
                self.hub.tails.release(tail)

    async def _reset(self, key: StreamKey, seq: int, epoch: str, first: int, last: int) -> None:
        await self.send(
            f.ResetFrame(
                session_id=key,
                after_seq=seq,
                epoch=epoch,
                first_seq=first,
                last_seq=last,
                message="the log cannot serve events after this position; reload and resubscribe",
            )
        )


def _code(exc: SessionHubError) -> f.ErrorCode:
    code = exc.code
    return code if code in f.ERROR_CODES else "internal"  # type: ignore[return-value]


# -- the hub -------------------------------------------------------------------------------


class Hub:
    """The application's state: the store, the manager, the open connections."""

    def __init__(
        self,
        store: Store,
        manager: SessionManager,
        config: HubConfig,
        worker_summarizer: WorkerSummarizer | None = None,
    ) -> None:
        self.worker_summarizer = worker_summarizer
        if worker_summarizer is not None:
            worker_summarizer.attach(self)
        self.store = store
        self.manager = manager
        self.config = config
        self.metrics = Metrics()
        self.tails = Tails(store, config.tail_events)
        self.tails.on_delivered = self.metrics.delivered.inc
        self.streams = Streams(self)
        self.turns = Turns(self, config.turn_timeout)
        self.connections: set[Connection] = set()
        #: session id -> connection id -> connection: who is on each session.
        self.presence: dict[str, dict[str, Connection]] = {}
        #: With a cross-node bus: stream frames and presence to and from the other nodes.
        self.relay: Relay | None = None
        if isinstance(store.bus, RemoteBus):
            self.relay = Relay(self, store.bus, config.presence_heartbeat, config.presence_ttl)
            self.relay.start()
            self.metrics.watch_bus(store.bus)
        self.closing = False
        self.ops: dict[str, Callable[[Any], Awaitable[Any]]] = _operations(self)

    def present_on(self, connection: Connection) -> list[str]:
        return [sid for sid, present in self.presence.items() if connection.connection_id in present]

    def _tell(self, session_id: str, action: Literal["join", "leave"], connection: Connection) -> None:
        frame = f.PresenceFrame(session_id=session_id, action=action, entry=connection.entry())
        self.tell_watchers(frame)
        if self.relay is not None:
            self.relay.send(frame)

    def tell_watchers(self, frame: f.PresenceFrame) -> None:
        """Send a join or leave to this node's connections watching the session's presence."""
        watchers = [c for c in self.connections if frame.session_id in c.presence_watch and not c.closed]
        if not watchers:
            return
        data = encode(frame).decode()
        for other in watchers:
            other.offer(data)

    def present(self, session_id: str) -> list[dict[str, Any]]:
        """Who is on the session: this node's connections, then the other nodes'."""
        entries = [c.entry() for c in self.presence.get(session_id, {}).values()]
        if self.relay is not None:
            entries += self.relay.presence.entries(session_id)
        return entries

    def join(self, connection: Connection, session_id: str) -> None:
        present = self.presence.setdefault(session_id, {})
        if connection.connection_id not in present:
            present[connection.connection_id] = connection
            self._tell(session_id, "join", connection)

    def announce(self, connection: Connection, session_id: str) -> None:
        """Tell the session's subscribers the connection's new name or role."""
        self._tell(session_id, "join", connection)

    def leave(self, connection: Connection, session_id: str) -> None:
        present = self.presence.get(session_id)
        if present is not None and present.pop(connection.connection_id, None) is not None:
            if not present:
                del self.presence[session_id]
            self._tell(session_id, "leave", connection)

    async def session(self, session_id: str) -> Session:
        if await self.manager.get(session_id) is None:
            raise SessionNotFound(session_id)
        return self.manager.get_session(session_id)

    async def drain(self) -> None:
        """Stop taking requests, let running ones finish (up to the grace period), then
        close every socket with 1001 so clients resume elsewhere."""
        if self.closing:
            return
        self.closing = True
        running = [t for c in self.connections for t in c.requests]
        if running:
            await asyncio.wait(running, timeout=self.config.shutdown_grace)
        for connection in list(self.connections):
            # Let queued replies go out before the close frame.
            with contextlib.suppress(asyncio.QueueFull):
                connection.queue.put_nowait(None)
                connection._kick()
        await asyncio.sleep(0)
        for connection in list(self.connections):
            await connection.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
        await self.turns.close()
        await self.tails.close()
        if self.relay is not None:
            await self.relay.close()

    async def serve(self, websocket: WebSocket) -> None:
        token, subprotocol = _token_of(websocket)
        await websocket.accept(subprotocol=subprotocol)
        connection = Connection(self, websocket)
        if self.config.auth_secret is not None:
            # A bad token does not close the socket: each request is answered `forbidden`.
            with contextlib.suppress(Forbidden):
                connection.grant = verify_token(self.config.auth_secret, token)
        connection.serve_task = asyncio.current_task()
        self.connections.add(connection)
        self.metrics.connections.inc()
        try:
            while not connection.closed:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    await connection.close(
                        CLOSE_UNSUPPORTED, "binary frames are not supported; send JSON text"
                    )
                    break
                connection.on_frame(text)
        except WebSocketDisconnect:
            pass
        except RuntimeError:  # the socket went away while we were receiving
            pass
        finally:
            connection.closed = True
            for task in connection.subscriptions.values():
                task.cancel()
            connection.unpark_all()
            drainer = connection.drainer
            if drainer is not None and not drainer.done():
                drainer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await drainer
            self.connections.discard(connection)
            if self.worker_summarizer is not None:
                self.worker_summarizer.connection_lost(connection)
            self.turns.connection_lost(connection)
            await self.streams.owner_lost(connection)
            for sid in self.present_on(connection):
                self.leave(connection, sid)
            self.metrics.connections.dec()


def _token_of(websocket: WebSocket) -> tuple[str | None, str | None]:
    """The bearer token, from ``Authorization: Bearer <token>`` or, for browsers (which
    cannot set headers on a WebSocket), from the subprotocols ``sessionhub, bearer.<token>``.
    Never from the URL: URLs end up in access logs. Returns the subprotocol to accept."""
    header = websocket.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    offered = [p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    for item in offered:
        if item.startswith("bearer.") and token is None:
            token = item[len("bearer.") :]
    return token, ("sessionhub" if "sessionhub" in offered else None)


def _origin_allowed(websocket: WebSocket, allowed: tuple[str, ...]) -> bool:
    """Non-browser clients send no Origin and are judged by their token alone; a browser's
    Origin must be the hub's own or one of ``allowed`` (``*``: any)."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    if origin in allowed or "*" in allowed:
        return True
    host = websocket.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def _operations(hub: Hub) -> dict[str, Callable[[Any], Awaitable[Any]]]:
    m = hub.manager

    async def session_op(request: Any) -> Session:
        return await hub.session(request.session_id)

    async def tools(r: f.Tools) -> list[Tool]:
        return m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()

    async def run_tool(r: f.RunTool) -> str:
        from .tools import dispatch

        available = m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()
        return await dispatch(available, r.name, r.arguments)

    async def ping(r: f.Ping) -> str:
        return "pong"

    async def get_turn(r: f.GetTurn) -> dict[str, Any] | None:
        await hub.session(r.session_id)
        return hub.turns.describe(hub.turns.in_flight(r.session_id))

    async def start_turn(r: f.StartTurn) -> dict[str, Any] | None:
        return hub.turns.describe(await hub.turns.start(r.session_id, r.message_id or r.leaf_id, r.trigger))

    ops: dict[str, Callable[[Any], Awaitable[Any]]] = {
        "create": lambda r: m.create(r.name, r.parent_session_id, r.model, r.source),
        "get": lambda r: m.get(r.session_id),
        "list": lambda r: m.list(),
        "rename": lambda r: m.rename(r.session_id, r.name),
        "delete": lambda r: m.delete(r.session_id),
        "append": lambda r: m.append(r.session_id, r.message, _parent(r.parent_id)),
        "upsert": lambda r: m.upsert(r.session_id, r.message, _parent(r.parent_id)),
        "append_all": lambda r: m.append_all(r.session_id, r.messages, _parent(r.parent_id)),
        "get_history": lambda r: m.get_history(r.session_id, r.leaf_id),
        "get_branches": lambda r: m.get_branches(r.session_id, r.message_id),
        "get_message_count": lambda r: m.get_message_count(r.session_id),
        "clear_messages": lambda r: m.clear_messages(r.session_id),
        "delete_messages": lambda r: m.delete_messages(r.session_id, r.ids),
        "fork": lambda r: m.fork(r.session_id, r.at_message_id, r.name),
        "add_compaction": lambda r: m.add_compaction(r.session_id, r.summary, r.from_id, r.to_id),
        "get_compactions": lambda r: m.get_compactions(r.session_id),
        "compact_and_split": lambda r: m.compact_and_split(r.session_id, r.summary, r.name),
        "add_usage": lambda r: m.add_usage(r.session_id, r.input_tokens, r.output_tokens, r.cost),
        "search": lambda r: m.search(r.query, r.limit),
        "tools": tools,
        "run_tool": run_tool,
        "ping": ping,
        "start_turn": start_turn,
        "get_turn": get_turn,
    }

    def on_session(name: str, call: Callable[[Session, Any], Awaitable[Any]]) -> None:
        async def run(r: Any) -> Any:
            return await call(await session_op(r), r)

        ops[name] = run

    on_session("get_message", lambda s, r: s.get_message(r.message_id))
    on_session("get_latest_leaf", lambda s, r: s.get_latest_leaf())
    on_session("get_path_length", lambda s, r: s.get_path_length(r.leaf_id))
    on_session("update_message", lambda s, r: s.update_message(r.message))
    on_session("session_search", lambda s, r: s.search(r.query, r.limit))
    on_session("get_context_blocks", lambda s, r: s.get_context_blocks())
    on_session("get_context_block", lambda s, r: s.get_context_block(r.label))
    on_session("replace_context_block", lambda s, r: s.replace_context_block(r.label, r.content))
    on_session("append_context_block", lambda s, r: s.append_context_block(r.label, r.content))
    on_session("freeze_system_prompt", lambda s, r: s.freeze_system_prompt())
    on_session("refresh_system_prompt", lambda s, r: s.refresh_system_prompt())
    on_session("compact", lambda s, r: s.compact(r.leaf_id))
    missing = set(f.REQUEST_TYPES) - set(ops) - {"subscribe", "unsubscribe", "hello", "presence", "summary"}
    missing -= {"take_turns", "turn_failed"}
    missing -= {"stream_start", "stream_delta", "stream_end"}
    assert not missing, f"ops without a handler: {missing}"
    return ops


def create_app(
    *,
    db: str | Path = "sessionhub.db",
    bus: str | Bus | None = None,
    store: Store | None = None,
    manager: SessionManager | None = None,
    config: HubConfig | None = None,
    worker_summarizer: WorkerSummarizer | None = None,
) -> Starlette:
    """The hub as a Starlette app, mountable in your own.

    Pass ``manager`` (configured with context templates, compaction...) or ``store`` to
    share ones you own (they are not closed on shutdown), or ``db`` (a SQLite path or a
    ``postgresql://`` DSN) and ``bus`` (``memory``, ``postgres``, a ``redis://`` URL or a
    :class:`~hub.bus.Bus`; see :mod:`hub.backends`) to have the app open and close them.
    ``app.state.hub`` is the running :class:`Hub`.
    """
    settings = config or HubConfig()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            if manager is not None:
                active = manager
            else:
                opened = (
                    store if store is not None else await stack.enter_async_context(open_backend(db, bus))
                )
                active = SessionManager(opened)
            hub = Hub(active.store, active, settings, worker_summarizer)
            app.state.hub = hub
            try:
                yield
            finally:
                await hub.drain()

    async def healthz(request: HttpRequest) -> JSONResponse:
        hub: Hub = request.app.state.hub
        if hub.closing:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        # A real read, so a broken database shows up here and not on the first user.
        await hub.store.get_session("")
        body: dict[str, Any] = {"status": "ok", "connections": len(hub.connections)}
        ring = hub.store.bus
        if isinstance(ring, RemoteBus):
            body["bus"] = {
                "kind": type(ring).__name__,
                "connected": ring.connected,
                "reconnects": ring.reconnects,
            }
            if not ring.connected:
                # Still serving (followers poll the log meanwhile), but a balancer should know.
                body["status"] = "degraded"
                return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    async def metrics(request: HttpRequest) -> Response:
        hub: Hub = request.app.state.hub
        return Response(generate_latest(hub.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def ws(websocket: WebSocket) -> None:
        hub: Hub = websocket.app.state.hub
        if not _origin_allowed(websocket, hub.config.allowed_origins):
            await websocket.close(1008, "origin not allowed")  # before accept: HTTP 403
            return
        if hub.closing:
            # Accept, then close with 1001: a close before accepting is an HTTP 403, which a
            # client must read as "refused", not as "try again elsewhere".
            await websocket.accept()
            await websocket.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
            return
        await hub.serve(websocket)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/metrics", metrics),
        WebSocketRoute("/ws", ws),
        *chat_routes(),  # POST /api/chat, GET /api/chat/{id}/stream (hub/chat_http.py)
    ]
    # The browser inspector and the JS client (web/, see docs/inspector.md): static files,
    # no build step, mounted last so that every other route wins.
    web = Path(__file__).resolve().parent.parent / "web"
    if web.is_dir():
        routes.append(Mount("/", app=StaticFiles(directory=web, html=True), name="web"))
    return Starlette(routes=routes, lifespan=lifespan)
