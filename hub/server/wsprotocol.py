"""The hub's own WebSocket protocol for uvicorn (``uvicorn.Config(ws=HubWebSocketProtocol)``).

uvicorn's ``websockets-sansio`` protocol holds an ``asyncio.Queue`` and an ``asyncio.Event``
per connection, keeps the handshake's request and response for the socket's whole life, and
frames every outgoing message through ``ServerProtocol.send_text`` and ``data_to_send``:
py-spy put 57% of a fan-out's CPU in its ``send`` (issue 28). This protocol is the same
ASGI WebSocket on the same ``websockets`` sans-I/O ``ServerProtocol`` (handshake, parser,
close handshake, limits), with what an idle connection holds cut down:

- no queue and no event: received messages wait in a list made when one arrives, and a
  future is created only while the app waits for a message or for the transport to drain;
- the handshake's request and response are dropped once the upgrade is answered, and so is
  the ``ServerProtocol`` that parsed it: its parser, a generator, holds the request (its
  headers, ~2.4 KiB measured) for as long as it runs; the frames go to a fresh one, opened
  with the extensions the handshake negotiated (:func:`frames_protocol`);
- a text frame to a peer with no extension negotiated is framed here and written straight
  to the transport (an unmasked server frame is its header and the UTF-8 payload);
- ``__slots__``: no instance dictionary.

Everything else is uvicorn's behaviour, kept so that ``--ws websockets-sansio`` and this
one answer alike: denial responses (``websocket.http.response.*``), a close before accepting
is a 403, ``ws_max_size`` (1009), ``ws_ping_interval``/``ws_ping_timeout`` (1011 when a
pong is late; one timer for all connections, :mod:`.wskeepalive`), reading paused while a
message waits for the app, sends waiting while the transport is above its high-water mark,
``websocket.disconnect`` on connection loss.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import uuid
from http import HTTPStatus
from typing import Any, cast

from starlette.types import Message
from uvicorn.config import Config
from uvicorn.protocols.utils import (
    ClientDisconnected,
    get_client_addr,
    get_path_with_query_string,
)
from uvicorn.server import ServerState
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol
from websockets.typing import LoggerLike

from .wsframes import text_frame
from .wshandshake import asgi_scope, deflate, denial_response
from .wskeepalive import Keepalive, keepalive_for

__all__ = ["HubWebSocketProtocol"]

log = logging.getLogger("uvicorn.error")  # uvicorn's, so its level and our log filter apply


_CLOSE_TIMEOUT = 10.0  # uvicorn's: how long a sent close frame waits for the peer's

#: The id every frames protocol carries (websockets gives each a fresh ``uuid4``, which it
#: uses only in its own asyncio connection's logs; this one serves none of those).
_NO_ID = uuid.UUID(int=0)


def frames_protocol(handshake: ServerProtocol, max_size: int | None, logger: LoggerLike) -> ServerProtocol:
    """The ``ServerProtocol`` that goes on from an accepted handshake: open, with what it
    negotiated (extensions, subprotocol). Only for a peer that has sent nothing since its
    request (RFC 6455 4.1: a client waits for the 101): the handshake's parser would be
    somewhere in a frame of whatever came early."""
    frames = ServerProtocol(state=OPEN, max_size=max_size, logger=logger)
    frames.id = _NO_ID
    frames.extensions = handshake.extensions
    frames.subprotocol = handshake.subprotocol
    return frames


class HubWebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection under uvicorn, served to an ASGI app."""

    # No instance dictionary (asyncio.Protocol has empty slots).
    __slots__ = (
        "app", "app_state", "close_sent", "close_timer", "config", "conn", "connect_pending",
        "connections", "default_headers", "disconnected", "early_data", "ending", "fragments",
        "fragments_text", "handshake_complete", "inbox", "initial_response", "keepalive", "last_ping_rtt",
        "loop", "next_ping_at", "pending_ping", "ping_sent_at", "read_paused", "receiver", "request",
        "response", "scope", "tasks", "transport", "writable", "write_paused"
    )  # fmt: skip

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.app_state = app_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.default_headers = server_state.default_headers

        self.transport: asyncio.Transport = cast(asyncio.Transport, None)
        self.scope: dict[str, Any] = {}
        self.request: Request | None = None
        self.response: Response | None = None

        self.handshake_complete = False
        self.early_data = False
        self.close_sent = False
        self.disconnected = False
        self.close_timer: asyncio.TimerHandle | None = None
        self.initial_response: tuple[int, list[tuple[str, str]], bytes] | None = None

        self.conn = ServerProtocol(
            extensions=deflate() if config.ws_per_message_deflate else None,
            max_size=config.ws_max_size,
            logger=log,
        )

        # What the app has not received yet: the connect event, messages (a list made when
        # one arrives), the disconnect (kept, and given again to a later receive).
        self.connect_pending = True
        self.inbox: list[Message] | None = None
        self.ending: Message | None = None
        self.receiver: asyncio.Future[None] | None = None  # the app waiting in receive()
        self.read_paused = False
        self.write_paused = False
        self.writable: asyncio.Future[None] | None = None  # senders waiting for the drain
        self.fragments: list[bytes] | None = None
        self.fragments_text = False

        self.keepalive: Keepalive | None = None
        self.next_ping_at = 0.0
        self.pending_ping: bytes | None = None
        self.ping_sent_at = 0.0
        self.last_ping_rtt = 0.0

    # -- the transport's calls ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(cast(Any, self))
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_keepalive()
        self.finish({"type": "websocket.disconnect", "code": 1005 if self.handshake_complete else 1006})
        self.connections.discard(cast(Any, self))
        self.handshake_complete = True
        self.disconnected = True
        # A transport lost while paused never resumes writing: wake the senders now.
        self._wake_writers()
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        if exc is None:
            self.transport.close()

    def eof_received(self) -> None:
        pass

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writers()

    def _wake_writers(self) -> None:
        writable, self.writable = self.writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def shutdown(self) -> None:
        """uvicorn is stopping: a 1012 close to an open socket, a 500 to a handshake."""
        self.stop_keepalive()
        if self.close_sent:
            if self.close_timer is not None:
                self.close_timer.cancel()
                self.close_timer = None
            self.transport.close()
            return
        if self.handshake_complete:
            self.finish({"type": "websocket.disconnect", "code": 1012})
            self.conn.send_close(1012)
            self._flush()
        else:
            self.send_500_response()
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self.handshake_complete and not self.early_data:
            # Anything but one whole request before the answer (uvicorn hands the request
            # over in one piece) leaves the handshake's parser where only it knows.
            self.early_data = self.request is not None or data.find(b"\r\n\r\n") != len(data) - 4
        conn = self.conn
        conn.receive_data(data)
        if conn.parser_exc is not None:
            self.parser_failed()
            return
        for event in conn.events_received():
            if isinstance(event, Frame):
                self.frame_received(event)
            elif isinstance(event, Request):
                self.handle_connect(event)

    def frame_received(self, frame: Frame) -> None:
        opcode = frame.opcode
        if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
            if frame.fin:
                self.message_received(opcode is Opcode.TEXT, frame.data)
            else:
                self.fragments = [bytes(frame.data)]
                self.fragments_text = opcode is Opcode.TEXT
        elif opcode is Opcode.CONT:
            fragments = self.fragments
            if fragments is not None:  # the parser allows no continuation without a start
                fragments.append(bytes(frame.data))
                if frame.fin:
                    self.fragments = None
                    self.message_received(self.fragments_text, b"".join(fragments))
        elif opcode is Opcode.PING:
            self._flush()  # the parser has queued the pong
        elif opcode is Opcode.PONG:
            self.pong_received(bytes(frame.data))
        elif opcode is Opcode.CLOSE:
            self.close_received()

    # -- the handshake -----------------------------------------------------------------------

    def handle_connect(self, request: Request) -> None:
        response = self.conn.accept(request)
        if response.status_code != 101:  # not a WebSocket handshake websockets accepts
            self.handshake_complete = True
            self.close_sent = True
            self.conn.send_response(response)
            self._flush()
            self.transport.close()
            return
        self.request = request
        self.response = response
        self.scope = asgi_scope(request, self.transport, self.config, self.app_state)
        task = self.loop.create_task(self.run_asgi())
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def run_asgi(self) -> None:
        try:
            result = await self.app(self.scope, self.receive, self.send)
        except ClientDisconnected:
            pass
        except BaseException:
            log.exception("Exception in ASGI application\n")
            self.send_500_response()
        else:
            if not self.handshake_complete:
                log.error("ASGI callable returned without completing handshake.")
                self.send_500_response()
            elif result is not None:
                log.error("ASGI callable should return None, but returned '%s'.", result)
        if self.close_timer is None:
            self.transport.close()

    def send_500_response(self) -> None:
        if self.initial_response is not None or self.handshake_complete:
            return
        self.conn.send_response(self.conn.reject(500, "Internal Server Error"))
        self._flush()

    # -- keepalive (one timer for every connection: hub/server/wskeepalive.py) ----------------

    def start_keepalive(self) -> None:
        interval = self.config.ws_ping_interval
        if interval is not None and interval > 0:
            self.keepalive = keepalive_for(self.loop, interval, self.config.ws_ping_timeout)
            self.next_ping_at = self.loop.time() + interval
            self.keepalive.add(self)

    def stop_keepalive(self) -> None:
        if self.keepalive is not None:
            self.keepalive.discard(self)
            self.keepalive = None
        self.pending_ping = None

    def keepalive_tick(self, now: float) -> None:
        """The keepalive's visit: a ping when one is due, 1011 when its pong is overdue."""
        timeout = self.config.ws_ping_timeout
        if self.pending_ping is not None and timeout is not None:
            if now - self.ping_sent_at >= timeout:
                self.ping_timed_out()
        elif now >= self.next_ping_at:
            self.send_ping(now)

    def send_ping(self, now: float) -> None:
        if self.close_sent or self.transport.is_closing():
            return
        # A random payload names this ping: a stale or unsolicited pong is not its answer.
        self.pending_ping = struct.pack("!I", random.getrandbits(32))
        self.ping_sent_at = now
        self.conn.send_ping(self.pending_ping)
        self._flush()
        if self.config.ws_ping_timeout is None:  # ping on at the interval, pong or not
            self.next_ping_at = now + cast(float, self.config.ws_ping_interval)

    def pong_received(self, payload: bytes) -> None:
        if self.pending_ping is None or payload != self.pending_ping:
            return
        now = self.loop.time()
        self.last_ping_rtt = now - self.ping_sent_at
        self.pending_ping = None
        if self.config.ws_ping_timeout is not None:  # uvicorn's: the next one an interval on, less the rtt
            self.next_ping_at = now + max(0.0, cast(float, self.config.ws_ping_interval) - self.last_ping_rtt)

    def ping_timed_out(self) -> None:
        self.stop_keepalive()
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.fail(1011, "keepalive ping timeout")
        self._flush()
        self.close_sent = True
        self.finish({"type": "websocket.disconnect", "code": 1011, "reason": "keepalive ping timeout"})
        self.transport.close()

    # -- closing -----------------------------------------------------------------------------

    def close_received(self) -> None:
        if self.close_sent:  # the peer's answer to our close: the closing handshake is done
            if self.close_timer is not None:
                self.close_timer.cancel()
                self.close_timer = None
                self.transport.close()
            return
        if not self.transport.is_closing():
            received = self.conn.close_rcvd
            code = 1005 if received is None else received.code
            reason = "" if received is None else received.reason
            self.finish({"type": "websocket.disconnect", "code": code, "reason": reason})
            self._flush()  # the parser has queued the answering close frame
            self.transport.close()

    def parser_failed(self) -> None:
        """A frame broke the protocol or a limit (1009 past ``ws_max_size``): websockets has
        queued its close frame; tell the app and go."""
        sent = self.conn.close_sent
        code = 1006 if sent is None else sent.code
        reason = "" if sent is None else sent.reason
        self.finish({"type": "websocket.disconnect", "code": code, "reason": reason})
        self._flush()
        self.close_sent = True
        self.transport.close()

    # -- what the app receives ---------------------------------------------------------------

    def message_received(self, text: bool, data: bytes | bytearray | memoryview) -> None:
        if self.close_sent:
            # The app is past websocket.close: drop the message, keep reading until the
            # peer's close frame arrives.
            return
        message: Message
        if text:
            try:
                message = {"type": "websocket.receive", "text": str(data, "utf-8")}
            except UnicodeDecodeError:
                # The message hub.server.logfilter keeps to one line a minute.
                log.warning("Invalid UTF-8 sequence received from client.")
                self.conn.send_close(1007)
                self.parser_failed()
                return
        else:
            message = {"type": "websocket.receive", "bytes": bytes(data)}
        inbox = self.inbox
        if inbox is None:
            self.inbox = [message]
        else:
            inbox.append(message)
        self._wake_receiver()
        if not self.read_paused:
            # Backpressure: the next frames stay in the socket until the app has read this.
            self.read_paused = True
            self.transport.pause_reading()

    def finish(self, message: Message) -> None:
        """The last thing the app receives (the first disconnect wins)."""
        if self.ending is None:
            self.ending = message
        self._wake_receiver()

    def _wake_receiver(self) -> None:
        receiver = self.receiver
        if receiver is not None and not receiver.done():
            receiver.set_result(None)

    async def receive(self) -> Message:
        while True:
            if self.connect_pending:
                self.connect_pending = False
                return {"type": "websocket.connect"}
            inbox = self.inbox
            if inbox:
                message = inbox.pop(0)
                if not inbox:
                    self.inbox = None
                    if self.read_paused and not self.close_sent:
                        self.read_paused = False
                        self.transport.resume_reading()
                return message
            if self.ending is not None:
                return self.ending
            receiver = self.receiver = self.loop.create_future()
            try:
                await receiver
            finally:
                self.receiver = None

    # -- what the app sends ------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        if self.write_paused and not self.disconnected:
            await self._drained()
        if self.disconnected:
            raise ClientDisconnected()
        kind = message["type"]
        if self.initial_response is not None:
            self.send_denial_body(message)
        elif not self.handshake_complete:
            self.send_handshake(message)
        elif self.close_sent:
            raise RuntimeError(f"Unexpected ASGI message '{kind}', after sending 'websocket.close'.")
        elif kind == "websocket.send":
            text = message.get("text")
            if text is not None:
                self.write_text(text)
            else:
                self._send_with(self.conn.send_binary, message.get("bytes") or b"")
        elif kind == "websocket.close":
            self.send_close(message.get("code", 1000), message.get("reason") or "")
        else:
            raise RuntimeError(
                f"Expected ASGI message 'websocket.send' or 'websocket.close', but got '{kind}'."
            )

    async def _drained(self) -> None:
        writable = self.writable
        if writable is None:
            writable = self.writable = self.loop.create_future()
        # Shielded: one sender cancelled (a timeout) must not cancel the others' wait.
        await asyncio.shield(writable)

    def _frames_as_is(self) -> bool:
        """Whether a frame built here goes to the peer as it is: the socket open, with no
        extension (permessage-deflate) to transform it."""
        conn = self.conn
        return not conn.extensions and conn.state is OPEN

    def write_text(self, text: str) -> None:
        """A text message, framed here and written at once (through ``ServerProtocol`` when
        an extension such as permessage-deflate transforms its frames)."""
        if not self._frames_as_is():
            self._send_with(self.conn.send_text, text.encode())
            return
        self.transport.write(text_frame(text.encode()))

    def write_frame(self, frame: bytes) -> bool:
        """Write ``frame``, a text frame framed already (:func:`.wsframes.text_frame`, shared
        by every subscriber of one event), if it can go as it is, now: the connection not
        lost, no close sent, the transport below its high-water mark. False: it was not
        written; the caller sends it the ordinary way, behind whatever waits (which, for a
        lost connection, fails as ``send`` does: asyncio would log every write past the
        fifth to a lost transport)."""
        if self.disconnected or self.write_paused or self.close_sent or not self._frames_as_is():
            return False
        self.transport.write(frame)
        return True

    def _send_with(self, sender: Any, data: bytes) -> None:
        try:
            sender(data)
        except InvalidState:
            raise ClientDisconnected() from None
        self._flush()

    def send_close(self, code: int, reason: str) -> None:
        if self.transport.is_closing():
            return
        self.finish({"type": "websocket.disconnect", "code": code, "reason": reason})
        try:
            self.conn.send_close(code, reason)
        except InvalidState:
            raise ClientDisconnected() from None
        self._flush()
        self.close_sent = True
        if self.read_paused:  # read on, to hear the peer's close frame
            self.read_paused = False
            self.transport.resume_reading()
        self.close_timer = self.loop.call_later(_CLOSE_TIMEOUT, self.transport.close)

    def send_handshake(self, message: Message) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            log.info('%s - "WebSocket %s" [accepted]', get_client_addr(self._scope()), self._path())
            response = self.response
            assert response is not None
            headers = [
                (name.decode("latin-1").lower(), value.decode("latin-1"))
                for name, value in (*self.default_headers, *message.get("headers", ()))
            ]
            if message.get("subprotocol"):
                headers.append(("Sec-WebSocket-Protocol", message["subprotocol"]))
            del response.headers["Date"]
            response.headers.update(headers)
            if not self.transport.is_closing():
                self.handshake_complete = True
                self.conn.send_response(response)
                self._flush()
                if not self.early_data:
                    self.conn = frames_protocol(self.conn, self.config.ws_max_size, log)
                self.start_keepalive()
            # The upgrade is answered: the request and response are no longer read.
            self.request = None
            self.response = None
        elif kind == "websocket.close":
            log.info('%s - "WebSocket %s" 403', get_client_addr(self._scope()), self._path())
            self.finish({"type": "websocket.disconnect", "code": 1006})
            self.conn.send_response(self.conn.reject(HTTPStatus.FORBIDDEN, ""))
            self.close_sent = True
            self.handshake_complete = True
            self._flush()
            self.transport.close()
            self.request = None
            self.response = None
        elif kind == "websocket.http.response.start":
            status = message["status"]
            if not 100 <= status < 600:
                raise RuntimeError(f"Invalid HTTP status code '{status}' in response.")
            log.info('%s - "WebSocket %s" %d', get_client_addr(self._scope()), self._path(), status)
            headers = [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in message.get("headers", ())
            ]
            self.initial_response = (status, headers, b"")
        else:
            raise RuntimeError(
                "Expected ASGI message 'websocket.accept', 'websocket.close' "
                f"or 'websocket.http.response.start' but got '{kind}'."
            )

    def send_denial_body(self, message: Message) -> None:
        if message["type"] != "websocket.http.response.body":
            raise RuntimeError(
                f"Expected ASGI message 'websocket.http.response.body' but got '{message['type']}'."
            )
        assert self.initial_response is not None
        status, headers, body = self.initial_response
        body += message.get("body", b"")
        self.initial_response = (status, headers, body)
        if message.get("more_body", False):
            return
        self.finish({"type": "websocket.disconnect", "code": 1006})
        self.conn.send_response(denial_response(status, headers, body))
        self.close_sent = True
        self.handshake_complete = True
        self._flush()
        self.transport.close()
        self.request = None
        self.response = None

    def _flush(self) -> None:
        """Write what ``ServerProtocol`` has queued (a handshake answer, a pong, a close)."""
        output = self.conn.data_to_send()
        if output:
            self.transport.write(b"".join(output))

    def _scope(self) -> Any:
        return self.scope

    def _path(self) -> str:
        return get_path_with_query_string(self._scope())
