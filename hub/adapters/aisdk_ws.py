"""The AI SDK 7 ``WebSocketChatTransport`` at ``/api/chat/ws``.

``new WebSocketChatTransport({ url: "ws://hub/api/chat/ws", params: { token } })`` sends
``send`` (a chat's messages, as ``DefaultChatTransport`` posts them), ``resume`` (a chat's
reply in flight, ``lastSequence`` omitted: all of it again) and ``abort`` frames, each with
a ``requestId``; the hub answers ``start``, ``chunk {sequence, chunk}`` (sequences gap-free
from 0 per request), ``end``, ``error {errorText}`` and ``no-active``. Many requests share
one socket. The chunks are the UI message stream chunks of ``POST /api/chat``
(:class:`~hub.adapters.uistream.UIMessageEncoder`), so what the SDK rebuilds is what the hub
stores, whichever door a page uses.

- ``send`` appends the messages the hub does not hold (idempotent by id), creates the chat's
  session if it is new (``admin``), starts a turn and streams its reply.
- ``resume`` without ``lastSequence`` replays the reply in flight from its first chunk, then
  goes live; ``no-active`` when no turn is in flight on any node. With ``lastSequence`` N
  it continues after chunk N, nothing doubled: the chunks are numbered per turn, from the
  turn's first, by the node that renders them, which keeps them while the turn runs (bounded
  by ``max_stream_bytes``). A node that did not see the turn from its start, or one past that
  bound, answers ``error`` ("resume without lastSequence"), never a wrong continuation.
- ``abort`` stops the turn the request streams, as ``POST /api/chat/{id}/stop`` does (the
  SDK sends it on ``stop()``): the reply ends with an ``abort`` chunk, then ``end``.

Tokens: browsers cannot set headers on a WebSocket, so the token comes as ``?token=`` (the
transport's ``params``), or as ``Authorization: Bearer`` or the ``bearer.<token>``
subprotocol; it is checked on every request, with the op's scope (``send``: write,
``resume``: read, ``abort``: ``stop_turn``), so a socket whose token expires is refused from
then on. Every frame is bounded by ``max_body_bytes`` before it is parsed, and what waits to
be sent to one socket by ``outbox_bytes`` and ``send_timeout``: a socket that does not read
is closed (4008), the turn goes on. A frame that is not a request is answered with an
``error`` for its ``requestId`` (if it has one), and the socket stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any, Literal

import msgspec
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol import Forbidden, SessionHubError, SessionNotFound, coerce_message
from protocol.serverconn import CLOSE_TOKEN_EXPIRED, EXPIRED_REASON

from ..auth import Grant, verify_token
from ..server.handshake import origin_allowed, token_of
from ..server.outbox import Outbox
from .answers import answer_all, continued_turn, pending_answers
from .caller import Caller, writing
from .chats import ChatBody, ensure_session, error_code
from .port import Adapter, ChatHost, ChatTurn, host_of
from .replychunks import TurnChunks, turn_chunks

__all__ = ["Socket", "adapter"]

log = logging.getLogger("sessionhub.chat")

#: Close codes: the hub's own socket uses the same for a reader that does not read.
CLOSE_SLOW_CONSUMER = 4008
CLOSE_GOING_AWAY = 1001
_SLOW = (CLOSE_SLOW_CONSUMER, "too slow: the chat stream fell behind")


class Send(msgspec.Struct, tag="send", tag_field="type", kw_only=True):
    requestId: str
    id: str
    messages: list[dict[str, Any]]
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None


class Resume(msgspec.Struct, tag="resume", tag_field="type", kw_only=True):
    requestId: str
    id: str
    lastSequence: int | None = None


class Abort(msgspec.Struct, tag="abort", tag_field="type", kw_only=True):
    requestId: str


ChatRequest = Send | Resume | Abort
_decode = msgspec.json.Decoder(ChatRequest).decode


class _Loose(msgspec.Struct):
    """Enough of a bad frame to answer it: its ``requestId``, if it has a string one."""

    requestId: Any = None


_decode_loose = msgspec.json.Decoder(_Loose).decode


def _frame(kind: str, request_id: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "requestId": request_id, **fields}, separators=(",", ":"))


class _Stream:
    """One request's reply on one socket: its own gap-free sequence, from 0."""

    def __init__(self, socket: Socket, request_id: str, chunks: TurnChunks) -> None:
        self.socket, self.request_id, self.chunks = socket, request_id, chunks
        self.sequence = 0  # the next chunk's sequence on this request
        self.next = 0  # the next kept chunk of the turn this request is given

    def begin(self, after: int | None) -> None:
        """``start``, then from the turn's first chunk (a send, or a replay: ``after`` None)
        or after chunk ``after`` (a continuation), then live."""
        self.socket.push(_frame("start", self.request_id))
        chunks = self.chunks
        if after is None:
            texts, self.next = chunks.replay()
            for text in texts:
                self._chunk(text)
        else:
            self.sequence = self.next = after + 1
        chunks.listeners.append(self)
        self.deliver(self.next, chunks.done)

    def deliver(self, first: int, last: bool) -> None:
        kept = self.chunks.texts
        for index in range(max(first, self.next), len(kept)):
            self._chunk(kept[index])
        self.next = len(kept)
        if last:
            self.socket.push(_frame("end", self.request_id))
            self.leave()

    def _chunk(self, text: str) -> None:
        self.socket.push(
            f'{{"type":"chunk","requestId":{json.dumps(self.request_id)},"sequence":{self.sequence},"chunk":{text}}}'
        )
        self.sequence += 1

    def leave(self) -> None:
        with contextlib.suppress(ValueError):
            self.chunks.listeners.remove(self)
        self.socket.streams.pop(self.request_id, None)


