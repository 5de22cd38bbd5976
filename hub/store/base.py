"""The storage contract every backend implements, and the markers it shares with the engine.

A store owns SQL, migrations, transactions and the event log; nothing above it writes SQL.
Every mutating method runs as one transaction that also appends the change's events to the
session's log (and, for registry changes, to the registry log), so an acknowledged change is
never missing from the log and a failed one leaves neither change nor event behind.

``managed=True`` means "on behalf of the SessionManager": the session must exist in the
registry (else :class:`~protocol.errors.SessionNotFound`, nothing written) and its
``updated_at`` is touched in the same transaction.
"""

from __future__ import annotations

import abc
import math
import sys
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from protocol import (
    Compaction,
    Event,
    InvalidInput,
    Message,
    PositionLost,
    SearchResult,
    SessionInfo,
)
from protocol.markers import LATEST, Parent, ParentArg

from ..bus import Bus

__all__ = [
    "COST_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "LATEST",
    "REGISTRY",
    "AppendResult",
    "LogEntry",
    "Parent",
    "ParentArg",
    "Store",
    "StreamPosition",
    "check_limit",
    "check_session_id",
    "check_usage",
    "session_stream",
    "usage_totals",
]


#: The stream key of the sessions-registry log.
REGISTRY: Final = "registry"


def session_stream(session_id: str) -> str:
    """The stream key of a session's own log."""
    return "s:" + session_id


#: What an integer column holds on both stores (SQLite INTEGER, Postgres bigint).
INT64_MAX: Final = (1 << 63) - 1
INT64_MIN: Final = -(1 << 63)
#: The largest finite double: a cost total never goes beyond it.
COST_MAX: Final = sys.float_info.max


def check_session_id(session_id: object) -> str:
    """A session id is a string, on every store (SQLite would look an int up and find
    nothing, asyncpg would refuse to bind it)."""
    if not isinstance(session_id, str):
        raise InvalidInput(f"session id must be a string, got {type(session_id).__name__}")
    return session_id


def check_limit(limit: object, name: str = "limit") -> int:
    """A result count: an integer that fits a SQL ``LIMIT`` (<= 0 means no results)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInput(f"{name} must be an integer, got {type(limit).__name__}")
    if not INT64_MIN <= limit <= INT64_MAX:
        raise InvalidInput(f"{name} must be at most {INT64_MAX}, got {limit}")
    return limit


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(f"{name} must be finite, got {value!r}")
        value = int(value)
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidInput(f"{name} must fit in 64 bits (|n| < 2**63), got {value}")
    return value


def check_usage(input_tokens: object, output_tokens: object, cost: object) -> tuple[int, int, float]:
    """``add_usage``'s arguments as stored: token counts within int64, a finite cost."""
    tokens_in = _count(input_tokens, "input_tokens")
    tokens_out = _count(output_tokens, "output_tokens")
    if isinstance(cost, bool) or not isinstance(cost, int | float):
        raise InvalidInput("cost must be a number")
    try:
        amount = float(cost)
    except OverflowError:  # an int beyond any double
        raise InvalidInput(f"cost must be finite, got {cost}") from None
    if not math.isfinite(amount):
        raise InvalidInput(f"cost must be finite, got {amount!r}")
    return tokens_in, tokens_out, amount


def usage_totals(current: tuple[int, int, float], delta: tuple[int, int, float]) -> tuple[int, int, float]:
    """The totals after adding ``delta`` (from :func:`check_usage`) to ``current``; a sum
    that would leave int64 or the finite doubles is :class:`~protocol.errors.InvalidInput`
    and nothing is added. Stores call it on the row they hold locked in the write
    transaction, so two concurrent calls cannot overflow between them either."""
    tokens_in, tokens_out = current[0] + delta[0], current[1] + delta[1]
    for name, total in (("input_tokens", tokens_in), ("output_tokens", tokens_out)):
        if not INT64_MIN <= total <= INT64_MAX:
            raise InvalidInput(f"{name} total would be {total}, beyond 64 bits; nothing was added")
    cost = current[2] + delta[2]
    if not math.isfinite(cost):
        raise InvalidInput("estimated_cost total would overflow a double; nothing was added")
    return tokens_in, tokens_out, cost


