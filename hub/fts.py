"""Full-text query builders. Every user word is quoted, so no FTS syntax gets through."""

from __future__ import annotations

import re

from .tokens import JS_WHITESPACE

__all__ = ["phrase_query", "words_query"]

# JavaScript's \s (the original splits with /\s+/), not Python's.
_WS = re.compile(f"[{JS_WHITESPACE}]+")


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def phrase_query(query: str) -> str | None:
    """The whole query as one quoted phrase (``Session.search``); None when blank."""
    if not _WS.sub("", query):
        return None
    return _quote(query)


def words_query(query: str) -> str | None:
    """Each word quoted and ANDed (``SessionManager.search``); None when blank."""
    words = [w for w in _WS.split(query) if w]
    if not words:
        return None
    return " ".join(_quote(w) for w in words)
