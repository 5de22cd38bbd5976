"""The ``sessionhub`` command: ``serve`` the hub; ``tail`` and ``sessions`` for operators."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionhub", description="A real-time session hub for AI agents.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the hub")
    serve.add_argument(
        "--db",
        default=os.environ.get("SESSIONHUB_DB") or "sessionhub.db",
        help="SQLite file or postgresql:// DSN (default: $SESSIONHUB_DB or %(default)s)",
    )
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
        "--ping-interval", type=float, default=20.0, help="keepalive ping every N s (default: 20)"
    )
    serve.add_argument(
        "--ping-timeout", type=float, default=20.0, help="drop a peer silent this long (default: 20)"
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
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
        help="a browser origin allowed to connect (repeatable; default: the hub's own origin)",
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
        "--turn-timeout",
        type=float,
        default=30.0,
        help="how long a chat turn waits for a responder to start answering (default: %(default)s s)",
    )

    token = commands.add_parser("token", help="print an access token")
    token.add_argument("--secret", required=True, help="the hub's --auth-secret")
    token.add_argument(
        "--session", action="append", required=True, help="session id, or '*' for all (repeatable)"
    )
    token.add_argument(
        "--scope", required=True, choices=["read", "write", "admin"], help="what the token allows"
    )
    token.add_argument("--ttl", default="1h", help="lifetime: 90s, 15m, 1h, 7d (default: %(default)s)")
    token.add_argument("--sub", default="sessionhub", help="the token's subject (default: %(default)s)")

    tail = commands.add_parser("tail", help="print a session's events live (resumes across restarts)")
    tail.add_argument("session_id", help="the session to follow; 'registry' follows session changes")
    tail.add_argument(
        "--url", default="ws://127.0.0.1:8000/ws", help="hub WebSocket URL (default: %(default)s)"
    )
    tail.add_argument("--after", type=int, default=0, help="start after this seq (default: 0, everything)")
    tail.add_argument("--json", action="store_true", help="print raw event frames as JSON lines")
    tail.add_argument("--token", default=None, help="access token")

    sessions = commands.add_parser("sessions", help="list sessions, most recently updated first")
    sessions.add_argument(
        "--url", default="ws://127.0.0.1:8000/ws", help="hub WebSocket URL (default: %(default)s)"
    )
    sessions.add_argument("--json", action="store_true", help="print JSON lines")
    sessions.add_argument("--token", default=None, help="access token")
    respond = commands.add_parser(
        "respond", help="answer chat turns with an OpenAI-compatible model (a responder worker)"
    )
    respond.add_argument(
        "--url", default="ws://127.0.0.1:8000/ws", help="hub WebSocket URL (default: %(default)s)"
    )
    respond.add_argument(
        "--base-url", required=True, help="the model server's API root, e.g. http://127.0.0.1:8080/v1"
    )
    respond.add_argument("--model", required=True, help="the model name to ask for")
    respond.add_argument("--token", default=None, help="access token (write on the sessions to answer)")
    respond.add_argument(
        "--api-key",
        default=os.environ.get("OPENAI_API_KEY") or None,
        help="the model server's API key (default: $OPENAI_API_KEY)",
    )
    respond.add_argument("--name", default="responder", help="name shown in presence (default: %(default)s)")
    respond.add_argument("--timeout", type=float, default=60.0, help="model request timeout, s (default: 60)")
    respond.add_argument(
        "--max-retries", type=int, default=3, help="retries of a failed request (default: 3)"
    )
    respond.add_argument("--concurrency", type=int, default=64, help="turns answered at once (default: 64)")
    return parser


_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from protocol.errors import InvalidInput

    from .server import HubConfig, create_app

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
    config_ = HubConfig(
        max_frame_bytes=args.max_frame_bytes,
        auth_secret=args.auth_secret,
        allowed_origins=tuple(args.allowed_origin),
        presence_ttl=args.presence_ttl,
        presence_heartbeat=min(10.0, args.presence_ttl / 3),
        turn_timeout=args.turn_timeout,
    )
    from .backends import BackendUnavailable, probe

    try:
        # Reach the store and the bus once before uvicorn starts: a wrong --db or --bus is
        # one line and exit code 2, not a traceback from the app's startup.
        asyncio.run(probe(args.db, args.bus))
    except (InvalidInput, BackendUnavailable) as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    app = create_app(db=args.db, bus=args.bus, config=config_)

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
        ws="websockets-sansio",
        ws_max_size=max(args.max_frame_bytes * 4, 16 << 20),
        ws_ping_interval=args.ping_interval,
        ws_ping_timeout=args.ping_timeout,
        lifespan="on",
    )
    server = HubServer(config)
    # uvicorn re-raises the signal it handled once it has stopped: we are done then.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    # A startup that failed anyway (the port taken, the database gone since the probe).
    return 0 if server.started else 3


def _token(args: argparse.Namespace) -> int:
    from protocol.errors import InvalidInput

    from .auth import issue_token, parse_ttl

    try:
        ttl = parse_ttl(args.ttl)
        print(issue_token(args.secret, dict.fromkeys(args.session, args.scope), subject=args.sub, ttl=ttl))
    except InvalidInput as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    return 0


def _respond(args: argparse.Namespace) -> int:
    from clients import ConnectionLost, HubError

    from .responder import ChatCompletionsResponder, run_responder

    if not args.base_url.startswith(("http://", "https://")):
        print(f"sessionhub: --base-url must be an http(s) URL; got {args.base_url!r}", file=sys.stderr)
        return 2
    responder = ChatCompletionsResponder(
        args.base_url, args.model, args.api_key, timeout=args.timeout, max_retries=args.max_retries
    )
    try:
        asyncio.run(
            run_responder(args.url, responder, token=args.token, name=args.name, concurrency=args.concurrency)
        )
    except (ConnectionLost, HubError) as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "respond":
        return _respond(args)
    if args.command == "token":
        return _token(args)
    from .operator import run_sessions, run_tail

    try:
        if args.command == "tail":
            key = None if args.session_id == "registry" else args.session_id
            return asyncio.run(run_tail(args.url, key, after=args.after, raw=args.json, token=args.token))
        return asyncio.run(run_sessions(args.url, raw=args.json, token=args.token))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
