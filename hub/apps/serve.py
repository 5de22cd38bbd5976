"""``sessionhub serve``: its options, their checks, and the run of the hub under uvicorn.

Every mistake in the options is one line on stderr and exit code 2, found before anything
starts (:func:`serve_problem`); the compaction options are :mod:`hub.apps.serve_compaction`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import ipaddress
import math
import os
import re
import socket
import sys
from typing import TYPE_CHECKING, Any

from . import serve_compaction, serve_limits, serve_workers
from .options import add_db_option, age, positive, secret_problem, size

if TYPE_CHECKING:
    from ..server import HubConfig

__all__ = ["add_options", "run", "run_worker", "serve_problem"]

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")

#: serve options that must be above zero (every other number must not be negative).
_POSITIVE = (
    "max_frame_bytes",
    "max_stream_bytes",
    "ping_interval",
    "ping_timeout",
    "presence_ttl",
    "summarizer_timeout",
)


def add_options(serve: argparse.ArgumentParser) -> None:
    """Every option of ``serve``."""
    add_db_option(serve)
    serve.add_argument(
        "--bus",
        default=os.environ.get("SESSIONHUB_BUS") or None,
        help="how nodes ring each other: memory, postgres (default with a Postgres --db) or redis://...",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks one)")
    serve.add_argument(
        "--max-frame-bytes", type=int, default=1 << 20, help="largest request frame (default: 1 MiB)"
    )
    serve.add_argument(
        "--max-stream-bytes",
        type=int,
        default=16 << 20,
        help="largest streamed message: past it the stream ends too_large, kept (default: 16 MiB)",
    )
    serve.add_argument(
        "--ping-interval", type=float, default=20.0, help="keepalive ping every N s (default: 20)"
    )
    serve.add_argument(
        "--ping-timeout", type=float, default=20.0, help="drop a peer silent this long (default: 20)"
    )
    serve.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="how much to log; debug also prints the configuration in effect, secrets masked",
    )
    # uvloop and httptools (the `speed` extra) are used when installed; these pick one.
    serve.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop: auto is uvloop when installed (pip install 'sessionhub[speed]'), else asyncio",
    )
    serve.add_argument(
        "--http",
        # h11 by default, not uvicorn's auto: with httptools a refused body (401/413) is still
        # read to its end before the answer goes out (tests/server/test_security.py: a
        # stranger's 128 MiB POST sent whole), which h11 stops at once.
        default="h11",
        choices=["auto", "h11", "httptools"],
        help="HTTP parser (default h11; auto: httptools if installed, which reads a refused body whole)",
    )
    serve.add_argument(
        "--ws",
        # The hub's own protocol (hub/server/wsprotocol.py): uvicorn's websockets-sansio
        # holds a queue, an event and the handshake per connection and frames every send
        # anew, 20.6 against 15.0 KiB of Python allocations per idle connection (issue 28,
        # docs/benchmarks.md). uvicorn's two stay selectable, for a server that must run
        # uvicorn's own code.
        default="hub",
        choices=["hub", "websockets-sansio", "websockets"],
        help=(
            "WebSocket protocol: hub (default: the hub's own, leaner per connection), "
            "or uvicorn's websockets-sansio or websockets"
        ),
    )
    serve.add_argument(
        "--auth-secret",
        default=os.environ.get("SESSIONHUB_AUTH_SECRET") or None,
        help="turn on tokens (HS256) signed with this secret (default: $SESSIONHUB_AUTH_SECRET)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        help="a browser origin allowed to connect, also a name of the hub (repeatable; default: loopback)",
    )
    serve.add_argument(
        "--presence-ttl",
        type=float,
        default=30.0,
        help="several nodes: drop a silent node's connections from presence after N s (default: 30)",
    )
    serve.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback address without --auth-secret"
    )
    serve.add_argument(
        "--bus-override",
        action="store_true",
        help="record this node's --bus as the database's, replacing the one recorded by "
        "earlier nodes (see docs/nodes.md)",
    )
    # Memory limits (docs/security.md, "Limits"): sizes take K, M, G suffixes (powers of 2).
    for flag, default, what in (
        ("--outbox-bytes", "16M", "unsent frames one connection may hold"),
        ("--outbox-bytes-total", "1G", "unsent bytes of all connections; past it the heaviest is evicted"),
        ("--tail-bytes", "8M", "events one stream keeps in memory for its subscribers"),
        ("--tail-bytes-total", "256M", "events all streams keep in memory"),
        ("--replay-bytes", "8M", "backlog one connection's catching-up subscriptions hold"),
        ("--max-body-bytes", "4M", "largest HTTP request body (POST /api/chat, /mcp); past it: 413"),
        ("--max-file-bytes", "25M", "largest file POST /files stores (docs/files.md); past it: 413"),
    ):
        serve.add_argument(flag, type=size, default=size(default), help=f"{what} (default: {default})")
    serve.add_argument(
        "--max-upload-bytes-per-token",
        type=size,
        default=None,
        metavar="SIZE",
        help="bytes of stored files one token's subject may have uploaded (POST /files and "
        "inline data: files; default: no bound but --max-file-bytes)",
    )
    serve.add_argument(
        "--reserved-metadata-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a message metadata key clients may not set (stripped from every door's writes; "
        "repeat for more; docs/engine.md)",
    )
    serve.add_argument(
        "--max-in-flight",
        type=positive,
        default=64,
        help="requests of one connection unanswered before its socket stops being read (default: 64)",
    )
    serve.add_argument(
        "--send-timeout",
        type=float,
        default=10.0,
        help="evict (4008) a peer whose outbox stays full this long, in s (default: 10)",
    )
    serve.add_argument(
        "--store-outage-close",
        type=float,
        default=30.0,
        help="close every WebSocket with 1013 once the store has failed this long, "
        "so clients reconnect elsewhere; 0: never (default: %(default)s s)",
    )
    serve.add_argument(
        "--turn-timeout",
        type=float,
        default=30.0,
        help="how long a chat turn waits for a responder to start answering (default: %(default)s s)",
    )
    serve.add_argument(
        "--subscription-retry",
        type=float,
        default=10.0,
        help="how long a subscription retries a failed read of the log before it ends with "
        "an unsubscribed frame, in s (default: %(default)s)",
    )

    serve.add_argument(
        "--retain-events",
        type=age,
        default=None,
        help="prune log events older than this: 90s, 15m, 12h, 30d, 2w (default: keep all)",
    )
    serve.add_argument(
        "--retain-events-per-session",
        type=positive,
        default=None,
        help="prune all but the newest N events of each log (default: keep all)",
    )

    serve_compaction.add_options(serve, positive)
    # Scale (docs/operations.md, "At the limit"; docs/nodes.md, "One machine, several processes").
    serve_limits.add_options(serve)
    serve_workers.add_options(serve)


def _host_problem(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if not _HOSTNAME.fullmatch(host):
        return f"--host {host!r} is neither an IP address nor a host name"
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError) as exc:
        return f"--host {host!r} does not resolve to an address ({exc})"
    return None


def serve_problem(args: argparse.Namespace) -> str | None:
    """The first thing wrong with serve's options, as one line; None when they are usable.
    Checked before anything starts, so a typo is not a traceback from uvicorn or a driver."""
    from protocol.errors import InvalidInput

    from ..extras import MissingExtra
    from .backends import make_bus, resolve_db

    if not 0 <= args.port <= 65535:
        return f"--port {args.port} is not a port (0-65535; 0 picks a free one)"
    problem = _host_problem(args.host)
    if problem:
        return problem
    for name, value in sorted(vars(args).items()):
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            return f"{flag} {value} is not a finite number"
        if value < 0 or (value == 0 and name in _POSITIVE):
            return f"{flag} {value} must be {'above' if name in _POSITIVE else 'at least'} 0"
    for flag, module in (("--loop", args.loop), ("--http", args.http)):
        if module not in ("auto", "asyncio", "h11") and importlib.util.find_spec(module) is None:
            return f"{flag} {module} needs {module!r}, not installed: pip install 'sessionhub[speed]'"
    source = "--auth-secret" if "--auth-secret" in args.typed else "--auth-secret ($SESSIONHUB_AUTH_SECRET)"
    problem = secret_problem(args.auth_secret, source) or serve_compaction.compaction_problem(args)
    if problem:
        return problem
    try:
        db = resolve_db(args.db)
        ring = make_bus(db, args.bus)  # names only: nothing connects yet
    except (InvalidInput, MissingExtra) as exc:
        return str(exc)
    return serve_workers.workers_problem(args, db, ring)


def run(args: argparse.Namespace) -> int:
    """``sessionhub serve``: check the options, reach the store and bus once, then run
    uvicorn until a signal drains the hub. The exit code (``EXIT_CODES`` of :mod:`hub.apps.cli`)."""
    from protocol.errors import InvalidInput

    from ..extras import MissingExtra
    from ..server.logfilter import install_log_filters

    problem = serve_problem(args)
    if problem:
        print(f"sessionhub: {problem}", file=sys.stderr)
        return 2
    install_log_filters()
    if (
        args.host not in _LOOPBACK
        and not args.host.startswith("127.")
        and not args.auth_secret
        and not args.insecure
    ):
        print(
            f"sessionhub: refusing to listen on {args.host} without --auth-secret: anyone who can reach "
            "it could read and change every session. Pass --auth-secret SECRET, or --insecure if "
            "something in front of the hub already authenticates.",
            file=sys.stderr,
        )
        return 2
    made = _hub_config(args)
    if made is None:
        return 2
    config_, limit_line = made
    from .backends import BackendUnavailable, probe
    from .listen import bind

    # Tried before the store is touched: a taken port is one line (exit 3), nothing migrated.
    # Released again for uvicorn to bind (given a socket, it would not log where it listens,
    # the line operators and the tests wait for).
    listening = bind(args.host, args.port)
    if not isinstance(listening, str):
        listening.close()
    else:
        print(f"sessionhub: {listening}", file=sys.stderr)
        return 3
    try:
        # Reach the store and the bus once before uvicorn starts: a wrong --db or --bus is
        # one line and exit code 2, not a traceback from the app's startup.
        asyncio.run(probe(args.db, args.bus, bus_override=args.bus_override))
    except (InvalidInput, MissingExtra, BackendUnavailable) as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    print(f"sessionhub: {limit_line}", file=sys.stderr)
    if args.workers > 1:
        return serve_workers.run_workers(args, run_worker)
    return _serve(args, config_)


def run_worker(args: argparse.Namespace) -> None:
    """One process of ``serve --workers N`` (:mod:`hub.apps.serve_workers`): the checks and
    the probe ran in the parent; this one binds the shared port and serves."""
    serve_workers.become_worker()
    made = _hub_config(args)
    assert made is not None  # the parent built the same one
    sock = serve_workers.reuse_port_socket(args.host, args.port)
    sys.exit(_serve(args, made[0], sock))


def _hub_config(args: argparse.Namespace) -> tuple[HubConfig, str] | None:
    """The hub's limits from the options (None, said in one line, if HubConfig refuses
    them), with ``max_connections`` from the descriptors this process may hold, and the
    line that says that limit."""
    from ..server import HubConfig

    limit, line = serve_limits.connection_limit(args.max_connections, serve_limits.raise_descriptors())
    try:
        config_ = HubConfig(
            max_frame_bytes=args.max_frame_bytes,
            max_stream_bytes=args.max_stream_bytes,
            auth_secret=args.auth_secret,
            allowed_origins=tuple(args.allowed_origin),
            bind_host=args.host,
            presence_ttl=args.presence_ttl,
            presence_heartbeat=min(10.0, args.presence_ttl / 3),
            outbox_bytes=args.outbox_bytes,
            outbox_bytes_total=args.outbox_bytes_total,
            tail_bytes=args.tail_bytes,
            tail_bytes_total=args.tail_bytes_total,
            replay_bytes=args.replay_bytes,
            max_body_bytes=args.max_body_bytes,
            max_file_bytes=args.max_file_bytes,
            reserved_metadata_keys=tuple(args.reserved_metadata_key),
            max_upload_bytes_per_token=args.max_upload_bytes_per_token,
            max_in_flight=args.max_in_flight,
            send_timeout=args.send_timeout,
            turn_timeout=args.turn_timeout,
            store_outage_close=args.store_outage_close or None,
            subscription_retry=args.subscription_retry,
            retain_events=args.retain_events,
            retain_events_per_session=args.retain_events_per_session,
            max_connections=limit,
        )
    except ValueError as exc:  # HubConfig checks its limits: one line, exit 2
        print(f"sessionhub: {exc}", file=sys.stderr)
        return None
    return config_, line


def ws_protocol(name: str) -> Any:
    """What ``uvicorn.Config(ws=...)`` takes for ``--ws NAME``: the hub's protocol class, or
    the name of one of uvicorn's."""
    if name == "hub":
        from ..server.wsprotocol import HubWebSocketProtocol

        return HubWebSocketProtocol
    return name


