"""Following the hub's resources live over MCP, on both revisions ``mcp`` serves.

- **2026-07-28**: ``subscriptions/listen``. The request's response is the stream: the
  SDK's :class:`~mcp.server.subscriptions.ListenHandler` acknowledges, stamps each frame
  with the subscription id and ends the stream once :data:`LISTEN_BUFFER` events wait
  unread (the client re-listens and refetches; the spec has no replay). Each stream gets
  a handler and a bus of its own, so the feed delivers to it only what its token may see.
- **2025-11-25**: ``resources/subscribe`` on a stateful MCP session (``/mcp/stateful``):
  updates go out on the session's standalone GET stream. What waits to be sent is a set
  of distinct changes (level triggers: "X changed"), so it never holds more than the
  session's subscriptions (at most :data:`MAX_SUBSCRIPTIONS`) plus one list change.

Either way a listener is a :class:`~.mcp_feed.Listener` of the endpoint's feed; a stream
that ends, a session that closes (DELETE, idle timeout) or a token that expires removes
it, and with it every follower only it needed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from protocol import InvalidInput, SessionHubError

from .caller import Caller
from .mcp_feed import Listener, McpFeed
from .mcp_resources import access_of, canonical, parse_uri

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.session import ServerSession
    from mcp.shared.exceptions import MCPError
    from mcp.shared.subscriptions import ServerEvent

__all__ = ["LISTEN_BUFFER", "MAX_SUBSCRIPTIONS", "Listening", "rpc_error"]

#: Events one ``subscriptions/listen`` stream queues before it is ended.
LISTEN_BUFFER = 256
#: Resources one stateful (2025-11-25) MCP session may subscribe to.
MAX_SUBSCRIPTIONS = 64
#: The header naming a stateful MCP session.
_SESSION_HEADER = "mcp-session-id"


def rpc_error(exc: SessionHubError) -> MCPError:
    """A hub error as the JSON-RPC error MCP answers: the hub's code leads the message."""
    from mcp.shared.exceptions import MCPError

    code = -32602 if isinstance(exc, InvalidInput) else -32603
    return MCPError(code=code, message=f"{exc.code}: {exc}", data={"code": exc.code})


def watched(access: Caller, uris: Iterable[str]) -> frozenset[str]:
    """The canonical URIs of ``uris``, each checked: readable by ``access``, and one the
    hub announces changes of (the prompt changes only when refreshed: not followed)."""
    out: set[str] = set()
    for uri in uris:
        target = parse_uri(uri)
        target.check(access, uri)
        if target.kind == "prompt":
            raise InvalidInput(
                f"{uri} is not followed live (a frozen prompt changes only when refreshed); "
                "follow its blocks or its history"
            )
        out.add(canonical(uri))
    return frozenset(out)


class _Bus:
    """The :class:`~mcp.server.subscriptions.SubscriptionBus` of one listen stream: the
    feed calls :meth:`deliver`, which hands the event to the stream's handler at once."""

    def __init__(self) -> None:
        self._listeners: dict[object, Callable[[ServerEvent], None]] = {}

    async def publish(self, event: ServerEvent) -> None:
        self.deliver(event)

    def deliver(self, event: ServerEvent) -> None:
        for listener in list(self._listeners.values()):
            listener(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        token = object()
        self._listeners[token] = listener

        def unsubscribe() -> None:
            self._listeners.pop(token, None)

        return unsubscribe


class _Subscribed:
    """One stateful MCP session's subscriptions, and what waits to go out on its stream."""

    def __init__(self, feed: McpFeed, session: ServerSession, expire: Callable[[], None]) -> None:
        self.feed = feed
        self.session = session
        #: The token expired: the session's subscriptions end (it subscribes again, renewed).
        self.expire = expire
        self.listener: Listener | None = None
        self.pending: dict[ServerEvent, None] = {}
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._send(), name="mcp subscriptions")

    @property
    def uris(self) -> frozenset[str]:
        return frozenset() if self.listener is None else self.listener.uris

    async def update(self, access: Caller, uris: frozenset[str]) -> None:
        """Follow ``uris`` for ``access`` (the newest token that subscribed); the old
        listener goes only once the new one is in, so nothing in between is missed."""
        old = self.listener
        self.listener = Listener(access, uris, True, self.deliver, expire=self.expire)
        try:
            await self.feed.add(self.listener)
        except BaseException:
            self.listener = old
            raise
        if old is not None:
            self.feed.remove(old)

    def deliver(self, event: ServerEvent) -> None:
        # Distinct changes only (a level trigger queued twice says nothing more), so this
        # holds at most the session's URIs and one list change.
        self.pending[event] = None
        self.wake.set()

    async def _send(self) -> None:
        from mcp.shared.subscriptions import ResourceUpdated

        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.pending:
                event = next(iter(self.pending))
                del self.pending[event]
                if isinstance(event, ResourceUpdated):
                    await self.session.send_resource_updated(event.uri)
                else:
                    await self.session.send_resource_list_changed()

    def close(self) -> None:
        if self.listener is not None:
            self.feed.remove(self.listener)
            self.listener = None
        self.pending.clear()
        self.task.cancel()