class AppendResult(msgspec.Struct, kw_only=True):
    """What an append wrote: ids actually inserted (duplicates are skipped), the id the
    chain ended on (the last message given, stored or already there), and the session's
    last event seq after the write (0 if nothing was written)."""

    inserted: list[str]
    last_id: str | None
    last_seq: int


class LogEntry(msgspec.Struct, kw_only=True):
    """An event to append to a session's log together with a write."""

    session_id: str
    type: str
    data: dict[str, Any]


class StreamPosition(msgspec.Struct, kw_only=True):
    """What an event stream can serve: events ``first_seq..last_seq`` of ``epoch``.
    An empty stream has ``first_seq = 1`` and ``last_seq = 0``."""

    stream: str
    epoch: str
    first_seq: int
    last_seq: int

    def check(self, after_seq: int, epoch: str | None = None) -> None:
        """Raise :class:`~protocol.errors.PositionLost` unless this log can serve the events
        after ``after_seq`` of ``epoch`` (None: any epoch)."""
        if (
            (epoch is not None and epoch != self.epoch and self.last_seq > 0)
            or after_seq < self.first_seq - 1
            or after_seq > self.last_seq
        ):
            raise PositionLost(
                self.stream, after_seq, epoch=self.epoch, first_seq=self.first_seq, last_seq=self.last_seq
            )


