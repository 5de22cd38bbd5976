"""The hub: the open connections, who is on which session, the tails and streams, the drain."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol import SessionNotFound

from ..auth import VerifiedTokens
from ..bus import RemoteBus
from ..manager import SessionManager
from ..session import Session
from ..store.base import Store
from .admission import Admission
from .config import HubConfig
from .handshake import release_handshake, token_of
from .metrics import Metrics
from .ops import Op, operations, receive
from .outage import StoreWatch
from .outbox import Held
from .presence import Presence
from .pruner import Retention
from .relay import Relay
from .socket_shell import CLOSE_GOING_AWAY, CLOSE_UNSUPPORTED, Connection
from .streams import Streams
from .tails import Tails
from .turndispatch import Turns

if TYPE_CHECKING:
    from .workers import WorkerSummarizer


class Hub:
    """The application's state: the store, the manager, the open connections."""

    def __init__(
        self,
        store: Store,
        manager: SessionManager,
        config: HubConfig,
        worker_summarizer: WorkerSummarizer | None = None,
    ) -> None:
        self.worker_summarizer = worker_summarizer
        if worker_summarizer is not None:
            worker_summarizer.attach(self)
        self.store = store
        self.manager = manager
        self.config = config
        self.metrics = Metrics()
        #: The tokens whose signature was checked (hub/auth.py), shared by every connection.
        self.tokens = None if config.auth_secret is None else VerifiedTokens(config.auth_secret)
        #: Connections served against ``max_connections`` (hub/server/admission.py).
        self.admission = Admission(config.max_connections)
        self.metrics.watch_admission(self.admission)
        self.held = Held()
        self.metrics.watch_held(self.held)
        #: What chat SSE readers have queued (hub/adapters/sse.py): apart from ``held``, as
        #: their queues share one text per chunk, and outbox_bytes_total evicts WebSockets.
        self.sse_held = Held()
        self.metrics.watch_sse(self.sse_held)
        self.tails = Tails(store, config.tail_events, config.tail_bytes, config.tail_bytes_total, self.held)
        self.tails.on_delivered = self.metrics.delivered.inc
        self.tails.on_dropped = self.metrics.tail_evictions.inc
        self.connections: set[Connection] = set()
        #: Who is on each session.
        self.presence = Presence(self)
        self.streams = Streams(self, max_bytes=config.max_stream_bytes)
        #: Chat turns and the responders that answer them.
        self.turns = Turns(self, config.turn_timeout)
        #: With a cross-node bus: stream frames, turns and presence to and from the other nodes.
        self.relay: Relay | None = None
        if isinstance(store.bus, RemoteBus):
            self.relay = Relay(
                self.presence,
                self.streams,
                self.turns,
                store.bus,
                config.presence_heartbeat,
                config.presence_ttl,
            )
            self.presence.relay = self.relay
            self.relay.start()
            self.metrics.watch_bus(store.bus)
        self.closing = False
        self.retention = Retention(
            store,
            self.metrics.registry,
            older_than=None if config.retain_events is None else timedelta(seconds=config.retain_events),
            keep_per_session=config.retain_events_per_session,
            interval=config.retention_interval,
        )
        self.retention.start()
        #: Sends the clients elsewhere while the store cannot be reached.
        self.store_watch = StoreWatch(store, self.connections, config.store_outage_close)
        self.store_watch.start()
        #: The op table: every request type's handler (hub/server/ops.py).
        self.ops: dict[str, Op] = operations(self, self.turns)

    def check_total(self) -> None:
        """Over ``outbox_bytes_total``: evict the connections holding the most unsent bytes
        until the hub is back under it, rather than refusing frames to everyone."""
        limit = self.config.outbox_bytes_total
        # What an evicted connection still holds (a reply waiting, a batch being dropped)
        # goes as its tasks end: count it as gone now, or one overflow would evict several.
        excess = self.held.unsent - limit
        while excess > 0:
            heaviest = max(
                (c for c in self.connections if not c.closed), key=lambda c: c.unsent, default=None
            )
            if heaviest is None or heaviest.unsent == 0:
                return
            excess -= heaviest.unsent
            heaviest.evict(
                f"slow consumer: the hub holds over {limit} unsent bytes, this connection the most; "
                "resume from your last seq"
            )

    async def session(self, session_id: str) -> Session:
        if await self.manager.get(session_id) is None:
            raise SessionNotFound(session_id)
        return self.manager.get_session(session_id)

    async def drain(self) -> None:
        """Stop taking requests, let running ones finish (up to the grace period), then
        close every socket with 1001 so clients resume elsewhere."""
        if self.closing:
            return
        self.closing = True
        running = [t for c in self.connections for t in c.requests]
        if running:
            await asyncio.wait(running, timeout=self.config.shutdown_grace)
        for connection in list(self.connections):
            connection.end_output()  # queued replies go out before the close frame
        await asyncio.sleep(0)
        for connection in list(self.connections):
            await connection.close(CLOSE_GOING_AWAY, "server shutting down; resume elsewhere")
        await self.retention.close()
        await self.store_watch.close()
        await self.turns.close()
        await self.tails.close()
        if self.relay is not None:
            await self.relay.close()

    async def serve(self, websocket: WebSocket) -> None:
        """Serve one socket: read its frames and hand each to the op table, until the peer
        goes or the connection closes. The loop is here, not in the connection's shell, so
        that an idle connection is one suspended coroutine, not two (~0.5 KiB each)."""
        token, subprotocol = token_of(websocket)
        await websocket.accept(subprotocol=subprotocol)
        release_handshake(websocket.scope)
        connection = Connection(self, websocket)
        connection.open(token)
        self.connections.add(connection)
        self.metrics.connections.inc()
        protocol = connection.protocol
        try:
            while not connection.closed:
                if not protocol.reading:
                    # Backpressure: leave the next frames in the socket (uvicorn pauses
                    # reading until we receive) until replies have gone out.
                    await connection.wait_for_room()
                    continue
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                if text is None:
                    await connection.close(
                        CLOSE_UNSUPPORTED, "binary frames are not supported; send JSON text"
                    )
                    break
                receive(self.ops, connection, text)
        except WebSocketDisconnect:
            pass
        except RuntimeError:  # the socket went away while we were receiving
            pass
        finally:
            await connection.finish()
            self.connections.discard(connection)
            if self.worker_summarizer is not None:
                self.worker_summarizer.connection_lost(connection)
            self.turns.connection_lost(connection)
            await self.streams.owner_lost(connection)
            for sid in self.presence.present_on(connection):
                self.presence.leave(connection, sid)
            self.presence.unwatch(connection)
            self.metrics.connections.dec()
