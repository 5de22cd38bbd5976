"""The bare broadcast servers ``bench/bench_hub.py`` measures the hub against (its anchors).

Both speak only the part of the hub's protocol the bench's writer and subscribers use
(``create``, ``subscribe``, ``append``, ``ping``), keep no storage, and send each append to
every subscriber of its session as one ``event`` frame, encoded once:

- ``websockets``: ``websockets.asyncio.server.serve`` plus ``broadcast()``, pure Python, the
  stack the hub's own clients use;
- ``picows``: picows 2.3 (Cython WebSocket framing; on aiofastnet's transport when that is
  installed, as picows chooses by default), the fastest well-kept asyncio WebSocket server
  that installs here: the limit a Python hub can approach.

The protocol state is one class (:class:`BareHub`) shared by both, so the two anchors differ
only in their WebSocket stack. Run as ``bench_hub.py --worker baseline|picows --port N``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

EPOCH = "baseline"

C = TypeVar("C", bound=Hashable)


class BareHub(Generic[C]):
    """Sessions, their subscribers and seqs; what a request answers and whom it rings.
    ``C`` is the stack's connection object."""

    def __init__(self) -> None:
        self.subscribers: dict[str, set[C]] = {}
        self.seqs: dict[str, int] = {}

    def handle(self, conn: C, raw: str | bytes) -> tuple[str, str | None, set[C]]:
        """The reply to send ``conn``, and an event frame (or None) to send ``targets``
        first: the event goes out before the writer's reply, as the hub's does."""
        req = json.loads(raw)
        op, rid = req.get("op"), req.get("id")
        if op == "create":
            sid = uuid.uuid4().hex
            self.subscribers[sid] = set()
            self.seqs[sid] = 0
            return _reply(rid, {"id": sid, "name": req.get("name")}), None, set()
        if op == "subscribe":
            sid = req["session_id"]
            reply = _reply(rid, {"epoch": EPOCH, "last_seq": self.seqs[sid]})
            self.subscribers[sid].add(conn)
            return reply, None, set()
        if op == "append":
            sid = req["session_id"]
            self.seqs[sid] += 1
            frame = json.dumps(
                {
                    "frame": "event",
                    "stream": "session",
                    "session_id": sid,
                    "seq": self.seqs[sid],
                    "epoch": EPOCH,
                    "type": "message.appended",
                    "data": {"message": req["message"], "parent_id": None},
                    "created_at": datetime.now(UTC).isoformat(),
                }
            )
            return _reply(rid, req["message"]["id"]), frame, self.subscribers[sid]
        if op == "ping":
            return _reply(rid, "pong"), None, set()
        error = {"frame": "error", "id": rid, "code": "unknown_op", "message": str(op)}
        return json.dumps(error), None, set()

    def drop(self, conn: C) -> None:
        for subs in self.subscribers.values():
            subs.discard(conn)


def _reply(rid: Any, result: Any) -> str:
    return json.dumps({"frame": "reply", "id": rid, "result": result})


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def websockets_server(port: int) -> int:
    from websockets.asyncio.server import ServerConnection, broadcast, serve
    from websockets.exceptions import ConnectionClosed

    state: BareHub[ServerConnection] = BareHub()

    async def handler(ws: ServerConnection) -> None:
        try:
            async for raw in ws:
                reply, frame, targets = state.handle(ws, raw)
                if frame is not None:
                    broadcast(targets, frame)
                await ws.send(reply)
        except ConnectionClosed:
            pass
        finally:
            state.drop(ws)

    async with serve(
        handler, "127.0.0.1", port, compression=None, max_size=1 << 24, ping_interval=20, ping_timeout=20
    ):
        await _until_signalled()
    return 0


async def picows_server(port: int) -> int:
    from picows import WSFrame, WSListener, WSMsgType, WSTransport, WSUpgradeRequest, ws_create_server

    state: BareHub[WSTransport] = BareHub()

    class Listener(WSListener):
        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            if frame.msg_type == WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code(), frame.get_close_message())
                transport.disconnect()
                return
            if frame.msg_type != WSMsgType.TEXT:
                return  # pings are answered by picows itself (enable_auto_pong)
            reply, event, targets = state.handle(transport, frame.get_payload_as_bytes())
            if event is not None:
                data = event.encode()
                for target in targets:
                    target.send(WSMsgType.TEXT, data)
            transport.send(WSMsgType.TEXT, reply.encode())

        def on_ws_disconnected(self, transport: WSTransport) -> None:
            state.drop(transport)

    def factory(request: WSUpgradeRequest) -> Listener:
        return Listener()

    server = await ws_create_server(
        factory, "127.0.0.1", port, max_frame_size=1 << 24, websocket_handshake_timeout=60
    )
    try:
        await _until_signalled()
    finally:
        server.close()
    return 0