class Store(abc.ABC):
    """Storage for sessions, messages, overlays and event logs."""

    #: Rung with ``(stream, seq)`` after every commit that wrote events.
    bus: Bus

    # -- lifecycle -----------------------------------------------------------------------
    @abc.abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- messages ------------------------------------------------------------------------
    @abc.abstractmethod
    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[Message],
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> AppendResult:
        """Append a chain: the first message attaches per ``parent``, each next one to the
        one before it. Ids already stored in the session are skipped (first content wins)
        but still continue the chain."""

    @abc.abstractmethod
    async def update_message(
        self,
        session_id: str,
        message: Message,
        *,
        managed: bool = False,
        emit: bool = True,
        also: Sequence[LogEntry] = (),
    ) -> bool:
        """Replace a stored message's content; False (and nothing written) if unknown.
        ``emit=False`` writes no ``message.updated`` event (a streamed message's periodic
        save); ``also`` are more events for the same transaction."""

    @abc.abstractmethod
    async def upsert_message(
        self,
        session_id: str,
        message: Message,
        parent: ParentArg = LATEST,
        *,
        managed: bool = False,
    ) -> bool:
        """Update the message if its id is stored, else append it. True when appended."""

    @abc.abstractmethod
    async def delete_messages(
        self, session_id: str, ids: Sequence[str], *, managed: bool = False
    ) -> list[str]:
        """Delete messages; each one's children move to its parent. Returns the ids deleted."""

    @abc.abstractmethod
    async def clear_messages(self, session_id: str, *, managed: bool = False) -> None:
        """Delete every message and overlay of the session."""

    @abc.abstractmethod
    async def get_message(self, session_id: str, message_id: str) -> Message | None: ...

    @abc.abstractmethod
    async def get_history(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        """Root → leaf (latest leaf by default) with overlays applied; unknown leaf → []."""

    @abc.abstractmethod
    async def get_path(self, session_id: str, leaf_id: str | None = None) -> list[Message]:
        """Root → leaf without overlays."""

    @abc.abstractmethod
    async def get_latest_leaf(self, session_id: str) -> Message | None: ...

    @abc.abstractmethod
    async def get_path_length(self, session_id: str, leaf_id: str | None = None) -> int:
        """Raw rows on the path (overlays not collapsed); unknown leaf → 0."""

    @abc.abstractmethod
    async def get_branches(self, session_id: str, message_id: str) -> list[Message]:
        """Direct children, oldest first."""

    @abc.abstractmethod
    async def search_messages(
        self,
        query: str,
        *,
        session_id: str | None,
        limit: int = 20,
        match: Literal["phrase", "words"],
    ) -> list[SearchResult]:
        """Full-text search of text parts, best first. ``session_id=None`` searches every
        session of the registry. A query that is blank or matches nothing returns []."""

    # -- compaction overlays -------------------------------------------------------------
    @abc.abstractmethod
    async def add_compaction(
        self,
        session_id: str,
        summary: str,
        from_id: str,
        to_id: str,
        *,
        managed: bool = False,
        verify_path: bool = False,
        covered: Sequence[str] = (),
    ) -> Compaction:
        """Store an overlay. With ``verify_path`` the write is refused with
        :class:`~protocol.errors.Conflict` unless ``from_id`` is ``to_id`` or one of its
        ancestors at commit time (the span a summary was made from is still one path) and every
        id in ``covered`` (the messages the summary was made from) is still stored."""

    @abc.abstractmethod
    async def get_compactions(self, session_id: str) -> list[Compaction]:
        """Every overlay of the session, oldest first."""

    # -- sessions registry ---------------------------------------------------------------
    @abc.abstractmethod
    async def create_session(
        self,
        name: str,
        *,
        parent_session_id: str | None = None,
        model: str | None = None,
        source: str | None = None,
        session_id: str | None = None,
    ) -> SessionInfo: ...

    @abc.abstractmethod
    async def get_session(self, session_id: str) -> SessionInfo | None: ...

    @abc.abstractmethod
    async def list_sessions(self) -> list[SessionInfo]:
        """Most recently updated first."""

    @abc.abstractmethod
    async def rename_session(self, session_id: str, name: str) -> SessionInfo: ...

    @abc.abstractmethod
    async def delete_session(self, session_id: str, *, context_keys: Sequence[str] = ()) -> None:
        """Delete the session, its messages, overlays, log and the context rows named by
        ``context_keys``; a final ``session.deleted`` event stays readable."""

    @abc.abstractmethod
    async def add_usage(
        self, session_id: str, input_tokens: int, output_tokens: int, cost: float
    ) -> SessionInfo: ...

    @abc.abstractmethod
    async def fork_session(self, session_id: str, at_message_id: str, name: str) -> SessionInfo:
        """A new session holding the path root → ``at_message_id`` (same ids) and the
        overlays lying wholly on it."""

    @abc.abstractmethod
    async def split_session(self, session_id: str, summary: str, name: str | None = None) -> SessionInfo:
        """End the session (``end_reason='compaction'``) and start its continuation, whose
        one message carries the summary."""

    # -- context blocks and search entries ------------------------------------------------
    @abc.abstractmethod
    async def get_context_value(self, key: str) -> str | None:
        """The stored content of a context block row, or None when never written."""

    @abc.abstractmethod
    async def set_context_value(self, key: str, content: str, *, event: LogEntry | None = None) -> None:
        """Upsert a context block row (and log ``event`` in the same transaction)."""

    @abc.abstractmethod
    async def count_search_entries(self, label: str) -> int: ...

    @abc.abstractmethod
    async def set_search_entry(
        self, label: str, key: str, content: str, *, event: LogEntry | None = None
    ) -> None:
        """Upsert an entry of a searchable block; its old words stop matching."""

    @abc.abstractmethod
    async def search_entries(self, label: str, query: str, limit: int = 10) -> list[tuple[str, str]]:
        """``(key, content)`` of the entries matching every word of ``query``, best first."""

    @abc.abstractmethod
    async def log_event(self, entry: LogEntry) -> int:
        """Append an event on its own (for changes made outside the store); returns its seq."""

    # -- event logs ----------------------------------------------------------------------
    @abc.abstractmethod
    async def read_events(
        self, stream: str, after_seq: int = 0, limit: int = 1000, *, epoch: str | None = None
    ) -> list[Event]:
        """Events of ``stream`` after ``after_seq``, oldest first, at most ``limit``.
        Raises :class:`~protocol.errors.PositionLost` when the log cannot serve that
        position (pruned, another epoch, or beyond its end)."""

    @abc.abstractmethod
    async def stream_position(self, stream: str) -> StreamPosition: ...
