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
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
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
from .answers import answer_all, continued_turn, pending_answers
from .caller import caller, cors_headers
from .chats import ChatBody, body_of, ensure_session, error_code, in_flight, json_error, refused
from .port import Adapter, ChatHost, ChatTurn, host_of
from .sse import SseFeed
from .uistream import UIMessageEncoder, render, sse_text

__all__ = ["PATHS", "V7_HEADER", "adapter", "continued_stream", "reply_stream", "sse_headers", "wants_v7"]

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

    def __init__(self, hub: ChatHost, turn: ChatTurn, key: tuple[int, bool], v7: bool) -> None:
        self.hub, self.turn, self.key, self.v7 = hub, turn, key, v7
        self.encoder = UIMessageEncoder(turn.reply_id, v7)
        current = hub.streams.current(turn.session_id, turn.reply_id)
        if current is not None:
            self.encoder.message(*current)
        self.feeds: list[SseFeed] = []
        self.unwatch = turn.watch(self.on_item)

    def join(self, headers: dict[str, str]) -> SseFeed:
        feed: SseFeed = _feed(self.hub, headers, self.dropped, lambda: self.leave(feed))
        fresh = UIMessageEncoder(self.turn.reply_id, self.v7)
        chunks = fresh.start() + fresh.message(self.encoder.snapshot(), self.encoder.index)
        if self.hub.streams.awaiting(self.turn.session_id, self.turn.reply_id):
            # The reply waits for the user: the page gets it up to the question, and ends.
            chunks += [*fresh.close(), {"type": "finish", "finishReason": "tool-calls"}]
            feed.push(sse_text(chunks) + "data: [DONE]\n\n", last=True)
            return feed
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
        if last and _READERS.get(self.key) is self:
            del _READERS[self.key]  # a reader joining from now on starts a new rendering
        if chunks or last:
            text = sse_text(chunks) + ("data: [DONE]\n\n" if last else "")
            for feed in list(self.feeds):
                feed.push(text, last=last)


def _feed(
    hub: ChatHost, headers: dict[str, str], on_drop: Callable[[str], None], on_close: Callable[[], None]
) -> SseFeed:
    config = hub.config
    return SseFeed(
        headers={**sse_headers, **headers},
        max_bytes=config.outbox_bytes,
        send_timeout=config.send_timeout,
        keepalive=config.chat_keepalive,
        held=hub.sse_held,
        on_drop=on_drop,
        on_close=on_close,
    )


#: (id(turn), v7) -> its readers on this node (the entry holds the turn, so the id is not reused).
_READERS: dict[tuple[int, bool], _Readers] = {}

#: The request header by which an AI SDK 7 page asks for the chunks only 7 knows
#: (``reset-step``, ``custom``, ``reasoning-file``, ``steering-message``,
#: ``tool-approval-response``): an AI SDK 6 page's schema refuses them, so they are opt-in
#: on this door (``new DefaultChatTransport({ headers: { "x-sessionhub-ai-sdk": "7" } })``).
V7_HEADER = "x-sessionhub-ai-sdk"


def wants_v7(request: Request) -> bool:
    return request.headers.get(V7_HEADER, "").strip() == "7"


def reply_stream(hub: ChatHost, turn: ChatTurn, headers: dict[str, str], v7: bool = False) -> SseFeed:
    """The turn's reply as SSE to one more reader: from its ``start``, everything so far,
    then live, bounded per reader (:mod:`.sse`): a reader that falls behind is dropped."""
    key = (id(turn), v7)
    readers = _READERS.get(key)
    if readers is None or readers.turn is not turn:
        readers = _READERS[key] = _Readers(hub, turn, key, v7)
    return readers.join(headers)


