"""The port of the protocol adapters: all an adapter may use of the hub, and the shape it
registers in.

An adapter (one module of :mod:`hub.adapters` per protocol the hub speaks beyond its own:
the AI SDK's chat, MCP, ...) sees the running hub only as the Protocols below: its sessions
(:class:`Sessions`: the manager and a session that must exist), its limits and whether it
is closing (:class:`Served`), the store, turns (:class:`TurnDesk`, :class:`ChatTurn`),
the replies streaming now (:class:`ChatStreams`), the metrics and the SSE byte count
(:class:`ChatHost`). Tokens are checked with :mod:`hub.auth`; the HTTP doors' common
rules (a token before the body, a bounded body, bounded SSE, origins) are
:mod:`.caller`, :mod:`.body` and :mod:`.sse`. Nothing else of the server: not the ``Hub``,
a ``Connection``, the op table, subscriptions nor the access module; the import contract
"the adapters reach the hub only through their port" (pyproject.toml) fails on any other
import, and ``tests/project/test_architecture.py`` when a server module this port imports
(``config``, ``metrics``, ``outbox``, ``ports``, ``turnframes``; ``asgiscope`` for
:mod:`.sse`) would lead to one.

An adapter registers as an :class:`Adapter`: its routes, the paths that answer a typed
405 for other methods, and optionally what runs in the app's lifespan. The list of
adapters is :func:`hub.adapters.adapters`; ``create_app`` mounts each.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute

from protocol import frames as f

from ..server.config import HubConfig
from ..server.metrics import Metrics
from ..server.outbox import Held
from ..server.ports import Sessions
from ..server.turnframes import Watcher
from ..store.base import Store

__all__ = [
    "Adapter",
    "ChatHost",
    "ChatStreams",
    "ChatTurn",
    "Served",
    "Sessions",
    "TurnDesk",
    "host_of",
]


class Served(Sessions, Protocol):
    """A running hub as an adapter that needs no turns (MCP) sees it: the limits, and
    whether it is shutting down (a door answers 503 then)."""

    @property
    def config(self) -> HubConfig: ...
    @property
    def closing(self) -> bool: ...


class ChatTurn(Protocol):
    """A turn as the chat endpoints stream it: its reply, and watching the reply grow."""

    @property
    def session_id(self) -> str: ...
    @property
    def reply_id(self) -> str: ...
    def watch(self, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` with each stream frame of the reply, then the outcome; returns
        the call that stops it."""
        ...


class TurnDesk(Protocol):
    """Starting a turn, and the turn a session has in flight."""

    async def start(
        self, session_id: str, message_id: str | None = None, trigger: str | None = None
    ) -> ChatTurn: ...
    def in_flight(self, session_id: str) -> ChatTurn | None: ...
    async def stop(
        self, session_id: str, turn_id: str | None = None, reason: str = "stopped by request"
    ) -> dict[str, Any]:
        """Stop the session's turn in flight on any node; NotFound when there is none."""
        ...

    async def find(self, session_id: str) -> ChatTurn | None:
        """The turn in flight in the session on any node (this one's first)."""
        ...

    async def answer_tool(self, request: f.AnswerTool) -> dict[str, Any]:
        """The user's answer to a tool of the reply in flight, checked and passed on."""
        ...

    async def steer(self, request: f.SteerTurn) -> dict[str, Any]:
        """A user message for the turn in flight (stored in its reply)."""
        ...


class ChatStreams(Protocol):
    """A streamed message as it stands now, for a reader that joins mid-reply."""

    def current(self, session_id: str, message_id: str) -> tuple[dict[str, Any], int] | None:
        """The message so far and its index, on this node or mirrored; None: not streaming."""
        ...

    def awaiting(self, session_id: str, message_id: str) -> bool:
        """Whether the reply waits for the user (its last delta was ``await``)."""
        ...


class ChatHost(Served, Protocol):
    """A running hub as a chat adapter (``POST /api/chat`` and its resume endpoint) sees
    it: the limits (auth secret, allowed origins), the engine, the store (a new chat's
    session), turns and the replies streaming now."""

    @property
    def store(self) -> Store: ...
    @property
    def streams(self) -> ChatStreams: ...
    @property
    def turns(self) -> TurnDesk: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def sse_held(self) -> Held:
        """What the chat SSE readers have queued (``sessionhub_sse_bytes``)."""
        ...


#: What an adapter may run in the app's lifespan, given the running hub (``async with``).
Lifespan = Callable[[ChatHost], AbstractAsyncContextManager[None]]


@dataclass(frozen=True)
class Adapter:
    """One protocol adapter as ``create_app`` mounts it.

    ``routes`` are mounted before the inspector's files (which take every other path);
    ``paths`` answer a typed JSON 405 for a method their routes do not serve (the HTTP
    doors never answer in plain text); ``lifespan``, if any, is entered once the hub runs
    and left before it drains (MCP's SDK runs its session manager there)."""

    name: str
    routes: list[BaseRoute]
    paths: list[str] = field(default_factory=list)
    lifespan: Lifespan | None = None


def host_of(connection: HTTPConnection) -> ChatHost:
    """The running hub behind a request to an adapter's route (``create_app`` keeps it in
    ``app.state.hub``), as the port's view."""
    host: ChatHost = connection.app.state.hub
    return host
