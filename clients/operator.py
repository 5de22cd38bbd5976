"""Terminal tools for operators, built on the client: ``sessionhub tail`` and ``sessions``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import msgspec

from protocol import Event, NotFound, PositionLost, SessionHubError, SessionInfo

from .errors import ConnectionLost

__all__ = ["describe", "failure", "run_sessions", "run_tail"]


def _clip(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _message_line(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    texts = [
        p.get("text", "") for p in message.get("parts", []) if isinstance(p, dict) and p.get("type") == "text"
    ]
    kinds = sorted({str(p.get("type")) for p in message.get("parts", []) if isinstance(p, dict)} - {"text"})
    extra = f" +{','.join(kinds)}" if kinds else ""
    return f'{message.get("id")} ({message.get("role")}): "{_clip(" ".join(texts))}"{extra}'


def describe(event: Event) -> str:
    """One readable line for an event."""
    d = event.data
    head = f"#{event.seq} {event.created_at:%H:%M:%S} {event.type}"
    kind = event.type
    if kind == "message.appended":
        parent = d.get("parent_id")
        return f"{head} {_message_line(d.get('message'))}" + (f" ← {parent}" if parent else " (root)")
    if kind == "message.updated":
        return f"{head} {_message_line(d.get('message'))}"
    if kind == "message.deleted":
        return f"{head} {', '.join(map(str, d.get('ids', [])))}"
    if kind == "compaction.added":
        c = d.get("compaction", {})
        span = f"{c.get('from_message_id')}..{c.get('to_message_id')}"
        return f'{head} {span}: "{_clip(str(c.get("summary", "")))}"'
    if kind.startswith("session."):
        s = d.get("session", {})
        line = f'{head} {s.get("id")} "{s.get("name")}"'
        if kind == "session.usage":
            line += f" in={s.get('input_tokens')} out={s.get('output_tokens')} cost={s.get('estimated_cost')}"
        if kind == "session.ended":
            line += f" ({s.get('end_reason')})"
        return line
    if kind == "status":
        compacted = d.get("compacted")
        line = f"{head} {d.get('phase')} ~{d.get('token_estimate')} tokens"
        if d.get("token_threshold") is not None:
            line += f" / {d.get('token_threshold')}"
        return line + (f" (was {compacted.get('tokens_before')})" if isinstance(compacted, dict) else "")
    if kind == "error":
        return f"{head} {d.get('error')}"
    if kind.startswith("context."):
        label = d.get("label") or (d.get("block") or {}).get("label")
        key = f" [{d['key']}]" if d.get("key") else ""
        content = d.get("content")
        return f"{head} {label}{key}" + (f': "{_clip(str(content))}"' if content else "")
    if kind == "prompt.updated":
        return f"{head} {len(str(d.get('prompt', '')))} chars"
    return f"{head} {_clip(json.dumps(d, ensure_ascii=False), 80)}"


def add_url_option(parser: argparse.ArgumentParser) -> None:
    """``--url`` of the client commands (``tail``, ``sessions``, ``respond``)."""
    parser.add_argument(
        "--url",
        default="ws://127.0.0.1:8000/ws",
        type=parse_urls,
        help="hub WebSocket URL, or several separated by commas to fail over between (default: %(default)s)",
    )


def parse_urls(text: str) -> str | list[str]:
    """One hub URL, or several separated by commas: the client fails over between them
    (``HubClient([...])``, docs/protocol.md)."""
    urls = [url.strip() for url in text.split(",") if url.strip()]
    if not urls:
        raise argparse.ArgumentTypeError(f"no hub URL in {text!r}")
    return urls[0] if len(urls) == 1 else urls


async def note_ignored_token(hub: Any, token: str | None, url: str | Sequence[str]) -> None:
    """Say so when ``--token`` is given to a hub that checks none (no ``--auth-secret``): its
    ``auth`` answers no subject and no expiry. One line on stderr; the command goes on."""
    if token is None:
        return
    granted = await hub.request("auth", token=token)
    if isinstance(granted, dict) and granted.get("sub") is None and granted.get("exp") is None:
        where = url if isinstance(url, str) else ", ".join(url)
        print(
            f"sessionhub: the hub at {where} checks no tokens (no --auth-secret): --token is ignored",
            file=sys.stderr,
        )


async def run_tail(
    url: str | Sequence[str],
    session_id: str | None,
    *,
    after: int = 0,
    raw: bool = False,
    token: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Print every event of the session (or the registry) after ``after``, then live, until
    interrupted; reconnects and resumes by itself when the hub restarts."""
    from .client import HubClient

    stream = out or sys.stdout
    async with HubClient(url, token=token) as hub:
        await note_ignored_token(hub, token, url)
        async for event in hub.subscribe(session_id, after_seq=after):
            if raw:
                stream.write(msgspec.json.encode(event).decode() + "\n")
            else:
                stream.write(describe(event) + "\n")
            stream.flush()
    return 0


