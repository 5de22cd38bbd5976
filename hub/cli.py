"""The ``sessionhub`` command: ``serve`` the hub; ``tail`` and ``sessions`` for operators.

Every operator mistake is one line on stderr and an exit code (:data:`EXIT_CODES`), never
a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import math
import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from clients.operator import add_url_option

from . import cli_compaction

__all__ = ["EXIT_CODES", "main"]

#: The exit codes of every subcommand (also in ``sessionhub --help`` and the README).
EXIT_CODES = """\
exit codes:
  0    done
  1    the hub answered with an error not listed below
  2    bad arguments or configuration (one line says which); serve: store or bus unusable
       import: a bad line in the dump (its number and field; nothing is written)
  3    the hub cannot be reached (sessions, tail); serve: startup failed (e.g. port taken)
  4    the hub refused the request: no token, or one it does not accept (--token)
  5    the session does not exist (tail, export)
  6    the log no longer holds --after SEQ (pruned, or another epoch): pick another --after
  7    import: a session in the dump is already stored (pass --replace to overwrite it)
  130  interrupted (Ctrl-C)
  141  stdout was closed (e.g. `| head`): stops quietly, as other Unix tools do"""

#: HS256 keys shorter than the hash are guessable offline from one token (RFC 7518 3.2).
MIN_SECRET_BYTES = 32


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (``usage:`` goes to ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _version() -> str:
    import hub

    return f"sessionhub {hub.__version__}"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sessionhub",
        description="A real-time session hub for AI agents.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    serve = command("serve", "run the hub")
    serve.add_argument(
        "--db",
        default=os.environ.get("SESSIONHUB_DB") or "sessionhub.db",
        help="SQLite file (a path or sqlite:///PATH) or postgresql:// DSN "
        "(default: $SESSIONHUB_DB or %(default)s)",
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
    ):
        serve.add_argument(flag, type=_size, default=_size(default), help=f"{what} (default: {default})")
    serve.add_argument(
        "--max-in-flight",
        type=_positive,
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
        type=_age,
        default=None,
        help="prune log events older than this: 90s, 15m, 12h, 30d, 2w (default: keep all)",
    )
    serve.add_argument(
        "--retain-events-per-session",
        type=_positive,
        default=None,
        help="prune all but the newest N events of each log (default: keep all)",
    )

    cli_compaction.add_options(serve, _positive)

    db_help = (
        "SQLite file (a path or sqlite:///PATH) or postgresql:// DSN (default: $SESSIONHUB_DB or %(default)s)"
    )
    db_default = os.environ.get("SESSIONHUB_DB") or "sessionhub.db"
    prune = command("prune", "delete old events from the logs (messages, overlays, context stay)")
    prune.add_argument("--db", default=db_default, help=db_help)
    prune.add_argument("--older-than", type=_age, default=None, help="events older than this: 12h, 30d, 2w")
    prune.add_argument(
        "--keep-per-session", type=_whole, default=None, help="all but the newest N events of each log"
    )
    prune.add_argument("--batch", type=_positive, default=1000, help="events per transaction (default: 1000)")

    export = command("export", "write sessions as JSON lines to stdout (docs/operations.md)")
    export.add_argument(
        "session_ids", nargs="*", metavar="SESSION_ID", help="sessions to export (default: all)"
    )
    export.add_argument("--db", default=db_default, help=db_help)

    import_ = command("import", "read sessions from a dump (or another format) into the store")
    import_.add_argument(
        "file", metavar="FILE", help="the dump (JSON lines; - reads stdin), or --from's file"
    )
    import_.add_argument("--db", default=db_default, help=db_help)
    import_.add_argument("--replace", action="store_true", help="overwrite sessions already stored")
    import_.add_argument(
        "--from",
        dest="source",
        choices=["dump", "openai-agents", "ui-messages"],
        default="dump",
        help="FILE's format: a sessionhub dump (default), an OpenAI Agents SQLiteSession "
        "database, or a JSON array of AI SDK UIMessages (needs --session)",
    )
    import_.add_argument(
        "--session", default=None, help="--from ui-messages: the id of the session to create"
    )
    import_.add_argument("--name", default=None, help="--from ui-messages: its name (default: the id)")

    token = command("token", "print an access token")
    token.add_argument(
        "--secret",
        default=os.environ.get("SESSIONHUB_AUTH_SECRET") or None,
        help="the hub's --auth-secret (default: $SESSIONHUB_AUTH_SECRET)",
    )
    token.add_argument(
        "--session", action="append", required=True, help="session id, or '*' for all (repeatable)"
    )
    token.add_argument(
        "--scope", required=True, choices=["read", "write", "admin"], help="what the token allows"
    )
    token.add_argument("--ttl", default="1h", help="lifetime: 90s, 15m, 1h, 7d (default: %(default)s)")
    token.add_argument("--sub", default="sessionhub", help="the token's subject (default: %(default)s)")

    tail = command("tail", "print a session's events live (resumes across restarts)")
    tail.add_argument("session_id", help="the session to follow; 'registry' follows session changes")
    add_url_option(tail)
    tail.add_argument("--after", type=int, default=0, help="start after this seq (default: 0, everything)")
    tail.add_argument("--json", action="store_true", help="print raw event frames as JSON lines")
    tail.add_argument("--token", default=_TOKEN, help="access token (default: $SESSIONHUB_TOKEN)")

    sessions = command("sessions", "list sessions, most recently updated first")
    add_url_option(sessions)
    sessions.add_argument("--json", action="store_true", help="print JSON lines")
    sessions.add_argument("--token", default=_TOKEN, help="access token (default: $SESSIONHUB_TOKEN)")
    respond = command("respond", "answer chat turns with an OpenAI-compatible model (a responder worker)")
    add_url_option(respond)
    respond.add_argument(
        "--base-url", required=True, help="the model server's API root, e.g. http://127.0.0.1:8080/v1"
    )
    respond.add_argument("--model", required=True, help="the model name to ask for")
    respond.add_argument(
        "--token",
        default=_TOKEN,
        help="access token, write on the sessions to answer (default: $SESSIONHUB_TOKEN)",
    )
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


_TOKEN = os.environ.get("SESSIONHUB_TOKEN") or None

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


def _secret_problem(secret: str | None, where: str) -> str | None:
    if secret is not None and len(secret.encode()) < MIN_SECRET_BYTES:
        return (
            f"{where} is {len(secret.encode())} bytes; HS256 needs at least {MIN_SECRET_BYTES} "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return None


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


def _serve_problem(args: argparse.Namespace) -> str | None:
    """The first thing wrong with serve's options, as one line; None when they are usable.
    Checked before anything starts, so a typo is not a traceback from uvicorn or a driver."""
    from protocol.errors import InvalidInput

    from .backends import make_bus, resolve_db
    from .extras import MissingExtra

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
    source = "--auth-secret" if "--auth-secret" in args.typed else "--auth-secret ($SESSIONHUB_AUTH_SECRET)"
    problem = _secret_problem(args.auth_secret, source) or cli_compaction.compaction_problem(args)
    if problem:
        return problem
    try:
        make_bus(resolve_db(args.db), args.bus)  # names only: nothing connects yet
    except (InvalidInput, MissingExtra) as exc:
        return str(exc)
    return None


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    """A byte count: 1048576, 512K, 16M, 1G (also KiB, MiB, GiB)."""
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1:] if value[-1:] in ("K", "M", "G") else ""
    try:
        number = int(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (say 65536, 512K, 16M or 1G)") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"a size must be at least 1 byte, not {text!r}")
    return number * _UNITS[unit]


def _age(text: str) -> float:
    """An age in seconds: 90s, 15m, 12h, 30d, 2w."""
    from protocol.errors import InvalidInput

    from .retention import parse_age

    try:
        return parse_age(text).total_seconds()
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _whole(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, not {number}")
    return number


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from protocol.errors import InvalidInput

    from .extras import MissingExtra
    from .server import HubConfig, create_app
    from .server.logfilter import install_log_filters

    problem = _serve_problem(args)
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
            max_in_flight=args.max_in_flight,
            send_timeout=args.send_timeout,
            turn_timeout=args.turn_timeout,
            store_outage_close=args.store_outage_close or None,
            subscription_retry=args.subscription_retry,
            retain_events=args.retain_events,
            retain_events_per_session=args.retain_events_per_session,
        )
    except ValueError as exc:  # HubConfig checks its limits: one line, exit 2
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    from .backends import BackendUnavailable, probe

    try:
        # Reach the store and the bus once before uvicorn starts: a wrong --db or --bus is
        # one line and exit code 2, not a traceback from the app's startup.
        asyncio.run(probe(args.db, args.bus, bus_override=args.bus_override))
    except (InvalidInput, MissingExtra, BackendUnavailable) as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    compaction = cli_compaction.serve_compaction(args)
    app = create_app(
        db=args.db,
        bus=args.bus,
        config=config_,
        worker_summarizer=None if compaction is None else compaction.workers,
        configure_manager=None if compaction is None else compaction.configure,
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

    if args.secret is None:
        print(
            "sessionhub: token needs --secret or $SESSIONHUB_AUTH_SECRET (the hub's secret)", file=sys.stderr
        )
        return 2
    problem = _secret_problem(
        args.secret, "--secret" if "--secret" in args.typed else "$SESSIONHUB_AUTH_SECRET"
    )
    if problem:
        print(f"sessionhub: {problem}", file=sys.stderr)
        return 2
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
    # What was typed, to say whether a bad secret came from a flag or the environment.
    args.typed = list(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "respond":
        return _respond(args)
    if args.command == "token":
        return _token(args)
    if args.command in ("prune", "export", "import"):
        return _data(args)
    return _operate(args)


def _data(args: argparse.Namespace) -> int:
    """``prune``, ``export`` and ``import``, on the store itself (no hub needed)."""
    from protocol.errors import Conflict, InvalidInput, SessionHubError, SessionNotFound

    from .extras import MissingExtra

    if args.command == "prune" and args.older_than is None and args.keep_per_session is None:
        print("sessionhub: prune needs --older-than AGE or --keep-per-session N (or both)", file=sys.stderr)
        return 2
    if args.command == "import" and args.source == "ui-messages" and not args.session:
        print(
            "sessionhub: import --from ui-messages needs --session ID (the session to create)",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(_run_data(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Conflict as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 7
    except SessionNotFound as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 5
    except (InvalidInput, MissingExtra, OSError) as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    except SessionHubError as exc:  # the store cannot be opened or used
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2


async def _run_data(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from . import dump

    async with dump.open_store(args.db) as store:
        if args.command == "prune":
            cutoff = (
                None if args.older_than is None else datetime.now(UTC) - timedelta(seconds=args.older_than)
            )
            result = await store.prune_events(
                older_than=cutoff, keep_per_session=args.keep_per_session, batch=args.batch
            )
            print(f"pruned {result.events} events from {result.streams} logs")
            return 0
        if args.command == "export":
            out = sys.stdout
            async for line in dump.export_lines(store, args.session_ids):
                out.write(line + "\n")
            out.flush()
            return 0
        if args.source == "openai-agents":
            from .importers import from_openai_agents

            dumps = await from_openai_agents(args.file)
        elif args.source == "ui-messages":
            dumps = [dump.from_ui_messages(_read_input(args.file), args.session, args.name)]
        else:
            if args.file == "-":
                dumps = dump.parse_dump(sys.stdin.buffer)
            else:
                dumps = dump.parse_dump(_read_input(args.file).splitlines())
        done = await dump.import_dumps(store, dumps, replace=args.replace)
        print(f"imported {len(done.sessions)} sessions, {done.messages} messages")
        return 0


def _read_input(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    with open(name, "rb") as file:
        return file.read()


def _operate(args: argparse.Namespace) -> int:
    """``tail`` and ``sessions``: what went wrong is one line and an exit code."""
    from clients.operator import failure, run_sessions, run_tail

    if args.command == "tail" and args.after < 0:
        print(f"sessionhub: --after {args.after} must be at least 0", file=sys.stderr)
        return 2
    key = None if args.command != "tail" or args.session_id == "registry" else args.session_id
    try:
        if args.command == "tail":
            return asyncio.run(run_tail(args.url, key, after=args.after, raw=args.json, token=args.token))
        return asyncio.run(run_sessions(args.url, raw=args.json, token=args.token))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): nothing to say, and nobody to say it to. Point
        # stdout at /dev/null so that the interpreter's final flush does not complain.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:
        after = getattr(args, "after", 0)
        code, line = failure(exc, url=args.url, token=args.token, session_id=key, after=after)
        if line is None:
            raise  # not an operator's mistake: a bug, whose traceback is wanted
        print(f"sessionhub: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
