"""``sessionhub serve``'s compaction options: who writes the summaries (the hub's connected
workers, or an OpenAI-compatible chat-completions server) and when sessions compact.

Without them the hub has no summarizer, as before. With one, the ``compact`` op and the
inspector's "compact now" summarize; ``--compact-after`` adds automatic compaction.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # loaded by serve_compaction: `sessionhub tail` need not import the engine
    from ..compaction import Summarizer
    from ..manager import SessionManager
    from ..server.workers import WorkerSummarizer

__all__ = ["API_KEY_ENV", "ServeCompaction", "add_options", "compaction_problem", "serve_compaction"]

#: The summarizer's API key comes from here, never from a flag (which `ps` shows).
API_KEY_ENV = "SESSIONHUB_SUMMARIZER_API_KEY"
#: create_compact_function's default tail budget; the timeout is both summarizers' default.
TAIL_TOKENS = 20_000
TIMEOUT = 60.0

_NEEDS = "a summarizer: --summarizer workers, or --summarizer-url URL --summarizer-model MODEL"
#: Options that only tune a summarizer: given without one, they would silently do nothing.
_TUNING = ("compact_after", "compact_tail_tokens", "summarizer_timeout")


def add_options(serve: argparse.ArgumentParser, positive: Callable[[str], int]) -> None:
    group = serve.add_argument_group("compaction (docs/compaction.md; default: no summarizer)")
    group.add_argument(
        "--summarizer",
        default=os.environ.get("SESSIONHUB_SUMMARIZER") or None,
        choices=["workers"],
        help="workers: summary prompts go to connected workers that say summarizer: true "
        "(default: $SESSIONHUB_SUMMARIZER)",
    )
    group.add_argument(
        "--summarizer-url",
        default=os.environ.get("SESSIONHUB_SUMMARIZER_URL") or None,
        metavar="BASE_URL",
        help="summarize with an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1; its key "
        f"is ${API_KEY_ENV} (default: $SESSIONHUB_SUMMARIZER_URL)",
    )
    group.add_argument(
        "--summarizer-model",
        default=os.environ.get("SESSIONHUB_SUMMARIZER_MODEL") or None,
        metavar="MODEL",
        help="the model --summarizer-url is asked for (default: $SESSIONHUB_SUMMARIZER_MODEL)",
    )
    group.add_argument(
        "--summarizer-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds a summary may take, per request (default: {TIMEOUT:g})",
    )
    group.add_argument(
        "--compact-after",
        type=positive,
        default=None,
        metavar="TOKENS",
        help="compact a session automatically once its estimate passes TOKENS (needs a summarizer)",
    )
    group.add_argument(
        "--compact-tail-tokens",
        type=positive,
        default=None,
        metavar="TOKENS",
        help=f"a compaction keeps the newest messages that fit TOKENS as they are (default: {TAIL_TOKENS})",
    )


def _source(flag: str, env: str, typed: Sequence[str]) -> str:
    """How the operator gave ``flag``: typed, or through its environment variable."""
    return flag if any(t == flag or t.startswith(flag + "=") for t in typed) else f"{flag} (${env})"


def compaction_problem(args: argparse.Namespace) -> str | None:
    """The first thing wrong with the compaction options, as one line; None when usable."""
    typed = args.typed
    kind = _source("--summarizer", "SESSIONHUB_SUMMARIZER", typed)
    url = _source("--summarizer-url", "SESSIONHUB_SUMMARIZER_URL", typed)
    model = _source("--summarizer-model", "SESSIONHUB_SUMMARIZER_MODEL", typed)
    if args.summarizer not in (None, "workers"):  # argparse checks no default against choices
        return f"{kind} {args.summarizer!r} is not a summarizer (say workers, or use --summarizer-url)"
    if args.summarizer and args.summarizer_url:
        return f"{kind} and {url} are two summarizers: pick one"
    if args.summarizer_url and not args.summarizer_model:
        return f"{url} needs --summarizer-model MODEL (or $SESSIONHUB_SUMMARIZER_MODEL)"
    if args.summarizer_model and not args.summarizer_url:
        return f"{model} needs --summarizer-url BASE_URL (the server to ask)"
    if args.summarizer_url:
        # Not echoed: a URL may carry credentials.
        bad = f"{url} must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1"
        try:
            parts = urlsplit(args.summarizer_url)
            _ = parts.port  # raises on a port that is not one (99999, abc)
        except ValueError:
            return bad
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return bad
        if parts.username or parts.password:
            return f"{url} must not carry credentials: put the API key in ${API_KEY_ENV}"
    if not (args.summarizer or args.summarizer_url):
        for name in _TUNING:
            if getattr(args, name) is not None:
                return f"--{name.replace('_', '-')} needs {_NEEDS}"
    return None


class ServeCompaction:
    """What ``serve`` hands to :func:`hub.server.create_app`: the manager's compaction and,
    for ``--summarizer workers``, the worker summarizer the hub attaches to."""

    def __init__(
        self,
        summarize: Summarizer,
        workers: WorkerSummarizer | None,
        compact_after: int | None,
        tail_tokens: int,
    ) -> None:
        self.summarize = summarize
        self.workers = workers
        self.compact_after = compact_after
        self.tail_tokens = tail_tokens

    def configure(self, manager: SessionManager) -> None:
        from ..compaction import create_compact_function

        manager.on_compaction(create_compact_function(self.summarize, tail_token_budget=self.tail_tokens))
        if self.compact_after is not None:
            manager.compact_after(self.compact_after)


def serve_compaction(args: argparse.Namespace) -> ServeCompaction | None:
    """The compaction of checked options (:func:`compaction_problem`); None without a summarizer."""
    from ..server.workers import WorkerSummarizer
    from ..summarizers import OpenAICompatible

    timeout = TIMEOUT if args.summarizer_timeout is None else args.summarizer_timeout
    workers: WorkerSummarizer | None = None
    summarize: Summarizer
    if args.summarizer == "workers":
        summarize = workers = WorkerSummarizer(timeout=timeout)
    elif args.summarizer_url:
        # `[compaction] api_key_env` of sessionhub.toml names another variable.
        api_key = os.environ.get(getattr(args, "summarizer_api_key_env", None) or API_KEY_ENV) or None
        summarize = OpenAICompatible(args.summarizer_url, args.summarizer_model, api_key, timeout=timeout)
    else:
        return None
    tail = TAIL_TOKENS if args.compact_tail_tokens is None else args.compact_tail_tokens
    return ServeCompaction(summarize, workers, args.compact_after, tail)
