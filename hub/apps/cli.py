"""The ``sessionhub`` command: ``serve`` the hub (:mod:`hub.apps.serve`); ``respond`` with
a model; ``token``; ``prune``, ``gc``, ``export`` and ``import`` on the store; ``tail`` and
``sessions`` for operators. ``python -m hub.apps.cli`` runs it from a checkout.

Every operator mistake is one line on stderr and an exit code (:data:`EXIT_CODES`), never
a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from clients.operator import add_url_option, parse_urls

from . import configcli, serve
from .options import TOKEN, add_db_option, age, age_or_zero, positive, secret_problem, whole

__all__ = ["EXIT_CODES", "main"]

#: The exit codes of every subcommand (also in ``sessionhub --help`` and the README).
EXIT_CODES = """\
exit codes:
  0    done
  1    the hub answered with an error not listed below
  2    bad arguments or configuration (one line says which; config check: one per mistake);
       serve: store or bus unusable; export, prune: no database at --db
       import: a bad line in the dump (its number and field; nothing is written)
  3    the hub cannot be reached, or is not at that path (sessions, tail); serve: startup
       failed (e.g. port taken)
  4    the hub refused the request: no token, or one it does not accept (--token)
  5    the session does not exist (tail, export)
  6    the log no longer holds --after SEQ (pruned, or another epoch): pick another --after
  7    import: a session in the dump is already stored (pass --replace to overwrite it)
  130  interrupted (Ctrl-C)
  141  stdout was closed (e.g. `| head`): stops quietly, as other Unix tools do"""


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

    serve_parser = command("serve", "run the hub")
    serve.add_options(serve_parser)
    configcli.add_serve_option(serve_parser)
    configcli.add_commands(command)

    prune = command("prune", "delete old events from the logs (messages, overlays, context stay)")
    add_db_option(prune)
    prune.add_argument("--older-than", type=age, default=None, help="events older than this: 12h, 30d, 2w")
    prune.add_argument(
        "--keep-per-session", type=whole, default=None, help="all but the newest N events of each log"
    )
    prune.add_argument("--batch", type=positive, default=1000, help="events per transaction (default: 1000)")

    gc = command("gc", "delete the stored files no message or event references (docs/files.md)")
    add_db_option(gc)
    gc.add_argument(
        "--grace",
        type=age_or_zero,
        default=3600,
        help="keep a file stored or sent this recently, referenced or not: an upload waits "
        "for its message (default: 1h)",
    )

    export = command("export", "write sessions as JSON lines to stdout (docs/operations.md)")
    export.add_argument(
        "session_ids", nargs="*", metavar="SESSION_ID", help="sessions to export (default: all)"
    )
    add_db_option(export)

    import_ = command("import", "read sessions from a dump (or another format) into the store")
    import_.add_argument(
        "file", metavar="FILE", help="the dump (JSON lines; - reads stdin), or --from's file"
    )
    add_db_option(import_)
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
    tail.add_argument("--token", default=TOKEN, help="access token (default: $SESSIONHUB_TOKEN)")

    sessions = command("sessions", "list sessions, most recently updated first")
    add_url_option(sessions)
    sessions.add_argument("--json", action="store_true", help="print JSON lines")
    sessions.add_argument("--token", default=TOKEN, help="access token (default: $SESSIONHUB_TOKEN)")
    _session_actions(sessions)
    respond = command("respond", "answer chat turns with an OpenAI-compatible model (a responder worker)")
    add_url_option(respond)
    respond.add_argument(
        "--base-url", required=True, help="the model server's API root, e.g. http://127.0.0.1:8080/v1"
    )
    respond.add_argument("--model", required=True, help="the model name to ask for")
    respond.add_argument(
        "--token",
        default=TOKEN,
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
    respond.add_argument(
        "--concurrency", type=positive, default=64, help="turns answered at once (default: 64)"
    )
    return parser


def _session_actions(sessions: argparse.ArgumentParser) -> None:
    """``sessions create|rename|end|delete`` (without one, ``sessions`` lists)."""
    actions = sessions.add_subparsers(dest="action", metavar="{create,rename,end,delete}")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help)
        # SUPPRESS: typed before the action or after it, --url and --token mean the same.
        sub.add_argument("--url", type=parse_urls, default=argparse.SUPPRESS, help="as for sessions")
        sub.add_argument("--token", default=argparse.SUPPRESS, help="as for sessions (admin)")
        return sub

    create = action("create", "create a session and print its id")
    create.add_argument("name")
    create.add_argument("--template", default=None, help="one of the hub's templates (default: its default)")
    create.add_argument("--model", default=None, help="the session's model field")
    rename = action("rename", "rename a session")
    rename.add_argument("session_id", metavar="SESSION_ID")
    rename.add_argument("name")
    end = action("end", "mark a session ended (its messages stay)")
    end.add_argument("session_id", metavar="SESSION_ID")
    end.add_argument("--reason", default="ended", help="the end reason (default: %(default)s)")
    delete = action("delete", "delete a session with its messages and log")
    delete.add_argument("session_id", metavar="SESSION_ID")


def _token(args: argparse.Namespace) -> int:
    from protocol.errors import InvalidInput

    from ..auth import issue_token, parse_ttl

    if args.secret is None:
        print(
            "sessionhub: token needs --secret or $SESSIONHUB_AUTH_SECRET (the hub's secret)", file=sys.stderr
        )
        return 2
    problem = secret_problem(
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
    from clients.operator import failure, note_ignored_token

    from .respond_checks import model_server_problem, token_problem
    from .responder import ChatCompletionsResponder, run_responder

    if not args.base_url.startswith(("http://", "https://")):
        print(f"sessionhub: --base-url must be an http(s) URL; got {args.base_url!r}", file=sys.stderr)
        return 2
    problem = token_problem(args.token) or asyncio.run(model_server_problem(args.base_url, args.api_key))
    if problem:
        print(f"sessionhub: {problem}", file=sys.stderr)
        return 2
    responder = ChatCompletionsResponder(
        args.base_url, args.model, args.api_key, timeout=args.timeout, max_retries=args.max_retries
    )
    url = args.url if isinstance(args.url, str) else ", ".join(args.url)

    async def serve() -> None:
        import logging

        # A refused hello is said below, in one line with what to do; not also as a log record.
        logging.getLogger("sessionhub.client").setLevel(logging.ERROR)
        from clients import HubClient

        async with HubClient(args.url, token=args.token, name=args.name, role="worker") as hub:
            # The hub takes this token for turns before we say we serve (a turn offered to
            # this short-lived connection goes to another responder when it closes).
            await hub.request("take_turns")
            await note_ignored_token(hub, args.token, args.url)
        ready = asyncio.Event()
        task = asyncio.create_task(
            run_responder(
                args.url,
                responder,
                token=args.token,
                name=args.name,
                concurrency=args.concurrency,
                ready=ready,
            )
        )
        started = asyncio.create_task(ready.wait())
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            print(
                f"sessionhub: answering turns on {url} as {args.name!r} with {args.model!r} at "
                f"{args.base_url} (up to {args.concurrency} at once)",
                file=sys.stderr,
                flush=True,
            )
        started.cancel()
        await task

    try:
        asyncio.run(serve())
    except ConnectionLost as exc:
        print(f"sessionhub: {exc}", file=sys.stderr)
        return 2
    except HubError as exc:
        code, line = failure(exc, url=args.url, token=args.token, session_id=None)
        if code == 4 and args.token is None:
            line = (
                f"the hub at {url} needs a token: pass --token TOKEN or set $SESSIONHUB_TOKEN "
                "(`sessionhub token --scope write --session '*'` prints one)"
            )
        print(f"sessionhub: {line or exc}", file=sys.stderr)
        return 4 if code == 4 else 2
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # What was typed, to say whether a bad secret came from a flag or the environment.
    args.typed = list(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        failed = configcli.prepare_serve(args)
        return failed if failed is not None else serve.run(args)
    if args.command in ("init", "config"):
        return configcli.run(args)
    if args.command == "respond":
        return _respond(args)
    if args.command == "token":
        return _token(args)
    if args.command in ("prune", "gc", "export", "import"):
        return _data(args)
    return _operate(args)


def _data(args: argparse.Namespace) -> int:
    """``prune``, ``gc``, ``export`` and ``import``, on the store itself (no hub needed)."""
    from protocol.errors import Conflict, InvalidInput, SessionHubError, SessionNotFound

    from ..extras import MissingExtra

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

    from .. import dump
    from .backends import open_store

    # export and prune read what is there: a --db typo must not create an empty database.
    async with open_store(args.db, must_exist=args.command in ("export", "prune")) as store:
        if args.command == "prune":
            cutoff = (
                None if args.older_than is None else datetime.now(UTC) - timedelta(seconds=args.older_than)
            )
            result = await store.prune_events(
                older_than=cutoff, keep_per_session=args.keep_per_session, batch=args.batch
            )
            print(f"pruned {result.events} events from {result.streams} logs")
            return 0
        if args.command == "gc":
            gone = await store.collect_files(datetime.now(UTC) - timedelta(seconds=args.grace))
            print(f"collected {len(gone)} unreferenced files")
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
    from clients.operator import failure, run_session_action, run_sessions, run_tail

    if args.command == "tail" and args.after < 0:
        print(f"sessionhub: --after {args.after} must be at least 0", file=sys.stderr)
        return 2
    key = None if args.command != "tail" or args.session_id == "registry" else args.session_id
    action = getattr(args, "action", None)
    if action in ("rename", "end", "delete"):
        key = args.session_id
    try:
        if args.command == "tail":
            return asyncio.run(run_tail(args.url, key, after=args.after, raw=args.json, token=args.token))
        if action is not None:
            return asyncio.run(run_session_action(args.url, args, token=args.token))
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
