"""`HubClient`: a connection to the hub's WebSocket (``/ws``), kept open across drops.

One socket, one reader task. Requests run concurrently on it (each gets an id, and its reply
resolves a future); events are dispatched to per-stream queues. The protocol state (request
ids, each subscription's ``(epoch, seq)`` and the epoch of its subscribe reply, dropping
events already delivered, resubscribing after a reconnect or a reset with ``reload``,
forgetting a refused subscribe, the ``hello`` and ``summary`` frames) lives in
:class:`protocol.clientconn.ClientConnection`; the socket, its reader and its reconnects
(with backoff, over several URLs) are :class:`~clients.link.HubLink`'s; this module is
the API over them: requests, subscriptions, renewing the token, presence, turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any, Self

import msgspec
from websockets.exceptions import ConnectionClosed

from protocol import Event, InvalidInput, PresenceEntry, SessionHubError
from protocol.clientconn import StreamKey

from .api import RemoteSession, RemoteSessions
from .errors import ConnectionLost, HubError, TokenExpired
from .link import END, MAX_FRAME_BYTES, End, HubLink, Subscription, closed_error
from .remotethreads import RemoteThreads
from .turns import Turn, iterate_turns

__all__ = ["MAX_FRAME_BYTES", "HubClient"]


class HubClient(HubLink):
    """A connection to a hub, kept open across drops.

    ``token`` is sent as ``Authorization: Bearer <token>``; :meth:`renew` replaces it
    before it expires, on the open socket and for every later reconnect. ``name`` and ``role`` (e.g.
    ``"worker"``, ``"observer"``) are announced to the hub on every (re)connect, with the
    ``sessions`` this client is on besides the ones it subscribes to; they are what
    :meth:`presence` lists. With ``on_presence(frame)`` (sync or async), subscriptions
    ask for the session's join/leave frames and it is called for each. With
    ``reconnect=False`` a dropped socket ends the client: subscriptions raise
    :class:`ConnectionLost`, and so does every later request.

    ``url`` is one hub URL or a list of them (the nodes of one deployment, sharing a
    database): the client opens the first that answers, and each reconnect attempt moves on
    to the next, round robin (:attr:`url` is the one in use).
    """

    @functools.cached_property
    def sessions(self) -> RemoteSessions:
        """``SessionManager`` over this client's socket (the same method names and types)."""
        return RemoteSessions(self)

    @functools.cached_property
    def threads(self) -> RemoteThreads:
        """LangGraph threads and their checkpoints through the hub (``manager.threads``
        over this socket; ``clients.langgraph.HubCheckpointSaver(hub)``)."""
        return RemoteThreads(self)

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the socket (raises :class:`ConnectionLost` if the hub cannot be reached)."""
        if self._supervisor is not None:
            return
        if self._closed:
            raise ConnectionLost("the client is closed")
        socket = await self._open_any()
        self._socket = socket
        self._connected.set()
        self._supervisor = asyncio.get_running_loop().create_task(
            self._run(socket), name=f"HubClient {self.url}"
        )

    async def aclose(self) -> None:
        """Close the socket. Requests in flight fail with :class:`ConnectionLost`; running
        subscriptions end (their iterators stop)."""
        if self._closed:
            return
        self._closed = True
        socket = self._socket
        self._fail("the client is closed")
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        if socket is not None:
            await socket.close()
        for subscription in self._subscriptions.values():
            subscription.queue.put_nowait(END)
        if self._turns is not None:
            self._turns.end()

    # -- requests ------------------------------------------------------------------------
    async def request(self, op: str, **fields: Any) -> Any:
        """Send one request and return its reply's ``result`` (raw JSON data). Raises the
        engine's exception for an error frame, :class:`HubError` for a protocol error, and
        :class:`ConnectionLost` when the socket drops before the reply."""
        socket = await self._ready()
        rid, data = self._protocol.request(op, **fields)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[rid] = future
        try:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed as exc:
                raise closed_error(exc) from None
            return await future
        finally:
            self._forget(rid, future)

    async def streamed(self, op: str, **fields: Any) -> AsyncGenerator[list[str], None]:
        """A request answered by batches of lines (``dump`` frames) before its reply: the
        batches, as they come; the reply's error is raised at the end. The lines wait in
        this client until they are read."""
        socket = await self._ready()
        rid, data = self._protocol.request(op, **fields)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue: asyncio.Queue[list[str] | End] = asyncio.Queue()
        self._futures[rid] = future
        self._batches[rid] = queue
        try:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed as exc:
                raise closed_error(exc) from None
            while not isinstance(batch := await queue.get(), End):
                yield batch
            await future
        finally:
            self._batches.pop(rid, None)
            self._forget(rid, future)

    async def renew(self, token: str) -> dict[str, Any]:
        """Replace this client's token with ``token``, in band (an ``auth`` request): the
        connection and its subscriptions outlive the old token's ``exp``, and every later
        reconnect (and the resubscriptions after it) presents the new one.

        Returns the hub's reply, ``{"sub", "exp", "ended"}``. Subscriptions the new token
        no longer covers (``ended``) raise :class:`HubError` ``forbidden``. A token the hub
        refuses raises :class:`HubError` ``forbidden`` and the old one stays in use. When
        the socket is down (reconnecting), the new token is kept for the next one. After
        the hub closed the connection for an expired token (:class:`TokenExpired`), this
        reconnects with the new token (the ended subscriptions stay ended)."""
        if self._closed:
            raise ConnectionLost("the client is closed")
        if self._expired:
            previous, self.token = self.token, token
            self._expired, self._failure, self._supervisor = False, None, None
            try:
                await self.connect()
            except BaseException:
                self._expired, self._failure = True, functools.partial(TokenExpired)
                self.token = previous
                raise
            # and the auth below checks the token (a connection's handshake does not)
        try:
            result = await self.request("auth", token=token)
        except ConnectionLost:
            self.token = token  # the next socket presents it
            return {"sub": None, "exp": None, "ended": []}
        # (A refusal raises here, and the old token stays.) A socket opened meanwhile
        # presented the old token, and the auth went over it: either way, the new one.
        self.token = token
        self._presented = token
        reply: dict[str, Any] = dict(result) if isinstance(result, dict) else {}
        for key in reply.get("ended") or []:
            self._protocol.forget(key)
            subscription = self._subscriptions.get(key)
            if subscription is not None:
                what = "the registry" if key is None else repr(key)
                error = HubError("forbidden", f"the renewed token does not cover {what}: subscription ended")
                subscription.queue.put_nowait(error)
        return reply

    async def ping(self) -> float:
        """A round trip through the hub's request loop; returns its duration in seconds."""
        started = time.perf_counter()
        await self.request("ping")
        return time.perf_counter() - started

    def turns(self) -> AsyncGenerator[Turn, None]:
        """The turns the hub gives this client (a responder; see clients/turns.py):
        ``async for turn in hub.turns(): async with turn.reply() as st: ...``."""
        return iterate_turns(self)

    def session(self, session_id: str) -> RemoteSession:
        """One session's API: context blocks, tools, compaction, events."""
        return RemoteSession(self, session_id)

    # -- subscriptions -------------------------------------------------------------------
    async def subscribe(
        self,
        session_id: str | None,
        after_seq: int = 0,
        *,
        epoch: str | None = None,
        reload: bool = False,
    ) -> AsyncGenerator[Event, None]:
        """Every event of the session (``None``: the registry) after ``after_seq``: the
        backlog, then live, each exactly once and in ``seq`` order, across reconnects.

        When the log cannot serve the position (pruned, another epoch, beyond the end), the
        iterator raises :class:`~protocol.errors.PositionLost` (``epoch``, ``first_seq``,
        ``last_seq``): reload a snapshot and subscribe again from ``last_seq``. With
        ``reload=True`` it does that by itself, silently: it continues from the reset's
        ``last_seq`` and epoch, and the events in between are skipped (the caller is expected
        to re-read the state it needs). Closing the iterator (``break``, ``aclose()``)
        unsubscribes. One subscription per stream per client at a time (``InvalidInput``
        otherwise); any number of streams at once.
        """
        key = session_id
        previous = self._subscriptions.get(key)
        if previous is not None and previous.closing:
            # Its unsubscribe is on the way: wait for it rather than refuse.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(previous.closed.wait(), self.open_timeout)
        if key in self._subscriptions:
            raise InvalidInput(f"already subscribed to {'the registry' if key is None else repr(key)}")
        subscription = Subscription(key)
        self._subscriptions[key] = subscription
        try:
            socket = await self._ready()
            watch = self.on_presence is not None and key is not None
            _, data = self._protocol.subscribe(key, after_seq, epoch, presence=watch, reload=reload)
            # A failed send is not an error: the position is registered, and the reconnect
            # that follows the drop resubscribes from it.
            with contextlib.suppress(ConnectionClosed):
                await socket.send(data, text=True)
            while True:
                item = await subscription.queue.get()
                if isinstance(item, End):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            await self._end_subscription(subscription)

    async def _end_subscription(self, subscription: Subscription) -> None:
        key = subscription.key
        subscription.closing = True
        try:
            if (
                self._subscriptions.get(key) is subscription
                and key in self._protocol.positions
                and self._socket is not None
                and not self._closed
            ):
                # Wait for the reply: the server's events for this stream all come before
                # it, so a new subscription to the stream cannot receive a stale one.
                with contextlib.suppress(SessionHubError, TimeoutError):
                    await asyncio.wait_for(self._unsubscribe(key), self.open_timeout)
            else:
                self._protocol.forget(key)
        finally:
            if self._subscriptions.get(key) is subscription:
                del self._subscriptions[key]
            subscription.closed.set()

    async def _unsubscribe(self, key: StreamKey) -> None:
        socket = self._socket
        if socket is None:
            self._protocol.forget(key)
            return
        rid, data = self._protocol.unsubscribe(key)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[rid] = future
        try:
            try:
                await socket.send(data, text=True)
            except ConnectionClosed:
                return
            await future
        finally:
            self._forget(rid, future)

    async def presence(self, session_id: str) -> list[PresenceEntry]:
        """Who is on ``session_id``: each connection's name, role and the messages it is
        streaming there (``entry.streaming``)."""
        result = await self.request("presence", session_id=session_id)
        return msgspec.convert(result, list[PresenceEntry])
