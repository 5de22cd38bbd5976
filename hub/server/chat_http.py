"""The Vercel AI SDK's chat endpoints: ``POST /api/chat`` and ``GET /api/chat/{id}/stream``.

Both answer with the SDK's *UI message stream*: server-sent events, one JSON chunk each
(``start``, ``text-start``/``-delta``/``-end``, ``reasoning-*``, ``tool-input-*`` and
``tool-output-*``, ``start-step``/``finish-step``, ``finish`` or ``error``), then
``data: [DONE]``, with the header ``x-vercel-ai-ui-message-stream: v1``. So
``useChat()`` with its ``DefaultChatTransport`` (and its resumable-stream reconnect) talks to
the hub unchanged.

``POST /api/chat`` takes the body ``DefaultChatTransport`` sends (``id``: the session,
``messages``: the path the page shows, ``trigger``, ``messageId``), creates the session if
it is new (with ``admin``), appends the messages it does not hold yet (idempotent by id, as a
chain from the root), starts a turn (:mod:`.turndispatch`) and streams the reply. The chunks are
derived from the reply's stream frames by :class:`UIMessageEncoder`, which diffs the message
as the hub holds it: what the SDK rebuilds is what the hub stores. ``GET
/api/chat/{id}/stream`` resumes: ``204`` when no turn is in flight on any node, else the
message from its ``start`` (everything so far, in one go) and then live. ``POST
/api/chat/{id}/stop`` stops the turn in flight: the stream ends with an ``abort`` chunk.

A POST's token is checked before its body is read, and the body is read within
``HubConfig.max_body_bytes`` and parsed by the socket's decoder (:mod:`.httpbody`); each
reader's stream is bounded as a WebSocket's outbox is (:mod:`.ssefeed`), and a turn's chunks
are rendered once for all its readers (:class:`_Readers`).

The endpoints see the running hub as a :class:`~hub.server.ports.ChatHost`
(``request.app.state.hub``), a turn as a :class:`~hub.server.ports.ChatTurn`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from typing import Any, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from protocol import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    SessionHubError,
    SessionNotFound,
    SummarizerError,
    coerce_message,
)
from protocol import frames as f
from protocol.deltas import GrowingParts

from ..auth import Grant, verify_token
from .httpbody import BodyError, parse_body, read_body
from .ports import ChatHost, ChatTurn
from .ssefeed import KEEPALIVE, SseFeed
from .turnframes import TurnOutcome

__all__ = ["KEEPALIVE", "UIMessageEncoder", "chat_routes", "reply_stream", "sse_headers"]

log = logging.getLogger("sessionhub.chat")

Chunk = dict[str, Any]

#: Headers of every UI message stream response.
sse_headers = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "connection": "keep-alive",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}

_TOOL_STAGE = {"input-streaming": 0, "input-available": 1, "output-available": 2, "output-error": 2}


def _is_tool(part: dict[str, Any]) -> bool:
    kind = part.get("type")
    return isinstance(kind, str) and (kind.startswith("tool-") or kind == "dynamic-tool")


class UIMessageEncoder:
    """Turns one streamed message, as the hub holds it, into UI message stream chunks.

    Feed it snapshots (:meth:`message`) or deltas (:meth:`deltas`); each returns the chunks
    that take a reader from what it was sent to what the message is now. Text and reasoning
    grow by their new suffix; a tool part goes through input start, input available and
    output; step-start parts become ``start-step`` (and ``finish-step`` before the next)."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        self._grown = GrowingParts()
        self.index = -1
        self._sent: list[dict[str, Any]] = []  # per part: what the reader has
        self._step = False
        self._metadata_sent = False
        self.metadata: Any = None

    def snapshot(self) -> dict[str, Any]:
        """The message as rendered so far (its parts are this encoder's: do not change them)."""
        return {"parts": self._grown.parts(), "metadata": self.metadata}

    def start(self) -> list[Chunk]:
        return [{"type": "start", "messageId": self.message_id}]

    def message(self, message: dict[str, Any], index: int) -> list[Chunk]:
        """A whole message (``start``, ``state``, ``end``): the reader catches up to it."""
        if index < self.index:
            return []
        self.index = index
        self._grown = GrowingParts(copy.deepcopy(list(message.get("parts") or [])))
        chunks: list[Chunk] = []
        metadata = message.get("metadata")
        if metadata is not None:
            self.metadata = metadata
        if metadata is not None and not self._metadata_sent:
            self._metadata_sent = True
            chunks.append({"type": "message-metadata", "messageMetadata": metadata})
        return chunks + self._diff()

    def deltas(self, deltas: list[dict[str, Any]]) -> list[Chunk]:
        """Deltas applied in index order, once each; a gap waits for the next whole message."""
        chunks: list[Chunk] = []
        for delta in deltas:
            if int(delta.get("index", -1)) != self.index + 1:
                continue
            self.index += 1
            kind, text = delta.get("kind"), delta.get("text")
            extends = self._extends_sent(kind, text)
            with contextlib.suppress(InvalidInput):  # the hub checked it; a bad one is skipped
                self._grown.apply(kind, text, delta.get("part"))
            if extends is not None:
                # The text grows the part the reader already has: its delta is the chunk, so
                # the part is not joined and sliced per delta (quadratic in a long reply).
                assert isinstance(text, str)
                extends["chars"] += len(text)
                chunks.append({"type": f"{kind}-delta", "id": extends["id"], "delta": text})
            else:
                chunks += self._diff()
        return chunks

    def _extends_sent(self, kind: Any, text: Any) -> dict[str, Any] | None:
        """What the reader has of the last part, when a ``kind`` delta of ``text`` only
        grows it; None when the delta needs the whole diff (a new part, a tool)."""
        if kind not in ("text", "reasoning") or not isinstance(text, str) or not text:
            return None
        parts = self._grown.peek()
        if not parts or len(self._sent) != len(parts) or parts[-1].get("type") != kind:
            return None
        if not isinstance(parts[-1].get("text"), str):  # GrowingParts starts a new part
            return None
        sent = self._sent[-1]
        return sent if sent.get("kind") == kind else None

    def close(self) -> list[Chunk]:
        """The message is complete: end open parts and the open step."""
        chunks = self._close_open(len(self._sent))
        if self._step:
            self._step = False
            chunks.append({"type": "finish-step"})
        return chunks

    def _close_open(self, before: int) -> list[Chunk]:
        chunks: list[Chunk] = []
        for sent in self._sent[:before]:
            if sent.get("open"):
                sent["open"] = False
                chunks.append({"type": f"{sent['kind']}-end", "id": sent["id"]})
        return chunks

    def _diff(self) -> list[Chunk]:
        chunks: list[Chunk] = []
        for i, part in enumerate(self._grown.parts()):
            if i >= len(self._sent):
                chunks += self._close_open(i)  # only the last part can still grow
                self._sent.append({})
                chunks += self._first(i, part)
            chunks += self._grow(i, part)
        return chunks

    def _first(self, i: int, part: dict[str, Any]) -> list[Chunk]:
        kind = part.get("type")
        sent = self._sent[i]
        if kind in ("text", "reasoning"):
            sent.update(kind=kind, id=f"{kind}-{i}", chars=0, open=True)
            chunk: Chunk = {"type": f"{kind}-start", "id": sent["id"]}
            if part.get("providerMetadata") is not None:
                chunk["providerMetadata"] = part["providerMetadata"]
            return [chunk]
        if _is_tool(part):
            sent.update(kind="tool", stage=-1)
            return []
        sent.update(kind="other")
        if kind == "step-start":
            chunks: list[Chunk] = [{"type": "finish-step"}] if self._step else []
            self._step = True
            return [*chunks, {"type": "start-step"}]
        if kind == "file":
            return [{"type": "file", "url": part.get("url", ""), "mediaType": part.get("mediaType", "")}]
        if kind in ("source-url", "source-document") or (isinstance(kind, str) and kind.startswith("data-")):
            return [dict(part)]
        return []  # a part the stream protocol cannot carry: it is in the stored message

    def _grow(self, i: int, part: dict[str, Any]) -> list[Chunk]:
        sent = self._sent[i]
        if sent.get("kind") in ("text", "reasoning"):
            text = part.get("text")
            if not isinstance(text, str) or len(text) <= sent["chars"]:
                return []
            delta, sent["chars"] = text[sent["chars"] :], len(text)
            return [{"type": f"{sent['kind']}-delta", "id": sent["id"], "delta": delta}]
        if sent.get("kind") != "tool":
            return []
        return self._tool(sent, part)

    @staticmethod
    def _tool(sent: dict[str, Any], part: dict[str, Any]) -> list[Chunk]:
        kind = str(part.get("type"))
        dynamic = kind == "dynamic-tool"
        name = str(part.get("toolName", "")) if dynamic else kind[len("tool-") :]
        call = str(part.get("toolCallId", ""))
        common: Chunk = {"toolCallId": call, "toolName": name}
        if dynamic:
            common["dynamic"] = True
        for key in ("providerExecuted", "title"):
            if part.get(key) is not None:
                common[key] = part[key]
        stage = _TOOL_STAGE.get(str(part.get("state")), 0)
        chunks: list[Chunk] = []
        if sent["stage"] < 0:
            chunks.append({"type": "tool-input-start", **common})
            sent["stage"] = 0
        if stage >= 1 and sent["stage"] < 1:
            chunks.append({"type": "tool-input-available", **common, "input": part.get("input")})
            sent["stage"] = 1
        if stage >= 2 and sent["stage"] < 2:
            if part.get("state") == "output-error":
                chunks.append(
                    {
                        "type": "tool-output-error",
                        "toolCallId": call,
                        "errorText": str(part.get("errorText", "")),
                    }
                )
            else:
                chunks.append(
                    {"type": "tool-output-available", "toolCallId": call, "output": part.get("output")}
                )
            sent["stage"] = 2
        return chunks


