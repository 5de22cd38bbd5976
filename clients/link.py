"""`HubLink`: the socket under a :class:`~clients.client.HubClient`, kept open across drops.

One socket, one reader task. The reader hands each frame to the sans-I/O
:class:`protocol.connection.ClientConnection` and performs the effect it returns: a reply
resolves its request's future, an event goes to its subscription's queue, a reset
resubscribes or raises, a ``turn`` goes to the responder's queue, a ``summarize`` is
answered.

Reconnects: when the socket drops, requests in flight fail with :class:`ConnectionLost`
(they are not retried: a request may have run before the socket went away), the client
reconnects with jittered exponential backoff (capped by ``max_backoff``), and every
subscription resumes from the last event it delivered: each event is delivered exactly once,
in order. Requests made while the client is reconnecting wait for the new socket (up to
``open_timeout`` seconds). Any close is retried (a draining hub's 1001 included, even when it
comes in the middle of the handshake) except the permanent ones: a handshake refused 401/403,
a bad URL, and 4001 (token expired) until :meth:`HubClient.renew`. Given several hub URLs,
each new attempt goes to the next one, so a client fails over without a balancer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection as Socket
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from protocol import Event, InvalidInput, SessionHubError
from protocol.clientconn import (
    ClientConnection,
    ClientEffect,
    Delivered,
    Dumped,
    Failed,
    Ignored,
    PresenceChanged,
    Reset,
    Resolved,
    Streamed,
    Subscribed,
    SubscribeFailed,
    SummaryWanted,
    TurnGiven,
    TurnNews,
    TurnStopped,
    Unsubscribed,
)
from protocol.frames import EventFrame, PresenceFrame, StreamFrame, SummarizeFrame
from protocol.serverconn import StreamKey

from .errors import CLOSE_TOKEN_EXPIRED, ConnectionLost, HubError, TokenExpired, error_from, position_lost
from .turns import TurnQueue

__all__ = ["END", "MAX_FRAME_BYTES", "End", "HubLink", "Socket", "Subscription", "closed_error"]

log = logging.getLogger("sessionhub.client")

#: The largest frame the client accepts (a long history is one reply).
MAX_FRAME_BYTES = 16 * 1024 * 1024

_FIRST_BACKOFF = 0.05
#: A connection that stayed up this long resets the backoff: the next reconnect is immediate.
_STABLE_AFTER = 1.0
#: How long the client waits before it subscribes again to a stream the hub ended because it
#: could not read the log (an ``unsubscribed`` frame): the database is likely still down.
_RESUBSCRIBE_AFTER = 1.0

#: What a failed attempt to open a socket raises when another attempt may succeed: the hub
#: unreachable, a handshake it answered with a non-101 status other than 401/403, or a close
#: while the handshake's frames went out (a draining hub accepts and closes with 1001).
_TRANSIENT = (OSError, TimeoutError, InvalidHandshake, ConnectionClosed)


def _url_list(url: str | Sequence[str]) -> list[str]:
    urls = [url] if isinstance(url, str) else list(url)
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise InvalidInput(f"HubClient needs one hub URL or a non-empty list of them, not {url!r}")
    return urls


def _event(frame: EventFrame) -> Event:
    return Event(
        session_id=frame.session_id,
        seq=frame.seq,
        epoch=frame.epoch,
        type=frame.type,
        data=frame.data,
        created_at=datetime.fromisoformat(frame.created_at),
        stream=frame.stream,
    )


async def _notify(callback: Callable[[Any], Any] | None, frame: Any) -> None:
    """Call a user's frame callback (sync or async); its failure is logged, not raised."""
    if callback is None:
        return
    try:
        outcome = callback(frame)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("%r failed on %s", callback, type(frame).__name__)


# -- subscriptions -------------------------------------------------------------------------


class End:
    """Queued when the client closes: the subscription ends without an error."""


END = End()


@dataclass(eq=False)
class Subscription:
    key: StreamKey
    queue: asyncio.Queue[Event | BaseException | End] = field(default_factory=asyncio.Queue)
    closing: bool = False
    closed: asyncio.Event = field(default_factory=asyncio.Event)


# -- the link ------------------------------------------------------------------------------


