"""What changed, for the MCP clients that follow the hub's resources: the hub's event logs
turned into MCP change events (``ResourceUpdated``, ``ResourcesListChanged``).

Writes reach it from the logs, whoever made them (a WebSocket client, ``/api/chat``,
another MCP client, another node: the bus rings every node's followers). One task follows
the registry while anyone listens, and one each session's log while anyone follows one
of its resources; each starts where the log stood when its first listener came, before
that listener is acknowledged, so nothing written after the acknowledgment is missed.
Each event goes to the listeners its token may see (a token scoped to one session hears
only of it). A listener's ``deliver`` must not block: it queues within its own bound
(:mod:`.mcp_listen`); :meth:`McpFeed.remove` frees all it held, a follower included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from protocol import Event, SessionHubError

from ..store.base import REGISTRY, session_stream
from .caller import Caller
from .mcp_resources import SESSIONS_URI, URI_PREFIX, history_uri

if TYPE_CHECKING:
    from mcp.shared.subscriptions import ServerEvent

    from .port import Served

__all__ = ["Listener", "McpFeed", "TooManyListeners"]

log = logging.getLogger("sessionhub.mcp")

#: Registry changes that add or remove resources (``resources/list`` answers otherwise).
_LIST_CHANGES = frozenset({"session.created", "session.forked", "session.deleted"})
#: A follower whose log read failed (the store away) retries after this long.
_RETRY = 1.0


class TooManyListeners(SessionHubError):
    """The node follows ``max_listeners`` MCP listeners already: the hub's ``too_many`` (the
    code a WebSocket's subscription limit answers), not an ``internal`` error: a client
    may listen again later, or on another node."""

    code = "too_many"

    def __init__(self, limit: int) -> None:
        super().__init__(f"this hub serves {limit} MCP listeners at most; try again later")


@dataclass(eq=False)
class Listener:
    """One client following: the URIs it follows, whether it wants ``list_changed``, its
    token, and the non-blocking call that queues an event for it."""

    access: Caller
    uris: frozenset[str]
    list_changed: bool
    deliver: Callable[[ServerEvent], None]
    #: Called when the token expires: the listener ends (its client re-listens, renewed).
    expire: Callable[[], None] = lambda: None
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def sessions(self) -> set[str]:
        """The sessions whose own logs it needs followed."""
        found: set[str] = set()
        for uri in self.uris:
            if uri.startswith(URI_PREFIX):
                found.add(unquote(uri[len(URI_PREFIX) :].split("/", 1)[0]))
        return found

    def sees(self, session_id: str) -> bool:
        return self.access.allows("get", session_id)


class _Follower:
    """One task reading one log from a position, for the listeners that need it."""

    def __init__(self, feed: McpFeed, stream: str, after_seq: int) -> None:
        self.users = 0
        self.task = asyncio.get_running_loop().create_task(
            feed.follow(stream, after_seq), name=f"mcp feed {stream}"
        )


class McpFeed:
    """The hub's logs as MCP change events, for the listeners of one MCP endpoint."""

    def __init__(self, hub: Served, max_listeners: int) -> None:
        self.hub = hub
        self.max_listeners = max_listeners
        self.listeners: set[Listener] = set()
        self._followers: dict[str, _Follower] = {}
        self._lock = asyncio.Lock()

    @property
    def followed(self) -> list[str]:
        """The logs followed now (tests check that a dropped listener frees its own)."""
        return sorted(self._followers)

    async def add(self, listener: Listener) -> None:
        """Start delivering to ``listener`` (its followers started first);
        :class:`TooManyListeners` past ``max_listeners``."""
        async with self._lock:
            if len(self.listeners) >= self.max_listeners:
                raise TooManyListeners(self.max_listeners)
            taken: list[str] = []
            try:
                for stream in [REGISTRY, *(session_stream(s) for s in sorted(listener.sessions()))]:
                    follower = self._followers.get(stream)
                    if follower is None:
                        position = await self.hub.manager.store.stream_position(stream)
                        follower = self._followers[stream] = _Follower(self, stream, position.last_seq)
                    follower.users += 1
                    taken.append(stream)
            except BaseException:
                self._release(taken)  # the store failed us half way: hold nothing
                raise
            self.listeners.add(listener)
        grant = listener.access.grant
        if listener.access.auth and grant is not None:
            delay = max(0.0, grant.expires_at - time.time())
            listener._timer = asyncio.get_running_loop().call_later(delay, self._expire, listener)

    def remove(self, listener: Listener) -> None:
        """Stop delivering to ``listener``; a log nobody else needs is no longer followed."""
        if listener not in self.listeners:
            return
        self.listeners.discard(listener)
        if listener._timer is not None:
            listener._timer.cancel()
            listener._timer = None
        self._release([REGISTRY, *(session_stream(s) for s in listener.sessions())])

    def _release(self, streams: list[str]) -> None:
        for stream in streams:
            follower = self._followers.get(stream)
            if follower is None:
                continue
            follower.users -= 1
            if follower.users <= 0:
                del self._followers[stream]
                follower.task.cancel()

    def end_all(self) -> None:
        """End every listener as its token's expiry would (a listen stream closes
        gracefully, with its final result): the hub is shutting down."""
        for listener in list(self.listeners):
            self._expire(listener)

    async def close(self) -> None:
        for listener in list(self.listeners):
            self.remove(listener)
        for follower in list(self._followers.values()):
            follower.task.cancel()
        self._followers.clear()

    def _expire(self, listener: Listener) -> None:
        self.remove(listener)
        listener.expire()

    async def follow(self, stream: str, after_seq: int) -> None:
        """Read ``stream`` from ``after_seq`` on, forever, publishing each event."""
        manager = self.hub.manager
        seq = after_seq
        while True:
            try:
                if stream == REGISTRY:
                    events = manager.registry_events(seq)
                else:
                    events = manager.get_session(stream[len("s:") :]).events(seq)
                async for event in events:
                    seq = event.seq
                    self.publish(event)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A pruned or lost position, a store outage: start again from where the log
                # stands now; listeners refetch on the update this sends.
                log.warning("MCP feed of %s: %s; following again from its end", stream, exc)
                await asyncio.sleep(_RETRY)
                with contextlib.suppress(Exception):
                    seq = (await manager.store.stream_position(stream)).last_seq
                self.publish_lost(stream)

    def publish(self, event: Event) -> None:
        """Hand ``event``'s change to every listener that follows it and may see it."""
        from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

        changes: list[ServerEvent] = []
        sid = event.session_id
        if event.stream == "registry":
            changes.append(ResourceUpdated(SESSIONS_URI))
            if event.type in _LIST_CHANGES:
                changes.append(ResourcesListChanged())
            if event.type == "session.deleted":
                changes.append(ResourceUpdated(history_uri(sid)))
        elif event.type.startswith(("message.", "compaction.")):
            changes.append(ResourceUpdated(history_uri(sid)))
        elif event.type.startswith("context.") and isinstance(event.data.get("label"), str):
            label = quote(event.data["label"], safe="")
            changes.append(ResourceUpdated(f"{URI_PREFIX}{quote(sid, safe='')}/blocks/{label}"))
        for listener in list(self.listeners):
            if not listener.sees(sid):
                continue
            for change in changes:
                if _wants(listener, change):
                    listener.deliver(change)

    def publish_lost(self, stream: str) -> None:
        """After a gap in ``stream``: every URI of it changed, as far as anyone knows."""
        from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

        for listener in list(self.listeners):
            if stream == REGISTRY:
                if SESSIONS_URI in listener.uris:
                    listener.deliver(ResourceUpdated(SESSIONS_URI))
                if listener.list_changed:
                    listener.deliver(ResourcesListChanged())
                continue
            prefix = URI_PREFIX + quote(stream[len("s:") :], safe="") + "/"
            for uri in listener.uris:
                if uri.startswith(prefix):
                    listener.deliver(ResourceUpdated(uri))


def _wants(listener: Listener, change: ServerEvent) -> bool:
    from mcp.shared.subscriptions import ResourcesListChanged, ResourceUpdated

    if isinstance(change, ResourceUpdated):
        return change.uri in listener.uris
    return isinstance(change, ResourcesListChanged) and listener.list_changed