def _sse(chunks: list[Chunk]) -> str:
    # json.dumps escapes non-ASCII: the feed sends the text as ASCII bytes.
    return "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks)


def _render(encoder: UIMessageEncoder, item: f.StreamFrame | TurnOutcome) -> tuple[list[Chunk], bool]:
    """The chunks one stream frame (or the turn's outcome, ``True``: the last) makes."""
    if isinstance(item, TurnOutcome):
        chunks = encoder.close()
        if item.status == "finished":
            chunks.append({"type": "finish", "finishReason": "stop"})
        elif item.status == "stopped":
            # What the SDK's own streamText sends when its generation is aborted.
            chunks.append({"type": "abort", "reason": item.reason or "stopped"})
        else:
            chunks.append({"type": "error", "errorText": item.error or "the turn failed"})
        return chunks, True
    if item.action == "delta":
        return encoder.deltas(item.deltas or []), False
    if item.message is not None:
        return encoder.message(item.message, item.index), False
    return [], False


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
        feed.push(_sse(chunks))
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
            chunks, last = _render(self.encoder, item)
        except Exception:
            # The stream has begun: its readers are told in its own form, an error chunk.
            log.exception("a chunk of the reply %s could not be rendered", self.turn.reply_id)
            chunks = [{"type": "error", "errorText": "the hub could not render the reply; resume it"}]
            last = True
        if chunks or last:
            text = _sse(chunks) + ("data: [DONE]\n\n" if last else "")
            for feed in list(self.feeds):
                feed.push(text, last=last)


