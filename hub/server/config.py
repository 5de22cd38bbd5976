"""The limits of one hub."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HubConfig:
    """Limits of one hub (docs/security.md, "Limits").

    Every buffer is bounded in bytes as well as in frames: a connection's outbox
    (``outbox_bytes``), the replies waiting for room in it (``outbox_bytes`` again), the
    backlog a catching-up subscription holds (``replay_bytes``), each stream's tail cache
    (``tail_bytes``), and all of it across the hub (``outbox_bytes_total``,
    ``tail_bytes_total``). ``send_timeout`` is how long a full outbox may stay full before
    the peer is evicted (close code 4008); ``close_grace`` how long an evicted peer has to
    take the close frame before its transport is aborted. A chat SSE reader is bounded by
    the same two: ``outbox_bytes`` queued for it, or a send not taken for ``send_timeout``,
    and it is dropped (hub/adapters/sse.py)."""

    max_frame_bytes: int = 1 << 20
    #: The largest HTTP request body (``POST /api/chat`` and its sub-routes, ``/mcp``): a
    #: declared ``Content-Length`` over it is answered 413 before a byte is read, a
    #: chunked body is cut at it. The MCP SDK's own default, so ``/mcp`` keeps its bound.
    max_body_bytes: int = 4 << 20
    #: The largest file ``POST /files`` stores (docs/files.md): a declared length over it
    #: is answered 413 unread, a body is cut at it as it streams in, and nothing is stored.
    max_file_bytes: int = 25 << 20
    #: Metadata keys a client's write may not set (docs/engine.md, "Client writes"): every
    #: door strips them from the messages it writes, as agents 0.32 strips its
    #: ``reservedMetadataKeys`` from client writes. The engine's own writes keep them.
    reserved_metadata_keys: tuple[str, ...] = ()
    #: The bytes of stored files one token's subject may have uploaded (docs/files.md):
    #: an upload past it (POST /files, or an inline ``data:`` file) is ``too_large``, nothing
    #: stored. None: no bound but the file's.
    max_upload_bytes_per_token: int | None = None
    #: The largest message one stream may grow to (its text, UTF-8, and its tool parts,
    #: encoded): past it the stream ends ``too_large``, keeping what it had.
    max_stream_bytes: int = 16 << 20
    #: HS256 secret: when set, every WebSocket request needs a token granting it.
    auth_secret: str | None = None
    #: Origins a browser may connect from, besides loopback ones and the bind host's
    #: (docs/security.md); their hosts are names of the hub too. ``*``: any.
    allowed_origins: tuple[str, ...] = ()
    #: The address the hub listens on (``--host``): without a secret, a Host header must
    #: name it, a loopback name, or an allowed origin's host.
    bind_host: str | None = None
    #: Connections served at once (WebSockets on every route and HTTP requests being
    #: answered; the probes not counted): past it a WebSocket is closed with 1013 and a
    #: request answered 503 (hub/server/admission.py). None: no limit (``sessionhub serve``
    #: derives one from the file-descriptor limit).
    max_connections: int | None = None
    max_subscriptions: int = 64
    queue_frames: int = 1024
    send_timeout: float = 10.0
    tail_events: int = 1024
    backlog_batch: int = 500
    shutdown_grace: float = 10.0
    #: With several nodes: how often each relays its presence table, and how long a silent
    #: node's connections stay listed.
    presence_heartbeat: float = 10.0
    presence_ttl: float = 30.0
    #: Unsent frames one connection may hold (its outbox).
    outbox_bytes: int = 16 << 20
    #: Unsent bytes of all connections together (outboxes, waiting replies, replay
    #: batches); past it the connection holding the most is evicted.
    outbox_bytes_total: int = 1 << 30
    #: Encoded event frames one stream's tail keeps in memory.
    tail_bytes: int = 8 << 20
    #: Tail caches of all streams together; past it the largest caches shrink.
    tail_bytes_total: int = 256 << 20
    #: Backlog one connection's catching-up subscriptions hold, read from the log.
    replay_bytes: int = 8 << 20
    #: Requests of one connection running or waiting to be answered; at the bound the
    #: hub stops reading that socket until replies go out.
    max_in_flight: int = 64
    #: How long an evicted peer has to take its close frame before the TCP connection is cut.
    close_grace: float = 5.0
    #: How long a turn waits for a responder to start answering it (hub/server/turndispatch.py).
    turn_timeout: float = 30.0
    #: A chat reply's SSE stream (``POST /api/chat``) sends a comment line after this many
    #: seconds without a chunk, so that proxies that cut idle connections (often at 30-60 s)
    #: keep it while the turn waits for a responder or a slow model.
    chat_keepalive: float = 15.0
    #: Event retention (hub/server/pruner.py): prune events older than this many
    #: seconds, and beyond the newest N of each log, every ``retention_interval`` s. None: keep.
    retain_events: float | None = None
    retain_events_per_session: int | None = None
    retention_interval: float = 60.0
    #: After this many seconds of a store that fails every read (a node cut off from its
    #: database), close every WebSocket with 1013 so clients reconnect to another node
    #: (hub/server/outage.py). None: never.
    store_outage_close: float | None = 30.0
    #: How long a subscription retries a failed read of the log (the database restarting)
    #: before it ends with an ``unsubscribed`` frame (hub/server/subscriptions.py).
    subscription_retry: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_frame_bytes",
            "max_body_bytes",
            "max_file_bytes",
            "max_stream_bytes",
            "max_subscriptions",
            "queue_frames",
            "tail_events",
            "backlog_batch",
            "outbox_bytes",
            "outbox_bytes_total",
            "tail_bytes",
            "tail_bytes_total",
            "replay_bytes",
            "max_in_flight",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"HubConfig.{name} must be at least 1, not {getattr(self, name)}")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(
                f"HubConfig.max_connections must be at least 1 or None, not {self.max_connections}"
            )
        if self.store_outage_close is not None and not self.store_outage_close > 0:
            raise ValueError(
                f"HubConfig.store_outage_close must be more than 0 or None, not {self.store_outage_close}"
            )
        for name in (
            "send_timeout",
            "close_grace",
            "shutdown_grace",
            "turn_timeout",
            "chat_keepalive",
            "subscription_retry",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"HubConfig.{name} must be more than 0, not {getattr(self, name)}")