def _serve(args: argparse.Namespace, config_: HubConfig, sock: socket.socket | None = None) -> int:
    """Run the hub under uvicorn (on ``sock`` when given) until a signal drains it."""
    import uvicorn

    from ..server import create_app

    compaction = serve_compaction.serve_compaction(args)
    from .serve_templates import configure_manager

    app = create_app(
        db=args.db,
        bus=args.bus,
        config=config_,
        worker_summarizer=None if compaction is None else compaction.workers,
        configure_manager=configure_manager(args, compaction),
    )

    class HubServer(uvicorn.Server):
        """On SIGINT/SIGTERM: drain the hub first (finish in-flight ops, close sockets with
        1001 so clients resume elsewhere), then let uvicorn stop."""

        draining: asyncio.Task[Any] | None = None

        def handle_exit(self, sig: int, frame: Any) -> None:
            hub = getattr(app.state, "hub", None)
            if hub is None or self.draining is not None:
                super().handle_exit(sig, frame)
                return
            loop = asyncio.get_running_loop()
            self.draining = loop.create_task(hub.drain())
            self.draining.add_done_callback(lambda _t: super(HubServer, self).handle_exit(sig, frame))

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        loop=args.loop,
        http=args.http,
        ws=ws_protocol(args.ws),
        ws_max_size=max(args.max_frame_bytes * 4, 16 << 20),
        ws_ping_interval=args.ping_interval,
        ws_ping_timeout=args.ping_timeout,
        lifespan="on",
    )
    server = HubServer(config)
    # uvicorn re-raises the signal it handled once it has stopped: we are done then.
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=None if sock is None else [sock])
    # A startup that failed anyway (the port taken, the database gone since the probe).
    return 0 if server.started else 3