#: id(turn) -> its readers on this node (the entry holds the turn, so the id is not reused).
_READERS: dict[int, _Readers] = {}


def reply_stream(hub: ChatHost, turn: ChatTurn, headers: dict[str, str]) -> SseFeed:
    """The turn's reply as SSE to one more reader: from its ``start``, everything so far,
    then live, bounded per reader (:mod:`.ssefeed`): a reader that falls behind is dropped."""
    readers = _READERS.get(id(turn))
    if readers is None or readers.turn is not turn:
        readers = _READERS[id(turn)] = _Readers(hub, turn, id(turn))
    return readers.join(headers)


# -- HTTP ----------------------------------------------------------------------------------


class ChatBody(msgspec.Struct, kw_only=True):
    """What ``DefaultChatTransport`` posts (other fields, a page's own ``body``, are ignored)."""

    id: str
    messages: list[dict[str, Any]]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None  # the SDK's name


_STATUS = {
    "too_large": 413,
    "invalid": 400,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "unavailable": 503,
}


def _error(
    code: str, message: str, headers: dict[str, str] | None = None, status: int | None = None
) -> JSONResponse:
    if status is None:
        status = 401 if code == "unauthorized" else _STATUS.get(code, 500)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status, headers=headers)


def _cors(request: Request, hub: ChatHost) -> dict[str, str] | None:
    """CORS headers for an allowed cross-origin browser, ``{}`` for same-origin or
    non-browser clients, None for an origin that is not allowed."""
    origin = request.headers.get("origin")
    if origin is None or origin.split("://", 1)[-1] == request.headers.get("host", ""):
        return {}
    allowed = hub.config.allowed_origins
    if origin not in allowed and "*" not in allowed:
        return None
    return {
        "access-control-allow-origin": origin,
        "access-control-allow-headers": "authorization, content-type",
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-expose-headers": "x-vercel-ai-ui-message-stream",
        "access-control-max-age": "600",
        "vary": "Origin",
    }


def _grant(request: Request, hub: ChatHost) -> Grant | None:
    """The request's grant (None when the hub has no auth secret); raises Forbidden."""
    secret = hub.config.auth_secret
    if secret is None:
        return None
    header = request.headers.get("authorization", "")
    token = header[7:].strip() if header[:7].lower() == "bearer " else None
    return verify_token(secret, token)


def _check(grant: Grant | None, hub: ChatHost, op: str, session_id: str) -> None:
    if hub.config.auth_secret is not None and (grant is None or not grant.allows(op, session_id)):
        raise Forbidden("forbidden")


