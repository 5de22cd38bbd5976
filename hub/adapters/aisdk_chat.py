"""The Vercel AI SDK's chat over HTTP: ``POST /api/chat`` and ``GET /api/chat/{id}/stream``.

Both answer with the SDK's *UI message stream* (:mod:`.uistream`): server-sent events, one
JSON chunk each, then ``data: [DONE]``, with the header ``x-vercel-ai-ui-message-stream:
v1``. So ``useChat()`` with its ``DefaultChatTransport`` (and its resumable-stream
reconnect) talks to the hub unchanged.

``POST /api/chat`` takes the body ``DefaultChatTransport`` sends (``id``: the session,
``messages``: the path the page shows, ``trigger``, ``messageId``), creates the session if
it is new (with ``admin``), appends the messages it does not hold yet (idempotent by id, as a
chain from the root), starts a turn (``hub/server/turndispatch.py``) and streams the reply. ``GET
/api/chat/{id}/stream`` resumes: ``204`` when no turn is in flight on any node, else the
message from its ``start`` (everything so far, in one go) and then live. ``POST
/api/chat/{id}/stop`` stops the turn in flight: the stream ends with an ``abort`` chunk.

A POST's token is checked before its body is read (:mod:`.caller`), and the body is read
within ``HubConfig.max_body_bytes`` and parsed by the socket's decoder (:mod:`.body`); each
reader's stream is bounded as a WebSocket's outbox is (:mod:`.sse`), and a turn's chunks
are rendered once for all its readers (:class:`_Readers`).

The adapter sees the running hub as a :class:`~hub.adapters.port.ChatHost`
(:func:`~hub.adapters.port.host_of`), a turn as a :class:`~hub.adapters.port.ChatTurn`.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from protocol import (
    Forbidden,
    SessionHubError,
    coerce_message,
)
from protocol import frames as f

from ..server.turnframes import TurnOutcome
from .body import BodyError, parse_body, read_body
from .caller import caller, cors_headers
from .chats import ChatBody, ensure_session, error_code, in_flight, json_error, refused
from .port import Adapter, ChatHost, ChatTurn, host_of
from .sse import SseFeed
from .uistream import UIMessageEncoder, render, sse_text

__all__ = ["PATHS", "adapter", "reply_stream", "sse_headers"]

log = logging.getLogger("sessionhub.chat")

#: Headers of every UI message stream response.
sse_headers = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}


class _Readers:
    """One turn's readers on this node, and its reply rendered once for all of them: every
    reader that has caught up is where the others are, so each frame's chunks are encoded
    once and the same text is queued to each (a reader's queue costs the hub its share of
    the bytes, not a copy of the reply per reader). A reader that joins gets ``start`` and
    the message as rendered so far, from a fresh encoder, then the shared chunks."""

    def __init__(self, hub: ChatHost, turn: ChatTurn, key: int) -> None:
        self.hub, self.turn, self.key = hub, turn, key
        self.encoder = UIMessageEncoder(turn.reply_id)
        current = hub.streams.current(turn.session_id, turn.reply_id)
        if current is not None:
            self.encoder.message(*current)
        self.feeds: list[SseFeed] = []
        self.unwatch = turn.watch(self.on_item)

    def join(self, headers: dict[str, str]) -> SseFeed:
        config = self.hub.config
        feed = SseFeed(
            headers={**sse_headers, **headers},
            max_bytes=config.outbox_bytes,
            send_timeout=config.send_timeout,
            keepalive=config.chat_keepalive,
            held=self.hub.sse_held,
            on_drop=self.dropped,
            on_close=lambda: self.leave(feed),
        )
        fresh = UIMessageEncoder(self.turn.reply_id)
        chunks = fresh.start() + fresh.message(self.encoder.snapshot(), self.encoder.index)
        feed.push(sse_text(chunks))
        self.feeds.append(feed)
        return feed

    def leave(self, feed: SseFeed) -> None:
        if feed in self.feeds:
            self.feeds.remove(feed)
        if not self.feeds:
            self.unwatch()
            if _READERS.get(self.key) is self:
                del _READERS[self.key]

    def dropped(self, reason: str) -> None:
        self.hub.metrics.sse_dropped.labels(reason).inc()
        log.info(
            "dropped a reader of the reply %s in %s (%s)", self.turn.reply_id, self.turn.session_id, reason
        )

    def on_item(self, item: f.StreamFrame | TurnOutcome) -> None:
        # Called by the turn among its other watchers: a failure here must not reach it.
        try:
            chunks, last = render(self.encoder, item)
        except Exception:
            # The stream has begun: its readers are told in its own form, an error chunk.
            log.exception("a chunk of the reply %s could not be rendered", self.turn.reply_id)
            chunks = [{"type": "error", "errorText": "the hub could not render the reply; resume it"}]
            last = True
        if chunks or last:
            text = sse_text(chunks) + ("data: [DONE]\n\n" if last else "")
            for feed in list(self.feeds):
                feed.push(text, last=last)


#: id(turn) -> its readers on this node (the entry holds the turn, so the id is not reused).
_READERS: dict[int, _Readers] = {}


def reply_stream(hub: ChatHost, turn: ChatTurn, headers: dict[str, str]) -> SseFeed:
    """The turn's reply as SSE to one more reader: from its ``start``, everything so far,
    then live, bounded per reader (:mod:`.sse`): a reader that falls behind is dropped."""
    readers = _READERS.get(id(turn))
    if readers is None or readers.turn is not turn:
        readers = _READERS[id(turn)] = _Readers(hub, turn, id(turn))
    return readers.join(headers)


# -- HTTP ----------------------------------------------------------------------------------


def _cors(request: Request, hub: ChatHost) -> dict[str, str] | None:
    return cors_headers(request.headers, hub.config, expose="x-vercel-ai-ui-message-stream")


async def _post(request: Request) -> Response | SseFeed:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    if hub.closing:
        return json_error("unavailable", "the hub is shutting down", cors)
    # The token and the declared size first: a stranger's body is never read, and nobody's
    # is read past max_body_bytes.
    try:
        who = caller(request.headers, hub.config)
    except Forbidden:
        return refused(request.headers, cors)
    try:
        data = await read_body(request.receive, request.headers, hub.config.max_body_bytes)
        body: ChatBody = parse_body(data, ChatBody)
    except BodyError as exc:
        return json_error(exc.code, str(exc), cors, exc.status)
    if not body.messages:
        return json_error("invalid", "`messages` is empty: nothing to answer", cors)
    try:
        who.check("append_all", body.id)
        # Every message checked (depth, numbers, parts) before anything is written: a bad
        # one must not leave a new chat's session behind, empty.
        messages = [coerce_message(m) for m in body.messages]
        await ensure_session(hub, who, body)
        await hub.manager.append_all(body.id, messages, None)
        turn = await hub.turns.start(body.id, messages[-1].id, body.trigger)
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return reply_stream(hub, turn, cors)


async def _resume(request: Request) -> Response | SseFeed:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    turn = await in_flight(request, hub, cors, request.path_params["session_id"])
    if isinstance(turn, Response):
        return turn
    return reply_stream(hub, turn, cors)


async def _stop(request: Request) -> Response:
    """``POST /api/chat/{id}/stop``: stop the turn in flight (the SDK's own ``stop()``
    only closes the reader's connection, which a resumable chat treats as a disconnect)."""
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    session_id = request.path_params["session_id"]
    try:
        caller(request.headers, hub.config).check("stop_turn", session_id)
        await hub.session(session_id)
        stopped = await hub.turns.stop(session_id, request.query_params.get("turn_id"), "stopped by the user")
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return JSONResponse(stopped, headers=cors)


async def _preflight(request: Request) -> Response:
    cors = _cors(request, host_of(request))
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    return Response(status_code=204, headers=cors)


#: The adapter's paths (a typed 405 answers any other method on them).
PATHS = ["/api/chat", "/api/chat/{session_id}/stream", "/api/chat/{session_id}/stop"]


def adapter() -> Adapter:
    """The AI SDK chat over HTTP, as ``create_app`` mounts it."""
    chat, stream, stop = PATHS
    routes: list[BaseRoute] = [
        Route(chat, _post, methods=["POST"]),
        Route(stream, _resume, methods=["GET"]),
        Route(stop, _stop, methods=["POST"]),
    ]
    routes += [Route(path, _preflight, methods=["OPTIONS"]) for path in PATHS]
    return Adapter("aisdk_chat", routes, PATHS)
