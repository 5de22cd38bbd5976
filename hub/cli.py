"""The ``sessionhub`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sessionhub", description="A real-time session hub for AI agents.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the hub")
    serve.add_argument("--db", default="sessionhub.db", help="SQLite file (default: %(default)s)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0 picks one)")
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        import uvicorn

        from .server import create_app

        uvicorn.run(
            create_app(db=args.db),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            ws="websockets-sansio",
            lifespan="on",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
