"""One client socket: its outgoing queue, the frames it sends and receives, its
subscriptions and its token."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket

from protocol import Forbidden, PositionLost, SessionHubError, SessionNotFound
from protocol import frames as f
from protocol.codec import encode
from protocol.connection import ServerConnection, StreamKey

from ..auth import Grant, verify_token
from ..store.base import REGISTRY, session_stream
from .outbox import STR_HEADER, Outbox, frame_cost
from .tails import Live, Tail
from .wire import error_frame, event_frame, wire

if TYPE_CHECKING:
    from .hub import Hub

log = logging.getLogger("sessionhub.server")


#: Close code for a subscriber evicted because it does not read fast enough.
CLOSE_SLOW_CONSUMER = 4008
#: Close code for a connection whose token reached its ``exp`` without an ``auth`` renewal.
CLOSE_TOKEN_EXPIRED = 4001
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003


class Evicted(Exception):
    pass


#: Where the ASGI server's transport is kept in a WebSocket's scope (see ``KeepTransport``).
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
        if isinstance(request, f.Summary):  # answers only what this connection was asked
            return True  # and, with auth, only while the token allows summarizing its session
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
                result: Any = await streams.start(self, request)
            elif isinstance(request, f.StreamDelta):
                result = await streams.delta(self, request)
            else:
                await streams.end(self, request, request.status)
                result = None
            frame: Any = f.ReplyFrame(id=request.id, result=result)
        except SessionHubError as exc:
            frame = error_frame(request.id, exc)
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
            frame = error_frame(request.id, exc)
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
            await self.send(error_frame(request.id, exc))
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

    def _resume(self, key: StreamKey, stream: str, live: Live) -> None:
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
        return max(1, min(config.backlog_batch, room // (largest + STR_HEADER)))

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