class Socket:
    """One ``/api/chat/ws`` connection: its token, its requests, and its bounded outbox."""

    def __init__(self, hub: ChatHost, websocket: WebSocket) -> None:
        self.hub, self.websocket = hub, websocket
        config = hub.config
        self.outbox = Outbox(1 << 30, config.outbox_bytes, hub.sse_held)
        self.streams: dict[str, _Stream] = {}
        self.grant: Grant | None = None
        self.token: str | None = None
        #: The close code and reason once the socket is to end (the drainer closes it).
        self.closing: tuple[int, str] | None = None
        self.wake = asyncio.Event()
        self._expiry: asyncio.TimerHandle | None = None

    # -- sending -------------------------------------------------------------------------

    def push(self, text: str) -> None:
        if self.closing is not None:
            return
        if not self.outbox.fits(text):
            self.closing = _SLOW
            self.hub.metrics.sse_dropped.labels("behind").inc()
            log.info("closed a chat socket more than outbox_bytes behind")
            self.wake.set()
            return
        self.outbox.put_nowait(text)
        self.wake.set()

    async def drain(self) -> None:
        """Write what is queued; a send not taken for ``send_timeout`` ends the socket."""
        timeout = self.hub.config.send_timeout
        while True:
            while self.outbox.qsize():
                text = self.outbox.get_nowait()
                if text is None:
                    continue
                try:
                    await asyncio.wait_for(self.websocket.send_text(text), timeout)
                except TimeoutError:
                    self.closing = _SLOW
                    self.hub.metrics.sse_dropped.labels("timeout").inc()
                    break
            if self.closing is not None:
                with contextlib.suppress(Exception):
                    await self.websocket.close(*self.closing)
                return
            self.wake.clear()
            await self.wake.wait()

    async def serve(self, drainer: asyncio.Task[None]) -> None:
        """Read and handle frames until the peer goes, or the drainer ends the socket."""
        websocket = self.websocket
        while self.closing is None:
            receive = asyncio.ensure_future(websocket.receive())
            done, _ = await asyncio.wait({receive, drainer}, return_when=asyncio.FIRST_COMPLETED)
            if receive not in done:
                receive.cancel()
                return
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                try:
                    text = (message.get("bytes") or b"").decode("utf-8")
                except UnicodeDecodeError:
                    continue
            await self.handle(text)

    def close_at_expiry(self) -> None:
        """Close the socket with 4001 when its token expires, as the hub's own socket does:
        a socket that is sent a session's changes without asking (a room's tab) must not
        go on hearing them past ``exp``. Nothing without a verified token."""
        if self.grant is None or self._expiry is not None:
            return
        delay = max(0.0, self.grant.expires_at - time.time())
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self._expiry = None
        if self.closing is None:
            self.closing = (CLOSE_TOKEN_EXPIRED, EXPIRED_REASON)
            self.wake.set()

    def stop_expiry(self) -> None:
        if self._expiry is not None:  # no timer outlives the socket
            self._expiry.cancel()
            self._expiry = None

    # -- requests ------------------------------------------------------------------------

    def caller(self) -> Caller:
        """This socket's token as the HTTP doors' :class:`~hub.adapters.caller.Caller`."""
        return writing(Caller(self.hub.config.auth_secret is not None, self.grant), self.hub.config)

    def _allowed(self, op: str, session_id: str) -> bool:
        secret = self.hub.config.auth_secret
        if secret is None:
            return True
        if self.grant is None:
            try:
                self.grant = verify_token(secret, self.token)
            except Forbidden:
                return False
        return self.grant.allows(op, session_id)

    def _refuse(self, request_id: str) -> None:
        if self.token is None:
            text = "unauthorized: this hub needs a token (?token=<token> on the WebSocket URL)"
        else:
            text = "forbidden"
        self.push(_frame("error", request_id, errorText=text))

    async def handle(self, text: str) -> None:
        if len(text) > self.hub.config.max_body_bytes:
            self._bad(text, f"the frame is over max_body_bytes ({self.hub.config.max_body_bytes})")
            return
        try:
            request = _decode(text)
        except msgspec.DecodeError as exc:
            self._bad(text, f"not a chat request: {exc}")
            return
        match request:
            case Send():
                await self._send(request)
            case Resume():
                await self._resume(request)
            case Abort():
                await self._abort(request)

    def _bad(self, text: str, why: str) -> None:
        try:
            request_id = _decode_loose(text).requestId
        except msgspec.DecodeError:
            request_id = None
        if isinstance(request_id, str):
            self.push(_frame("error", request_id, errorText=why))
        else:
            log.info("a chat socket sent a frame with no requestId: %s", why[:200])

    def _busy(self, request_id: str) -> bool:
        if request_id in self.streams:
            self.push(_frame("error", request_id, errorText="that requestId is streaming already"))
            return True
        return False

    async def _send(self, request: Send) -> None:
        hub = self.hub
        if self._busy(request.requestId):
            return
        if hub.closing:
            self.push(_frame("error", request.requestId, errorText="unavailable: the hub is shutting down"))
            return
        if not request.messages:
            self.push(_frame("error", request.requestId, errorText="invalid: `messages` is empty"))
            return
        try:
            turn = await continued_turn(hub, request.id, request.messages[-1])
            if turn is not None:
                # The page answers a tool of the reply in flight: the reply goes on (answers.py),
                # and this request streams what comes after what the page holds.
                if not self._allowed("answer_tool", request.id):
                    self._refuse(request.requestId)
                    return
                answers = pending_answers(hub, self.caller(), turn, request.messages[-1])
                stream = self.streams[request.requestId] = _Stream(
                    self, request.requestId, turn_chunks(hub, turn, primed=True)
                )
                stream.begin(-1)  # every chunk of the new rendering, from its start
                try:
                    await answer_all(hub, answers)
                except BaseException:
                    stream.leave()
                    raise
                return
        except Forbidden:
            self._refuse(request.requestId)
            return
        except SessionHubError as exc:
            self.push(_frame("error", request.requestId, errorText=f"{error_code(exc)}: {exc}"))
            return
        if not self._allowed("append_all", request.id):
            self._refuse(request.requestId)
            return
        body = ChatBody(
            id=request.id, messages=request.messages, trigger=request.trigger, messageId=request.messageId
        )
        try:
            messages = [coerce_message(m) for m in request.messages]
            await ensure_session(hub, self.caller(), body, source="api/chat/ws")
            await hub.manager.append_all(request.id, messages, None)
            turn = await hub.turns.start(request.id, messages[-1].id, request.trigger)
        except Forbidden:
            self._refuse(request.requestId)
            return
        except SessionHubError as exc:
            self.push(_frame("error", request.requestId, errorText=f"{error_code(exc)}: {exc}"))
            return
        self._stream(request.requestId, turn, None)

    async def _resume(self, request: Resume) -> None:
        if self._busy(request.requestId):
            return
        if not self._allowed("get_history", request.id):
            self._refuse(request.requestId)
            return
        try:
            turn = await self.hub.turns.find(request.id)
        except SessionNotFound:
            turn = None  # a new chat's page resumes on load: nothing in flight, not an error
        except SessionHubError as exc:
            self.push(_frame("error", request.requestId, errorText=f"{error_code(exc)}: {exc}"))
            return
        if turn is None:
            self.push(_frame("no-active", request.requestId))
            return
        after = request.lastSequence
        if after is not None:
            chunks = turn_chunks(self.hub, turn)
            if not chunks.whole or after >= len(chunks.texts) or after < 0:
                self.push(
                    _frame(
                        "error",
                        request.requestId,
                        errorText=(
                            f"cannot continue after chunk {after} on this node: resume without "
                            "lastSequence for the whole reply"
                        ),
                    )
                )
                return
        self._stream(request.requestId, turn, after)

    def _stream(self, request_id: str, turn: ChatTurn, after: int | None) -> None:
        stream = self.streams[request_id] = _Stream(self, request_id, turn_chunks(self.hub, turn))
        stream.begin(after)

    async def _abort(self, request: Abort) -> None:
        stream = self.streams.get(request.requestId)
        if stream is None:
            return  # ended already, or never ours: nothing to stop
        turn = stream.chunks.turn
        if not self._allowed("stop_turn", turn.session_id):
            stream.leave()  # the request is abandoned either way: stop sending it
            return
        try:
            await self.hub.turns.stop(turn.session_id, None, "stopped by the user")
        except SessionHubError:
            stream.leave()  # the turn ended meanwhile

    def close(self) -> None:
        for stream in list(self.streams.values()):
            stream.leave()


async def _endpoint(websocket: WebSocket) -> None:
    hub = host_of(websocket)
    if not origin_allowed(websocket, hub.config):
        await websocket.close(1008, "origin not allowed")  # before accept: HTTP 403
        return
    token, subprotocol = token_of(websocket)
    token = token or websocket.query_params.get("token")
    await websocket.accept(subprotocol=subprotocol)
    if hub.closing:
        await websocket.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
        return
    socket = Socket(hub, websocket)
    socket.token = token
    drainer = asyncio.create_task(socket.drain())
    try:
        await socket.serve(drainer)
    except WebSocketDisconnect:
        pass
    finally:
        socket.close()
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await drainer
        socket.outbox.close()  # what it held no longer counts in sessionhub_sse_bytes


def adapter() -> Adapter:
    """The AI SDK 7 WebSocket chat transport, as ``create_app`` mounts it."""
    return Adapter("aisdk_ws", [WebSocketRoute("/api/chat/ws", _endpoint)])