class HubLink:
    """The socket of a :class:`~clients.client.HubClient` (which documents the arguments)
    and the reader that performs what comes in on it; see the module."""

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        name: str | None = None,
        role: str | None = None,
        *,
        reconnect: bool = True,
        max_backoff: float = 5.0,
        open_timeout: float = 10,
        sessions: Sequence[str] = (),
        on_presence: Callable[[PresenceFrame], Any] | None = None,
        summarize: Callable[[str], Any] | None = None,
        on_stream: Callable[[StreamFrame], Any] | None = None,
    ) -> None:
        self.urls = _url_list(url)
        self._at = 0  # index in urls of the current (or next) attempt
        self.token = token
        self.name = name
        self.role = role
        self.present_on = list(sessions)
        self.on_presence = on_presence
        #: ``summarize(prompt) -> str`` (sync or async): this client writes summaries the hub
        #: asks for (a worker; see ``hub.server.workers.WorkerSummarizer``).
        self.summarize = summarize
        #: ``on_stream(frame)`` (sync or async): each streamed-message frame of a subscribed
        #: session (feed them to a :class:`LiveMessages`).
        self.on_stream = on_stream
        self._background: set[asyncio.Task[None]] = set()
        self._turns: TurnQueue | None = None  # set while turns() is iterated
        self.reconnect = reconnect
        self.max_backoff = max_backoff
        self.open_timeout = open_timeout
        #: How many times the socket was re-opened after a drop.
        self.reconnects = 0
        self._protocol = ClientConnection()
        self._socket: Socket | None = None
        self._connected = asyncio.Event()
        self._futures: dict[str | int, asyncio.Future[Any]] = {}
        #: Streamed requests (``export``): their frames' lines, then END after the reply.
        self._batches: dict[str | int, asyncio.Queue[list[str] | End]] = {}
        self._subscriptions: dict[StreamKey, Subscription] = {}
        self._supervisor: asyncio.Task[None] | None = None
        self._closed = False
        #: Set when the client cannot go on (a refused reconnect, a drop without reconnect):
        #: makes the error every later request raises.
        self._failure: Callable[[], SessionHubError] | None = None
        #: The token the hub holds for the current socket (sent when it opened, or renewed).
        self._presented: str | None = None
        #: The hub closed the socket because that token expired (4001): see :meth:`renew`.
        self._expired = False
        #: Why the last socket ended (close code and reason): a request that finds no socket
        #: within ``open_timeout`` says it (a full hub's 1013, a draining one's 1001).
        self._last_close: str | None = None

    @property
    def url(self) -> str:
        """The hub URL in use (or tried next, while reconnecting)."""
        return self.urls[self._at]

    def _next_url(self) -> None:
        self._at = (self._at + 1) % len(self.urls)

    @property
    def connected(self) -> bool:
        return self._socket is not None

    async def _ready(self) -> Socket:
        """The open socket, waiting for a reconnect up to ``open_timeout``."""
        if self._socket is not None:
            return self._socket
        if self._supervisor is None and not self._closed:
            raise ConnectionLost("the client is not connected: use `async with HubClient(...)`")
        deadline = time.monotonic() + self.open_timeout
        while self._socket is None:
            self._check_usable()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = "" if self._last_close is None else f"; the last one ended {self._last_close}"
                raise ConnectionLost(f"no connection to the hub within {self.open_timeout:g}s{last}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._connected.wait(), remaining)
        return self._socket

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise self._failure()
        if self._closed:
            raise ConnectionLost("the client is closed")

    def _forget(self, rid: str | int, future: asyncio.Future[Any]) -> None:
        """The caller is done with the request (answered, failed or cancelled)."""
        if self._futures.get(rid) is future:
            del self._futures[rid]
        self._protocol.abandon(rid)
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: a failure nobody waits for is not logged

    # -- the socket ----------------------------------------------------------------------
    async def _open_any(self) -> Socket:
        """The first of the URLs (from the current one on) that opens, each tried once."""
        failure: SessionHubError | None = None
        for attempt in range(len(self.urls)):
            if attempt:
                self._next_url()
            try:
                return await self._open()
            except InvalidURI as exc:
                raise self._open_error(exc) from exc
            except _TRANSIENT as exc:
                failure = self._open_error(exc)
                if failure.code == "forbidden":  # every node shares the secret
                    raise failure from exc
                log.debug("connecting to %s failed: %s", self.url, exc)
        assert failure is not None
        raise failure

    async def _open(self) -> Socket:
        """A socket to :attr:`url` with the handshake's frames sent. A close while they go
        out raises ``ConnectionClosed``: the socket is unusable, and another attempt may work."""
        token = self.token
        headers = {"Authorization": f"Bearer {token}"} if token is not None else None
        socket = await connect(
            self.url,
            additional_headers=headers,
            max_size=MAX_FRAME_BYTES,
            open_timeout=self.open_timeout,
        )
        hello = self._protocol.hello(
            self.name, self.role, self.present_on, summarizer=self.summarize is not None
        )
        try:
            if hello is not None:
                await socket.send(hello, text=True)
            if self._turns is not None:  # a responder again after a reconnect
                await socket.send(self._protocol.take_turns(), text=True)
        except BaseException:
            await socket.close()
            raise
        self._presented = token
        return socket

    def _open_error(self, exc: BaseException) -> SessionHubError:
        if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403):
            return HubError("forbidden", f"the hub refused the connection: {exc}")
        if isinstance(exc, InvalidStatus) and exc.response.status_code == 404:
            return ConnectionLost(
                f"no hub endpoint at {self.url} (HTTP 404): the hub's WebSocket is /ws, "
                "e.g. ws://127.0.0.1:8000/ws"
            )
        if isinstance(exc, ConnectionClosed):
            return ConnectionLost(f"the hub at {self.url} closed the connection while it opened: {exc}")
        return ConnectionLost(f"cannot connect to the hub at {self.url}: {exc}")

    def _fail(self, message: str) -> None:
        """Fail every request in flight with :class:`ConnectionLost` and forget the socket."""
        self._socket = None
        self._connected.clear()
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(ConnectionLost(message))
        for queue in self._batches.values():
            queue.put_nowait(END)

    async def _run(self, socket: Socket) -> None:
        try:
            await self._supervise(socket)
        except Exception as exc:  # a bug: fail loudly rather than leave callers waiting
            log.exception("the HubClient reader failed")
            message = f"the client's reader failed: {exc!r}"
            current = self._socket
            self._fail(message)
            self._failure = functools.partial(ConnectionLost, message)
            self._end_all(self._failure)
            if current is not None:
                with contextlib.suppress(Exception):
                    await current.close()

    async def _supervise(self, socket: Socket) -> None:
        backoff = 0.0
        while True:
            opened = time.monotonic()
            await self._read(socket)
            reason = socket.close_reason or "connection closed"
            message = f"the connection to the hub was lost ({socket.close_code}: {reason})"
            self._last_close = f"({socket.close_code}: {reason})"
            self._fail(message)
            if self._closed:
                return
            if socket.close_code == CLOSE_TOKEN_EXPIRED and self.token == self._presented:
                # Reconnecting with the token that expired would only be refused: stop
                # until renew() brings a new one.
                self._expired = True
                self._failure = functools.partial(
                    TokenExpired,
                    f"the token expired ({socket.close_code}: {reason}); renew() brings a new one",
                )
                self._end_all(self._failure)
                return
            if not self.reconnect:
                self._failure = functools.partial(ConnectionLost, message)
                self._end_all(self._failure)
                return
            backoff = 0.0 if time.monotonic() - opened >= _STABLE_AFTER else _grow(backoff, self.max_backoff)
            while True:
                if backoff:
                    # Jittered, so the clients a node dropped at once do not come back at once.
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                # Each attempt to the next node: the one that dropped us may be draining.
                self._next_url()
                try:
                    socket = await self._open()
                except (*_TRANSIENT, InvalidURI) as exc:
                    if isinstance(exc, InvalidURI) or self._open_error(exc).code == "forbidden":
                        self._failure = functools.partial(self._open_error, exc)
                        self._end_all(self._failure)
                        return
                    log.debug("reconnecting to %s failed: %s", self.url, exc)
                    backoff = _grow(backoff, self.max_backoff)
                    continue
                break
            self.reconnects += 1
            await self._resume(socket)

    async def _resume(self, socket: Socket) -> None:
        # All synchronous up to the first send: the positions resubscribed here are exactly
        # the streams followed when the new socket becomes current.
        frames = self._protocol.resubscribe()
        self._socket = socket
        self._connected.set()
        for _, data in frames:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed:
                return  # the read loop sees the drop and reconnects again

    def _end_all(self, error: Callable[[], SessionHubError]) -> None:
        for subscription in self._subscriptions.values():
            subscription.queue.put_nowait(error())
        self._protocol.clear()

    async def _read(self, socket: Socket) -> None:
        try:
            async for data in socket:
                try:
                    effect = self._protocol.receive_text(data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    log.warning("unreadable frame from the hub: %s", exc)
                    continue
                await self._dispatch(socket, effect)
        except ConnectionClosed:
            pass

    async def _dispatch(self, socket: Socket, effect: ClientEffect) -> None:
        if isinstance(effect, Delivered):
            subscription = self._subscriptions.get(effect.key)
            if subscription is not None:
                subscription.queue.put_nowait(_event(effect.event))
        elif isinstance(effect, Resolved):
            future = self._futures.get(effect.id)
            if future is not None and not future.done():
                future.set_result(effect.result)
            self._batches_end(effect.id)
        elif isinstance(effect, Dumped):
            batches = self._batches.get(effect.id)
            if batches is not None:
                batches.put_nowait(effect.lines)
        elif isinstance(effect, Failed):
            if effect.id is None:
                log.warning("the hub could not read a frame: %s", effect.message)
                return
            if effect.id == "hello":  # sent on every (re)connect, its reply not awaited
                log.warning("the hub refused this client's hello (%s): %s", effect.code, effect.message)
                return
            future = self._futures.get(effect.id)
            if future is not None and not future.done():
                future.set_exception(error_from(effect.code, effect.message, effect.detail))
            self._batches_end(effect.id)
        elif isinstance(effect, SubscribeFailed):
            # The server ended the subscription (unknown session...): so does the client.
            subscription = self._subscriptions.get(effect.key)
            if subscription is not None:
                subscription.queue.put_nowait(error_from(effect.code, effect.message, effect.detail))
        elif isinstance(effect, Reset):
            subscription = self._subscriptions.get(effect.key)
            if subscription is None:
                return
            if effect.resubscribe is None:
                subscription.queue.put_nowait(position_lost(effect.frame))
                return
            with contextlib.suppress(ConnectionClosed):
                await socket.send(effect.resubscribe[1], text=True)
        elif isinstance(effect, Unsubscribed):
            log.warning("the hub ended the subscription to %s: %s", effect.key, effect.frame.message)
            self._spawn(self._resubscribe_later(socket, effect.key))
        elif isinstance(effect, PresenceChanged):
            await _notify(self.on_presence, effect.frame)
        elif isinstance(effect, Streamed):
            await _notify(self.on_stream, effect.frame)
        elif isinstance(effect, SummaryWanted):
            self._spawn(self._write_summary(socket, effect.frame))
        elif isinstance(effect, TurnGiven):
            if self._turns is not None:
                self._turns.given(effect.frame)
        elif isinstance(effect, TurnStopped):
            if self._turns is not None:
                self._turns.stopped(effect.frame)
        elif isinstance(effect, TurnNews):
            if self._turns is not None:
                self._turns.news(effect.frame)
        elif isinstance(effect, Subscribed):
            pass  # the epoch is in the position already; the events follow
        elif isinstance(effect, Ignored):
            log.debug("ignored frame: %s", effect.reason)

    def _batches_end(self, rid: str | int) -> None:
        batches = self._batches.get(rid)
        if batches is not None:
            batches.put_nowait(END)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _resubscribe_later(self, socket: Socket, key: StreamKey) -> None:
        """Follow ``key`` again from its position after a pause, unless the loop left it
        meanwhile or the socket went (a reconnect resubscribes by itself)."""
        await asyncio.sleep(_RESUBSCRIBE_AFTER)
        if (
            self._socket is not socket
            or key not in self._subscriptions
            or key not in self._protocol.positions
        ):
            return
        _, data = self._protocol.subscribe(key)
        with contextlib.suppress(ConnectionClosed):
            await socket.send(data, text=True)

    async def _write_summary(self, socket: Socket, frame: SummarizeFrame) -> None:
        """Answer the hub's ``summarize`` frame with this worker's summary (or its error)."""
        try:
            if self.summarize is None:
                raise RuntimeError("this client does not summarize")
            summary = self.summarize(frame.prompt)
            if inspect.isawaitable(summary):
                summary = await summary
            answer = self._protocol.summary(frame.request_id, summary=str(summary))
        except Exception as exc:
            answer = self._protocol.summary(frame.request_id, error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(ConnectionClosed):
            await socket.send(answer, text=True)


def closed_error(exc: ConnectionClosed) -> ConnectionLost:
    """A send on a socket the hub closed: its close code and reason (a full hub's 1013)."""
    frame = exc.rcvd
    if frame is None:
        return ConnectionLost()
    return ConnectionLost(f"the connection to the hub was lost ({frame.code}: {frame.reason or 'closed'})")


def _grow(backoff: float, cap: float) -> float:
    return min(cap, max(_FIRST_BACKOFF, backoff * 2))
