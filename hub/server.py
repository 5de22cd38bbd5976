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
import ipaddress
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
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
from .logfilter import install_log_filters
from .manager import SessionManager
from .mcp import create_endpoint as create_mcp_endpoint
from .relay import Relay
from .retention import Retention
from .session import Session
from .static import WEB_DIR, InspectorFiles
from .store.base import LATEST, REGISTRY, ParentArg, Store, session_stream
from .streams import Streams
from .tools import Tool
from .turns import Turns
from .workers import WorkerSummarizer

__all__ = ["HubConfig", "create_app"]

log = logging.getLogger("sessionhub.server")

#: Close code for a subscriber evicted because it does not read fast enough.
CLOSE_SLOW_CONSUMER = 4008
#: Close code for a connection whose token reached its ``exp`` without an ``auth`` renewal.
CLOSE_TOKEN_EXPIRED = 4001
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


@dataclass(frozen=True)
class HubConfig:
    """Limits of one hub (docs/security.md, "Limits").

    Every buffer is bounded in bytes as well as in frames: a connection's outbox
    (``outbox_bytes``), the replies waiting for room in it (``outbox_bytes`` again), the
    backlog a catching-up subscription holds (``replay_bytes``), each stream's tail cache
    (``tail_bytes``), and all of it across the hub (``outbox_bytes_total``,
    ``tail_bytes_total``). ``send_timeout`` is how long a full outbox may stay full before
    the peer is evicted (close code 4008); ``close_grace`` how long an evicted peer has to
    take the close frame before its transport is aborted."""

    max_frame_bytes: int = 1 << 20
    #: HS256 secret: when set, every WebSocket request needs a token granting it.
    auth_secret: str | None = None
    #: Origins a browser may connect from, besides loopback ones and the bind host's
    #: (docs/security.md); their hosts are names of the hub too. ``*``: any.
    allowed_origins: tuple[str, ...] = ()
    #: The address the hub listens on (``--host``): without a secret, a Host header must
    #: name it, a loopback name, or an allowed origin's host.
    bind_host: str | None = None
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
    #: Unsent frames one connection may hold (its outbox).
    outbox_bytes: int = 16 << 20
    #: Unsent bytes of all connections together (outboxes, waiting replies, replay
    #: batches); past it the connection holding the most is evicted.
    outbox_bytes_total: int = 1 << 30
    #: Encoded event frames one stream's tail keeps in memory.
    tail_bytes: int = 8 << 20
    #: Tail caches of all streams together; past it the largest caches shrink.
    tail_bytes_total: int = 256 << 20
    #: Backlog one connection's catching-up subscriptions hold, read from the log.
    replay_bytes: int = 8 << 20
    #: Requests of one connection running or waiting to be answered; at the bound the
    #: hub stops reading that socket until replies go out.
    max_in_flight: int = 64
    #: How long an evicted peer has to take its close frame before the TCP connection is cut.
    close_grace: float = 5.0
    #: How long a turn waits for a responder to start answering it (hub/turns.py).
    turn_timeout: float = 30.0
    #: Event retention (hub/retention.py): prune events older than this many seconds,
    #: and beyond the newest N of each log, every ``retention_interval`` s. None: keep.
    retain_events: float | None = None
    retain_events_per_session: int | None = None
    retention_interval: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_subscriptions",
            "queue_frames",
            "tail_events",
            "backlog_batch",
            "outbox_bytes",
            "outbox_bytes_total",
            "tail_bytes",
            "tail_bytes_total",
            "replay_bytes",
            "max_in_flight",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"HubConfig.{name} must be at least 1, not {getattr(self, name)}")
        for name in ("send_timeout", "close_grace", "shutdown_grace", "turn_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HubConfig.{name} must be more than 0, not {getattr(self, name)}")


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
            "sessionhub_evictions",
            "Connections evicted (close code 4008): too slow, or over a byte limit; once each",
            registry=self.registry,
        )
        self.tail_evictions = Counter(
            "sessionhub_tail_evictions",
            "Events dropped from tail caches to stay within tail_bytes or tail_bytes_total",
            registry=self.registry,
        )
        self.reads_paused = Counter(
            "sessionhub_reads_paused",
            "Times a connection's socket stopped being read: max_in_flight requests unanswered",
            registry=self.registry,
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

    def watch_held(self, held: Held) -> None:
        """Export the bytes the hub holds for its peers (read at scrape time)."""
        for name, help_, attr in (
            ("sessionhub_outbox_bytes", "Frames queued in outboxes, in bytes", "outbox"),
            ("sessionhub_waiting_bytes", "Replies waiting for room in an outbox, in bytes", "waiting"),
            ("sessionhub_replay_bytes", "Backlog held by catching-up subscriptions, in bytes", "replay"),
            ("sessionhub_tail_bytes", "Event frames cached by stream tails, in bytes", "tail"),
        ):
            gauge = Gauge(name, help_, registry=self.registry)
            gauge.set_function(functools.partial(_read_held, held, attr))

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


def _read_held(held: Held, attr: str) -> float:
    return float(getattr(held, attr))


# -- stream tails --------------------------------------------------------------------------


class Held:
    """Bytes the hub holds for its peers, summed over connections and tails: what
    ``outbox_bytes_total`` and ``tail_bytes_total`` bound and ``/metrics`` shows."""

    __slots__ = ("outbox", "replay", "tail", "waiting")

    def __init__(self) -> None:
        self.outbox = 0
        self.waiting = 0
        self.replay = 0
        self.tail = 0

    @property
    def unsent(self) -> int:
        return self.outbox + self.waiting + self.replay


def frame_cost(data: str | None) -> int:
    """What a queued frame costs: its characters (the JSON is ASCII but for non-ASCII text,
    and CPython stores an ASCII str in one byte a character) and the str header."""
    return 0 if data is None else len(data) + _STR_HEADER


#: sys.getsizeof("") on 64-bit CPython: the header of a compact ASCII str.
_STR_HEADER = 49


class Outbox:
    """One connection's bounded FIFO of outgoing frames, bounded in frames (``maxsize``)
    and in bytes (``max_bytes``; an empty outbox takes one frame of any size, or a large
    reply could never be sent).

    ``asyncio.Queue`` allocates three deques and an event up front (about 2.5 KiB); this
    allocates its deque when a frame is queued and drops it when drained, so an idle
    subscriber costs less (docs/benchmarks.md). What the hub uses: ``put_nowait`` raises
    ``asyncio.QueueFull``, ``put`` waits for room, ``get_nowait`` raises
    ``asyncio.QueueEmpty``, ``close`` drops everything (an evicted peer's frames go at once)."""

    __slots__ = ("_items", "_putters", "bytes", "closed", "held", "max_bytes", "maxsize")

    def __init__(self, maxsize: int, max_bytes: int = 1 << 62, held: Held | None = None) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self.held = held if held is not None else Held()
        self.bytes = 0
        self.closed = False
        self._items: collections.deque[str | None] | None = None
        self._putters: list[asyncio.Future[None]] | None = None

    def qsize(self) -> int:
        return 0 if self._items is None else len(self._items)

    def fits(self, item: str | None, *, count_frames: bool = True) -> bool:
        if not self._items:
            return True
        if count_frames and len(self._items) >= self.maxsize:
            return False
        return self.bytes + frame_cost(item) <= self.max_bytes

    def put_nowait(self, item: str | None, *, count_frames: bool = True) -> None:
        """Queue ``item`` if it fits; ``count_frames=False``: bounded by bytes only."""
        if self.closed:
            return  # the peer was evicted: nothing more is sent to it
        if not self.fits(item, count_frames=count_frames):
            raise asyncio.QueueFull
        if self._items is None:
            self._items = collections.deque()
        self._items.append(item)
        cost = frame_cost(item)
        self.bytes += cost
        self.held.outbox += cost

    async def put(self, item: str | None) -> None:
        while not self.closed and not self.fits(item):
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
        cost = frame_cost(item)
        self.bytes -= cost
        self.held.outbox -= cost
        if not self._items:
            self._items = None
        if self._putters:
            for waiter in self._putters:
                if not waiter.done():
                    waiter.set_result(None)
                    break
        return item

    def close(self) -> None:
        """Drop every queued frame and refuse new ones; waiting putters return."""
        self.closed = True
        self.held.outbox -= self.bytes
        self.bytes = 0
        self._items = None
        for waiter in self._putters or ():
            if not waiter.done():
                waiter.set_result(None)


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
    whoever is behind it."""

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
        self.changed = asyncio.Event()
        self.users = 0
        self.task: asyncio.Task[None] | None = None
        self.live: dict[int, _Live] = {}
        self.on_delivered: Callable[[int], None] = lambda n: None
        #: Called with the change in cached bytes and the number of entries dropped.
        self.on_resized: Callable[[Tail, int, int], None] = lambda tail, delta, dropped: None

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
            self.clear()

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
                self.clear()
                self.last_seq = exc.last_seq
                events = []
            except Exception:
                log.exception("reading the log of %s failed; retrying", self.stream)
                await asyncio.sleep(0.5)
                continue
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
                self._push(entries)
            waiter, self.changed = self.changed, asyncio.Event()
            waiter.set()

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

    def _push(self, entries: list[Entry]) -> None:
        delivered = 0
        for key, live in list(self.live.items()):
            for seq, epoch, data in entries:
                if seq <= live.seq:
                    continue
                if epoch != live.epoch or not live.connection.try_put(data):
                    del self.live[key]
                    live.resume(live)
                    break
                live.seq = seq
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


# -- connections ---------------------------------------------------------------------------


class Evicted(Exception):
    pass


#: Where the ASGI server's transport is kept in a WebSocket's scope (see ``_KeepTransport``).
TRANSPORT = "sessionhub.transport"


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

    def __init__(self, hub: Hub, websocket: WebSocket) -> None:
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
        self.parked: dict[StreamKey, _Live] = {}  # live subscriptions, whose task has ended
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
        self._kick()
        if self.hub.held.unsent > self.hub.config.outbox_bytes_total:
            self.hub.check_total()

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
        if isinstance(parsed, f.Auth):
            # Here, not in a task: the requests read after it are judged by the new grant.
            self._spawn(self.send(self._auth(parsed)))
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
            try:
                answered = workers is not None and workers.answer(self, parsed)
            except Forbidden:  # asked, but its token no longer allows it
                self._spawn(self.send(f.ErrorFrame(id=parsed.id, code="forbidden", message="forbidden")))
                return
            if answered:
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
        if isinstance(request, f.Ping | f.Auth):  # auth checks the token it brings
            return True
        if self.grant is None or self.grant.expired():
            return False
        if isinstance(request, f.Hello):  # any valid token; each session named is checked
            if request.summarizer and not self.grant.summarizes():
                return False  # a summarizer needs write somewhere (prompts: on their session)
            return all(self.grant.allows("presence", sid) for sid in request.sessions)
        if isinstance(request, f.Summary | f.TakeTurns | f.TurnFailed):
            # Answers only what this connection was asked (and, with auth, a summary only
            # while the token allows summarizing its session); turns check the grant.
            return True
        op = str(type(request).__struct_config__.tag)
        session_id = getattr(request, "session_id", None)
        registry = isinstance(request, f.Subscribe | f.Unsubscribe) and session_id is None
        return self.grant.allows(op, session_id if isinstance(session_id, str) else None, registry=registry)

    # -- the token -----------------------------------------------------------------------
    def set_grant(self, grant: Grant | None) -> None:
        """Make ``grant`` this connection's. When it expires, unless an ``auth`` request
        has replaced it, the socket is closed with 4001: nothing, not even a subscription
        opened before, outlives the token."""
        self.grant = grant
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if grant is not None and not self.closed:
            self._watch_expiry(grant)

    def _watch_expiry(self, grant: Grant) -> None:
        delay = max(0.0, grant.expires_at - time.time())
        self.expiry = asyncio.get_running_loop().call_later(delay, self._expired, grant)

    def _expired(self, grant: Grant) -> None:
        self.expiry = None
        if self.closed or self.grant is not grant:
            return
        if time.time() < grant.expires_at:  # the loop's clock ran ahead of the wall clock
            self._watch_expiry(grant)
            return
        reason = "token expired: connect with a new token, or renew it (auth) before exp"
        self._spawn(self.close(CLOSE_TOKEN_EXPIRED, reason))

    def may_summarize(self, session_id: str | None) -> bool:
        """Whether this connection may be sent summary prompts about ``session_id`` (None:
        a session not named, judged on ``*``) and answer them: ``write`` on it."""
        if self.hub.config.auth_secret is None:
            return True
        return self.grant is not None and self.grant.allows("summarize", session_id)

    def _auth(self, request: f.Auth) -> f.ReplyFrame | f.ErrorFrame:
        """Replace the grant with the token's, if it verifies; end what it does not cover."""
        secret = self.hub.config.auth_secret
        if secret is None:  # no auth: tokens are not checked and nothing expires
            return f.ReplyFrame(id=request.id, result={"sub": None, "exp": None, "ended": []})
        try:
            grant = verify_token(secret, request.token)
        except Forbidden:
            return f.ErrorFrame(id=request.id, code="forbidden", message="forbidden")
        self.set_grant(grant)
        ended = self._end_uncovered(grant)
        result = {"sub": grant.subject, "exp": int(grant.expires_at), "ended": ended}
        return f.ReplyFrame(id=request.id, result=result)

    def _end_uncovered(self, grant: Grant) -> list[StreamKey]:
        """End the subscriptions and presence announcements ``grant`` does not allow; the
        streams ended (the ``auth`` reply lists them: no event of theirs follows it)."""
        ended: list[StreamKey] = []
        for key in list(dict.fromkeys([*self.subscriptions, *self.parked])):
            if grant.allows("subscribe", key, registry=key is None):
                continue
            ended.append(key)
            if key is not None:
                self.presence_watch = self.presence_watch - {key}
            task = self.subscriptions.pop(key, None)
            if task is not None:
                task.cancel()  # its done callback does the bookkeeping
            if self._unpark(key) and task is None:
                self._subscription_done(key)
        for sid in self.announced:
            if not grant.allows("presence", sid):
                self.announced = self.announced - {sid}
                if not self.follows(sid):
                    self.hub.leave(self, sid)
        return ended

    def _spawn(self, coro: Awaitable[object]) -> None:
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
            frame = _error_frame(request.id, exc)
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
            frame = _error_frame(request.id, exc)
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
            await self.send(_error_frame(request.id, exc))
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
        largest = tail.largest  # of the frames seen: sizes the next batch read from the log
        try:
            while True:
                waiter = tail.changed
                events = tail.after(seq)
                replaying = events is None
                if events is None:
                    try:
                        backlog = await store.read_events(stream, seq, self._batch(tail, largest))
                    except PositionLost as exc:
                        await self._reset(key, seq, exc.epoch, exc.first_seq, exc.last_seq)
                        return
                    events = [(e.seq, e.epoch, encode(event_frame(e)).decode()) for e in backlog]
                    del backlog
                    largest = max((len(data) for _, _, data in events), default=largest)
                    held = sum(frame_cost(data) for _, _, data in events)
                    self.replay += held
                    self.hub.held.replay += held
                    if self.hub.held.unsent > self.hub.config.outbox_bytes_total:
                        self.hub.check_total()
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
                batch = collections.deque(events)
                events = None  # the deque holds what is not sent yet, and lets go of the rest
                try:
                    while batch:
                        event_seq, event_epoch, data = batch.popleft()
                        if replaying:
                            held = frame_cost(data)
                            self.replay -= held
                            self.hub.held.replay -= held
                        if epoch is None:
                            epoch = event_epoch
                        if event_epoch != epoch:
                            current = await store.stream_position(stream)
                            await self._reset(key, seq, current.epoch, current.first_seq, current.last_seq)
                            return
                        await self.send_text(data, reply=False)
                        sent += 1
                        seq = event_seq
                finally:
                    self.hub.metrics.delivered.inc(sent)  # once per batch: the counter takes a lock
                    if replaying and batch:
                        held = sum(frame_cost(data) for _, _, data in batch)
                        self.replay -= held
                        self.hub.held.replay -= held
                    batch.clear()
        except Evicted:
            return
        finally:
            if not parked:
                self.hub.tails.release(tail)

    def _batch(self, tail: Tail, largest: int) -> int:
        """How many events to read from the log: what fits in the connection's
        ``replay_bytes`` left, judged by the largest frame seen, at least one (progress),
        at most ``backlog_batch``; a few while nothing is known of the stream's sizes."""
        config = self.hub.config
        if largest <= 0:
            return min(config.backlog_batch, 8)
        room = config.replay_bytes - self.replay
        return max(1, min(config.backlog_batch, room // (largest + _STR_HEADER)))

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


def _abort_if_stuck(transport: asyncio.WriteTransport) -> None:
    """A grace period is over: a peer that has not read its close frame by now never will,
    and a graceful transport close would keep its buffer forever. (A closing transport
    with an empty buffer is gone already: asyncio cannot abort it twice.)"""
    if not transport.is_closing() or transport.get_write_buffer_size():
        transport.abort()


def _code(exc: SessionHubError) -> f.ErrorCode:
    code = exc.code
    return code if code in f.ERROR_CODES else "internal"  # type: ignore[return-value]


def _error_frame(request_id: str | int, exc: SessionHubError) -> f.ErrorFrame:
    """The error frame that answers a request the engine refused, with the exception's
    ``detail`` so that clients rebuild it (``SessionNotFound(session_id)``) without parsing."""
    return f.ErrorFrame(id=request_id, code=_code(exc), message=str(exc), detail=exc.detail)


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
        self.held = Held()
        self.metrics.watch_held(self.held)
        self.tails = Tails(store, config.tail_events, config.tail_bytes, config.tail_bytes_total, self.held)
        self.tails.on_delivered = self.metrics.delivered.inc
        self.tails.on_dropped = self.metrics.tail_evictions.inc
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
        self.retention = Retention(
            store,
            self.metrics.registry,
            older_than=None if config.retain_events is None else timedelta(seconds=config.retain_events),
            keep_per_session=config.retain_events_per_session,
            interval=config.retention_interval,
        )
        self.retention.start()
        self.ops: dict[str, Callable[[Any], Awaitable[Any]]] = _operations(self)

    def check_total(self) -> None:
        """Over ``outbox_bytes_total``: evict the connections holding the most unsent bytes
        until the hub is back under it, rather than refusing frames to everyone."""
        limit = self.config.outbox_bytes_total
        # What an evicted connection still holds (a reply waiting, a batch being dropped)
        # goes as its tasks end: count it as gone now, or one overflow would evict several.
        excess = self.held.unsent - limit
        while excess > 0:
            heaviest = max(
                (c for c in self.connections if not c.closed), key=lambda c: c.unsent, default=None
            )
            if heaviest is None or heaviest.unsent == 0:
                return
            excess -= heaviest.unsent
            heaviest.evict(
                f"slow consumer: the hub holds over {limit} unsent bytes, this connection the most; "
                "resume from your last seq"
            )

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
        await self.retention.close()
        await self.turns.close()
        await self.tails.close()
        if self.relay is not None:
            await self.relay.close()

    async def serve(self, websocket: WebSocket) -> None:
        token, subprotocol = _token_of(websocket)
        await websocket.accept(subprotocol=subprotocol)
        connection = Connection(self, websocket)
        if self.config.auth_secret is not None:
            # A bad token does not close the socket: each request is answered `forbidden`
            # (an `auth` request may still bring a good one).
            with contextlib.suppress(Forbidden):
                connection.set_grant(verify_token(self.config.auth_secret, token))
        connection.serve_task = asyncio.current_task()
        self.connections.add(connection)
        self.metrics.connections.inc()
        in_flight = self.config.max_in_flight
        try:
            while not connection.closed:
                if len(connection.requests) >= in_flight:
                    # Backpressure: leave the next frames in the socket (uvicorn pauses
                    # reading until we receive) until replies have gone out.
                    await connection.wait_for_room()
                    continue
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
            if connection.closer is not None:
                # Returning from the app would close the transport before the close frame.
                with contextlib.suppress(BaseException):
                    await asyncio.shield(connection.closer)
            connection.closed = True
            if connection.expiry is not None:  # no expiry timer outlives the connection
                connection.expiry.cancel()
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


class _KeepTransport:
    """ASGI middleware: keep the server's transport in a WebSocket's scope, so that an
    evicted peer that reads nothing, not even its close frame, can be cut off. uvicorn
    passes its protocol's bound ``send``, whose ``transport`` this is; under another
    server nothing is kept and eviction ends the app instead."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if isinstance(transport, asyncio.WriteTransport):
                scope[TRANSPORT] = transport
        await self.app(scope, receive, send)


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


# -- Origin and Host (docs/security.md) -----------------------------------------------------

_WILDCARD_HOSTS = {"", "0.0.0.0", "::"}


def _hostname(netloc: str) -> str | None:
    """The lowercased host of ``host[:port]`` (brackets of an IPv6 literal dropped), or
    None when it is not a well-formed authority."""
    try:
        parts = urlsplit("//" + netloc)
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None or parts.path:
        return None
    return parts.hostname or None


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    address = _ip(host)
    return host == "localhost" if address is None else address.is_loopback


def _bind_host(config: HubConfig) -> str | None:
    host = config.bind_host
    if host is None:
        return None
    host = host.strip().strip("[]").lower()
    return None if host in _WILDCARD_HOSTS else host


def _is_hub_name(host: str, config: HubConfig) -> bool:
    """Whether ``host`` (from a Host header) names this hub: a loopback name or address,
    the bind host, an allowed origin's host, or, on a wildcard bind (``0.0.0.0``), any IP
    address (a rebinding page always sends its own DNS name, never an address)."""
    if _is_loopback(host) or host == _bind_host(config):
        return True
    wildcard = config.bind_host is not None and config.bind_host.strip().strip("[]") in _WILDCARD_HOSTS
    if wildcard and _ip(host) is not None:
        return True
    return any(_origin_host(o) == host for o in config.allowed_origins if o != "*")


def _origin_host(origin: str) -> str | None:
    scheme, _, rest = origin.rstrip("/").partition("://")
    if scheme.lower() not in ("http", "https") or not rest:
        return None
    return _hostname(rest)


def _host_allowed(host: str | None, config: HubConfig) -> bool:
    """The Host rule: with a secret the token is what counts (a proxy may use any name);
    without one, a Host that is not one of the hub's names is a page that rebound its DNS
    name to this address."""
    if config.auth_secret is not None or "*" in config.allowed_origins or host is None:
        return True
    name = _hostname(host)
    return name is not None and _is_hub_name(name, config)


def _origin_allowed(websocket: WebSocket, config: HubConfig) -> bool:
    """Non-browser clients send no Origin and are judged by their token alone. A browser's
    Origin must be one of ``allowed_origins`` (``*``: any), or have a loopback host (any
    port) or the bind host. Its match with the Host header counts only for an IP address
    (the hub reached by address on a wildcard bind) or with a secret set (behind a proxy;
    a page without a token gets nothing)."""
    origin = websocket.headers.get("origin")
    if origin is None:
        return True
    allowed = {o.rstrip("/").lower() for o in config.allowed_origins}
    if origin.lower() in allowed or "*" in allowed:
        return True
    host = _origin_host(origin)
    if host is None:  # "null" (a sandboxed frame, a file), or not a web origin
        return False
    if _is_loopback(host) or host == _bind_host(config):
        return True
    same = origin.split("://", 1)[-1].lower() == websocket.headers.get("host", "").lower()
    return same and (_ip(host) is not None or config.auth_secret is not None)


class _HostCheck:
    """ASGI middleware: requests (HTTP and WebSocket) whose Host is not one of the hub's
    names get 421 and a one-line body, before any route runs (see :func:`_host_allowed`)."""

    BODY = "misdirected request: this hub does not answer to that Host name (see docs/security.md)\n"

    def __init__(self, app: ASGIApp, config: HubConfig) -> None:
        self.app = app
        self.config = config
        self.logged = -60.0  # when a refusal was last logged: one line a minute at most

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host")
            if not _host_allowed(host, self.config):
                if time.monotonic() - self.logged >= 60:
                    self.logged = time.monotonic()
                    log.warning(
                        "421 for Host %.100r: not one of this hub's names (pass --allowed-origin to add one; "
                        "more refusals in the next minute are not logged)",
                        host,
                    )
                response = PlainTextResponse(self.BODY, status_code=421)
                if scope["type"] == "http" or "websocket.http.response" in scope.get("extensions", {}):
                    await response(scope, receive, send)
                else:  # no denial responses: a close before accepting is an HTTP 403
                    await send({"type": "websocket.close", "code": 1008, "reason": "misdirected request"})
                return
        await self.app(scope, receive, send)


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
    missing = (
        set(f.REQUEST_TYPES) - set(ops) - {"subscribe", "unsubscribe", "hello", "presence", "summary", "auth"}
    )
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
    # The MCP endpoint (hub/mcp.py); None when the optional `mcp` package is not installed.
    mcp_endpoint = create_mcp_endpoint()

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
            if mcp_endpoint is not None:
                await stack.enter_async_context(mcp_endpoint.run(hub))
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
        await hub.retention.observe()
        return Response(generate_latest(hub.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def ws(websocket: WebSocket) -> None:
        hub: Hub = websocket.app.state.hub
        if not _origin_allowed(websocket, hub.config):
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
    if mcp_endpoint is not None:
        routes.append(mcp_endpoint.route())
    # The browser inspector and the JS client (web/, see docs/inspector.md): static files,
    # no build step, mounted last so that every other route wins.
    # Only the files the inspector needs (hub/static.py), not web/test/.
    if WEB_DIR.is_dir():
        routes.append(Mount("/", app=InspectorFiles(WEB_DIR), name="web"))
    # uvicorn's traceback per invalid UTF-8 frame becomes one rate-limited line.
    install_log_filters()
    # The Host check first, so a rebound name is refused before anything else runs.
    middleware = [Middleware(_HostCheck, config=settings), Middleware(_KeepTransport)]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