def _code(exc: SessionHubError) -> str:
    if isinstance(exc, Forbidden):
        return "forbidden"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, InvalidInput):
        return "invalid"
    if isinstance(exc, Conflict):
        return "conflict"
    if isinstance(exc, SummarizerError):
        return "upstream"
    return str(getattr(exc, "code", "internal"))


def _title(messages: list[dict[str, Any]]) -> str:
    for message in messages:
        for part in message.get("parts") or []:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                return " ".join(part["text"].split())[:60] or "chat"
    return "chat"


async def _post(request: Request) -> Response | SseFeed:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    if hub.closing:
        return _error("unavailable", "the hub is shutting down", cors)
    # The token and the declared size first: a stranger's body is never read, and nobody's
    # is read past max_body_bytes.
    try:
        grant = _grant(request, hub)
    except Forbidden:
        return _refused(request, cors)
    try:
        data = await read_body(request.receive, request.headers, hub.config.max_body_bytes)
        body: ChatBody = parse_body(data, ChatBody)
    except BodyError as exc:
        return _error(exc.code, str(exc), cors, exc.status)
    if not body.messages:
        return _error("invalid", "`messages` is empty: nothing to answer", cors)
    try:
        _check(grant, hub, "append_all", body.id)
        # Every message checked (depth, numbers, parts) before anything is written: a bad
        # one must not leave a new chat's session behind, empty.
        messages = [coerce_message(m) for m in body.messages]
        await _ensure_session(hub, grant, body)
        await hub.manager.append_all(body.id, messages, None)
        turn = await hub.turns.start(body.id, messages[-1].id, body.trigger)
    except Forbidden:
        return _refused(request, cors)
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    return reply_stream(hub, turn, cors)


async def _ensure_session(hub: ChatHost, grant: Grant | None, body: ChatBody) -> None:
    """Create the chat's session if it is new. Several first POSTs of one chat race here:
    the one whose create loses finds the session made and goes on to the turn, where all
    but one are told ``conflict`` (a turn is in flight), not that the session exists."""
    if await hub.manager.get(body.id) is not None:
        return
    if hub.config.auth_secret is not None and (grant is None or not grant.allows("create", body.id)):
        raise SessionNotFound(body.id)  # creating one needs admin
    try:
        await hub.store.create_session(_title(body.messages), source="api/chat", session_id=body.id)
    except InvalidInput:
        if await hub.manager.get(body.id) is None:
            raise  # not the race: the create itself was refused


def _refused(request: Request, cors: dict[str, str]) -> Response:
    # Without a token at all the page learns what to send; with a wrong one, only no.
    if request.headers.get("authorization") is None:
        return _error("unauthorized", "this hub needs a token: send Authorization: Bearer <token>", cors)
    return _error("forbidden", "forbidden", cors)


async def _resume(request: Request) -> Response | SseFeed:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    session_id = request.path_params["session_id"]
    try:
        _check(_grant(request, hub), hub, "get_history", session_id)
    except Forbidden:
        return _refused(request, cors)
    try:
        turn = await hub.turns.find(session_id)
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    if turn is None:
        return Response(status_code=204, headers=cors)
    return reply_stream(hub, turn, cors)


async def _stop(request: Request) -> Response:
    """``POST /api/chat/{id}/stop``: stop the turn in flight (the SDK's own ``stop()``
    only closes the reader's connection, which a resumable chat treats as a disconnect)."""
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    session_id = request.path_params["session_id"]
    try:
        _check(_grant(request, hub), hub, "stop_turn", session_id)
        await hub.session(session_id)
        stopped = await hub.turns.stop(session_id, request.query_params.get("turn_id"), "stopped by the user")
    except Forbidden:
        return _refused(request, cors)
    except SessionHubError as exc:
        return _error(_code(exc), str(exc), cors)
    return JSONResponse(stopped, headers=cors)


async def _preflight(request: Request) -> Response:
    hub: ChatHost = request.app.state.hub
    cors = _cors(request, hub)
    if cors is None:
        return _error("forbidden", "origin not allowed")
    return Response(status_code=204, headers=cors)


def chat_routes() -> list[BaseRoute]:
    return [
        Route("/api/chat", _post, methods=["POST"]),
        Route("/api/chat", _preflight, methods=["OPTIONS"]),
        Route("/api/chat/{session_id}/stream", _resume, methods=["GET"]),
        Route("/api/chat/{session_id}/stream", _preflight, methods=["OPTIONS"]),
        Route("/api/chat/{session_id}/stop", _stop, methods=["POST"]),
        Route("/api/chat/{session_id}/stop", _preflight, methods=["OPTIONS"]),
    ]
