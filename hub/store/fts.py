"""Full-text rules both stores share: what separates the words of a query (JavaScript's
whitespace), the FTS5 query builders (every user word quoted, so no FTS syntax gets
through) and, for Postgres, the words the index holds (:func:`fts_text`)."""

from __future__ import annotations

import re
import unicodedata

from ..tokens import JS_WHITESPACE

__all__ = ["MAX_INDEXED_CHARS", "fts_text", "fts_words", "phrase_query", "split_words", "words_query"]

# JavaScript's \s (the original splits with /\s+/), not Python's.
_WS = re.compile(f"[{JS_WHITESPACE}]+")


def split_words(query: str) -> list[str]:
    """The words of a query: separated by JavaScript's whitespace, blanks dropped."""
    return [w for w in _WS.split(query) if w]


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def phrase_query(query: str) -> str | None:
    """The whole query as one quoted phrase (``Session.search``); None when blank."""
    if not _WS.sub("", query):
        return None
    return _quote(query)


def words_query(query: str) -> str | None:
    """Each word quoted and ANDed (``SessionManager.search``); None when blank."""
    words = split_words(query)
    if not words:
        return None
    return " ".join(_quote(w) for w in words)


# Words as SQLite's unicode61 tokenizer sees them: runs of letters and digits (any script),
# private-use characters and emoji; everything else separates. Postgres' own parser would
# keep "blue/green", "a-b" or "user@host" whole and drop emoji.
_TOKEN = re.compile("(?:[^\\W_]|[\ue000-\uf8ff\U00010000-\U0010ffff])+")
_PLAIN = re.compile("[a-z0-9]+")
_MARKS = re.compile("[\u0300-\u036f]")
#: A tsvector holds at most 1 MB; text past this many characters is not indexed.
MAX_INDEXED_CHARS = 300_000


def _word(token: str) -> str:
    # ASCII words go to the stemmer as they are; any other word (which FTS5's porter
    # leaves unstemmed too) travels as one opaque ASCII word, whatever the server's locale.
    return token if _PLAIN.fullmatch(token) else "x" + "x".join(f"{ord(c):x}" for c in token)


def fts_text(text: str | None) -> str:
    """``text`` as the words the index holds, space-separated (what ``to_tsvector`` gets)."""
    if not text:
        return ""
    text = text[:MAX_INDEXED_CHARS].lower()
    if not text.isascii():
        text = unicodedata.normalize("NFC", _MARKS.sub("", unicodedata.normalize("NFD", text)))
    return " ".join(_word(t) for t in _TOKEN.findall(text))


def fts_words(query: str) -> list[str]:
    """Each word of ``query`` as the index holds it (:func:`fts_text`); words that hold
    nothing indexable are dropped, as FTS5 drops an empty quoted phrase from an AND."""
    return [w for w in (fts_text(w) for w in split_words(query)) if w]