def _session_line(info: SessionInfo) -> str:
    ended = f" ended:{info.end_reason}" if info.end_reason else ""
    parent = f" ← {info.parent_session_id}" if info.parent_session_id else ""
    return (
        f"{info.id}  {info.updated_at:%Y-%m-%d %H:%M:%S}  {_clip(info.name, 40)!r}"
        f"  in={info.input_tokens} out={info.output_tokens} ${info.estimated_cost:.4f}{ended}{parent}"
    )


async def run_sessions(
    url: str | Sequence[str], *, raw: bool = False, token: str | None = None, out: TextIO | None = None
) -> int:
    from .client import HubClient

    stream = out or sys.stdout
    async with HubClient(url, token=token) as hub:
        await note_ignored_token(hub, token, url)
        for info in await hub.sessions.list():
            stream.write((msgspec.json.encode(info).decode() if raw else _session_line(info)) + "\n")
        # Here, not at the interpreter's exit: a closed pipe is then a BrokenPipeError the
        # command turns into its exit code (hub/apps/cli.py).
        stream.flush()
    return 0


async def run_session_action(
    url: str | Sequence[str], args: Any, *, token: str | None = None, out: TextIO | None = None
) -> int:
    """``sessions create NAME [--template T]`` (prints the new id, for scripts), ``rename ID
    NAME``, ``end ID [--reason R]`` and ``delete ID``: the admin ops of api.md §9."""
    from .client import HubClient

    stream = out or sys.stdout
    async with HubClient(url, token=token) as hub:
        await note_ignored_token(hub, token, url)
        if args.action == "create":
            info = await hub.sessions.create(args.name, model=args.model, template=args.template)
            stream.write(info.id + "\n")
        elif args.action == "rename":
            stream.write(_session_line(await hub.sessions.rename(args.session_id, args.name)) + "\n")
        elif args.action == "end":
            stream.write(_session_line(await hub.sessions.end(args.session_id, args.reason)) + "\n")
        else:
            await hub.sessions.delete(args.session_id)
            stream.write(f"deleted {args.session_id}\n")
        stream.flush()
    return 0


def failure(
    exc: BaseException,
    *,
    url: str | Sequence[str],
    token: str | None,
    session_id: str | None,
    after: int = 0,
) -> tuple[int, str | None]:
    """The exit code and the one line (without the ``sessionhub:`` prefix) for what ended a
    ``tail`` or ``sessions``; ``(1, None)`` for an exception that is not the hub's answer
    (a bug: the caller re-raises it). Exit codes: ``hub.apps.cli.EXIT_CODES``."""
    url = url if isinstance(url, str) else ", ".join(url)
    if isinstance(exc, ConnectionLost) and str(exc).startswith("no hub endpoint at"):
        return 3, f"{exc} (--url)"
    if isinstance(exc, ConnectionLost):
        return 3, f"cannot reach the hub at {url} ({exc}); is `sessionhub serve` running there? (--url)"
    if isinstance(exc, SessionHubError) and exc.code == "forbidden":
        what = "the registry" if session_id is None else f"session {session_id!r}"
        if token is None:
            return 4, (
                f"the hub at {url} needs a token for {what}: pass --token TOKEN or set $SESSIONHUB_TOKEN "
                "(`sessionhub token --scope read --session '*'` prints one)"
            )
        return 4, (
            f"the hub at {url} refused the token for {what}: it is expired, signed with another "
            "secret, or does not cover it (--token)"
        )
    if isinstance(exc, NotFound):
        return 5, f"no session {session_id!r} on the hub at {url} (`sessionhub sessions` lists them)"
    if isinstance(exc, PositionLost):
        return 6, (
            f"the log of {session_id or 'the registry'!r} cannot resume after seq {after} (pruned, "
            f"another epoch or beyond its end): it holds {exc.first_seq}..{exc.last_seq} "
            f"(epoch {exc.epoch}); pass --after {exc.last_seq} to follow "
            f"from now, or --after {max(exc.first_seq - 1, 0)} for everything it still has"
        )
    if isinstance(exc, SessionHubError) and exc.code == "invalid":
        return 2, f"the hub at {url} refused the arguments: {exc}"
    if isinstance(exc, SessionHubError):
        return 1, f"the hub answered {exc.code}: {exc}"
    return 1, None