class Listening:
    """The handlers of ``subscriptions/listen`` and ``resources/(un)subscribe`` over one
    endpoint's :class:`~.mcp_feed.McpFeed`."""

    def __init__(self, feed: McpFeed) -> None:
        self.feed = feed
        #: Stateful MCP sessions (by ``Mcp-Session-Id``) that subscribed to something.
        self.sessions: dict[str, _Subscribed] = {}

    async def listen(
        self, ctx: ServerRequestContext[Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        from mcp.server.subscriptions import ListenHandler

        access = access_of(ctx)
        wanted = params.notifications
        bus = _Bus()
        handler = ListenHandler(bus, max_subscriptions=1, max_buffered_events=LISTEN_BUFFER)
        try:
            uris = watched(access, wanted.resource_subscriptions or ())
            listener = Listener(access, uris, bool(wanted.resources_list_changed), bus.deliver, handler.close)
            await self.feed.add(listener)
        except SessionHubError as exc:
            raise rpc_error(exc) from None
        try:
            return await handler(ctx, params)
        finally:
            self.feed.remove(listener)

    def _session_key(self, ctx: ServerRequestContext[Any]) -> str:
        headers = getattr(ctx.request, "headers", None)
        key = None if headers is None else headers.get(_SESSION_HEADER)
        if not isinstance(key, str) or not key:
            raise InvalidInput(
                "resources/subscribe needs a stateful MCP session: connect to /mcp/stateful "
                "(2025-11-25), or use subscriptions/listen (2026-07-28) on /mcp"
            )
        return key

    async def subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        import mcp_types as types

        access = access_of(ctx)
        try:
            key = self._session_key(ctx)
            uris = watched(access, [str(params.uri)])
        except SessionHubError as exc:
            raise rpc_error(exc) from None
        subscribed = self.sessions.get(key)
        fresh = subscribed is None
        if subscribed is None:
            subscribed = self.sessions[key] = _Subscribed(self.feed, ctx.session, lambda: self._drop(key))
            self._on_close(ctx, key)
        try:
            wanted = subscribed.uris | uris
            if len(wanted) > MAX_SUBSCRIPTIONS:
                raise InvalidInput(f"an MCP session follows {MAX_SUBSCRIPTIONS} resources at most")
            await subscribed.update(access, wanted)
        except SessionHubError as exc:
            if fresh:
                self._drop(key)
            raise rpc_error(exc) from None
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        import mcp_types as types

        access = access_of(ctx)
        try:
            key = self._session_key(ctx)
            subscribed = self.sessions.get(key)
            if subscribed is not None:
                left = subscribed.uris - {canonical(str(params.uri))}
                if left:
                    await subscribed.update(access, left)
                else:
                    self._drop(key)
        except SessionHubError as exc:
            raise rpc_error(exc) from None
        return types.EmptyResult()

    def _on_close(self, ctx: ServerRequestContext[Any], key: str) -> None:
        # The SDK unwinds a connection's exit stack when its MCP session ends (DELETE,
        # idle timeout, shutdown); ServerSession does not expose its connection, so this
        # reaches for it (tests/adapters/test_mcp_revisions.py checks the session is freed).
        connection = getattr(ctx.session, "_connection", None)
        stack = getattr(connection, "exit_stack", None)
        if isinstance(stack, contextlib.AsyncExitStack):
            stack.callback(self._drop, key)

    def _drop(self, key: str) -> None:
        subscribed = self.sessions.pop(key, None)
        if subscribed is not None:
            subscribed.close()

    def close(self) -> None:
        for key in list(self.sessions):
            self._drop(key)