def continued_stream(
    hub: ChatHost, turn: ChatTurn, headers: dict[str, str], v7: bool = False
) -> tuple[SseFeed, Callable[[], None]]:
    """The reply from here on, for a page that holds it up to now (it answered a tool): its
    own encoder, primed with the reply as it stands, renders only what comes after. Also
    the call that lets go of the turn, for a request refused before it streams."""
    encoder = UIMessageEncoder(turn.reply_id, v7)
    current = hub.streams.current(turn.session_id, turn.reply_id)
    if current is not None:
        encoder.prime(*current)

    def on_item(item: f.StreamFrame | TurnOutcome) -> None:
        try:
            chunks, last = render(encoder, item)
        except Exception:
            log.exception("a chunk of the reply %s could not be rendered", turn.reply_id)
            chunks, last = (
                [{"type": "error", "errorText": "the hub could not render the reply; resume it"}],
                True,
            )
        if chunks or last:
            feed.push(sse_text(chunks) + ("data: [DONE]\n\n" if last else ""), last=last)

    def dropped(reason: str) -> None:
        hub.metrics.sse_dropped.labels(reason).inc()

    watching: list[Callable[[], None]] = []

    def release() -> None:
        for stop in watching:
            stop()

    feed = _feed(hub, headers, dropped, release)
    unwatch = turn.watch(on_item)
    watching.append(unwatch)
    feed.push(sse_text(encoder.start()))
    return feed, unwatch


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
    body = await body_of(request, hub, cors, ChatBody)
    if isinstance(body, JSONResponse):
        return body
    if not body.messages:
        return json_error("invalid", "`messages` is empty: nothing to answer", cors)
    v7 = wants_v7(request)
    try:
        turn = await continued_turn(hub, body.id, body.messages[-1])
        if turn is not None:
            # The page answers a tool of the reply in flight: the reply goes on (answers.py).
            answers = pending_answers(hub, who, turn, body.messages[-1])
            feed, release = continued_stream(hub, turn, cors, v7)
            try:
                await answer_all(hub, answers)
            except BaseException:
                release()
                raise
            return feed
    except Forbidden:
        return refused(request.headers, cors)
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
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
    return reply_stream(hub, turn, cors, v7)


async def _resume(request: Request) -> Response | SseFeed:
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    turn = await in_flight(request, hub, cors, request.path_params["session_id"])
    if isinstance(turn, Response):
        return turn
    return reply_stream(hub, turn, cors, wants_v7(request))


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


class SteerBody(msgspec.Struct, kw_only=True):
    """``POST /api/chat/{id}/steer``: a user ``message`` (a ``UIMessage``), or its ``text``."""

    message: dict[str, Any] | None = None
    text: str | None = None
    turn_id: str | None = None


async def _steer(request: Request) -> Response:
    """``POST /api/chat/{id}/steer``: a user message for the turn in flight, not a new turn
    (the AI SDK 7 steering message; its page has no call of its own to send one)."""
    hub = host_of(request)
    cors = _cors(request, hub)
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    session_id = request.path_params["session_id"]
    try:
        who = caller(request.headers, hub.config)
        who.check("steer_turn", session_id)
    except Forbidden:
        return refused(request.headers, cors)
    body = await body_of(request, hub, cors, SteerBody)
    if isinstance(body, JSONResponse):
        return body
    message = body.message
    if message is None and body.text is not None:
        message = {"id": uuid.uuid4().hex, "role": "user", "parts": [{"type": "text", "text": body.text}]}
    if message is None:
        return json_error("invalid", "send `message` (a user UIMessage) or `text`", cors)
    try:
        await hub.session(session_id)
        steered = await hub.turns.steer(
            f.SteerTurn(id=0, session_id=session_id, message=message, turn_id=body.turn_id)
        )
    except SessionHubError as exc:
        return json_error(error_code(exc), str(exc), cors)
    return JSONResponse(steered, status_code=202, headers=cors)


async def _preflight(request: Request) -> Response:
    cors = _cors(request, host_of(request))
    if cors is None:
        return json_error("forbidden", "origin not allowed")
    return Response(status_code=204, headers=cors)


#: The adapter's paths (a typed 405 answers any other method on them).
PATHS = [
    "/api/chat",
    "/api/chat/{session_id}/stream",
    "/api/chat/{session_id}/stop",
    "/api/chat/{session_id}/steer",
]


def adapter() -> Adapter:
    """The AI SDK chat over HTTP, as ``create_app`` mounts it."""
    chat, stream, stop, steer = PATHS
    routes: list[BaseRoute] = [
        Route(chat, _post, methods=["POST"]),
        Route(stream, _resume, methods=["GET"]),
        Route(stop, _stop, methods=["POST"]),
        Route(steer, _steer, methods=["POST"]),
    ]
    routes += [Route(path, _preflight, methods=["OPTIONS"]) for path in PATHS]
    return Adapter("aisdk_chat", routes, PATHS)
