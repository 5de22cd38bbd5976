"""The rules both stores apply, written once: argument checks, usage bounds, what a split
session is called and starts with, which logs a registry change goes to, how many matches a
search ranks. A store decides only how to write them in its SQL."""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

import msgspec

from protocol import Compaction, Conflict, InvalidInput, Message, SessionInfo

__all__ = [
    "COST_MAX",
    "END_REASON",
    "END_REASON_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "REGISTRY",
    "SEARCH_WINDOW",
    "SPLIT_NAME",
    "already_ended",
    "check_compaction_args",
    "check_end_reason",
    "check_limit",
    "check_name",
    "check_query",
    "check_session_id",
    "check_summary",
    "check_usage",
    "context_owners",
    "continuation_message",
    "new_compaction",
    "not_one_path",
    "owned_context",
    "registry_events",
    "session_stream",
    "split_name",
    "summarized_deleted",
    "usage_event",
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

#: Ranking (bm25 on SQLite, ts_rank on Postgres) costs per matching row. A query is ranked
#: over its newest SEARCH_WINDOW matches: exactly the original's order up to that many
#: matches, and under 2 ms when a phrase matches 14,000 of 100,000 messages
#: (docs/benchmarks.md).
SEARCH_WINDOW: Final = 250

#: ``end_session``'s reason when the caller gives none; a compaction's split ends with
#: ``"compaction"``.
END_REASON: Final = "ended"
#: A reason is a label shown in session lists, not a log: bounded like a name would be.
END_REASON_MAX: Final = 200

#: The name of a split session's continuation when neither the caller nor the ended
#: session gives one.
SPLIT_NAME: Final = "Compacted"


# -- argument checks ----------------------------------------------------------------------
def check_session_id(session_id: object) -> str:
    """A session id is a string, on every store (SQLite would look an int up and find
    nothing, asyncpg would refuse to bind it)."""
    if not isinstance(session_id, str):
        raise InvalidInput(f"session id must be a string, got {type(session_id).__name__}")
    return session_id


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidInput("session name must be a string")
    return name


def check_end_reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise InvalidInput(f"end reason must be a string, got {type(reason).__name__}")
    if not reason.strip():
        raise InvalidInput("end reason must not be empty")
    if len(reason) > END_REASON_MAX:
        raise InvalidInput(f"end reason must be at most {END_REASON_MAX} characters, got {len(reason)}")
    return reason


def already_ended(info: SessionInfo) -> Conflict:
    """``end_session`` refused: the session has ended already (its reason is kept)."""
    return Conflict(f"session {info.id!r} has already ended ({info.end_reason})")


def check_summary(summary: object) -> str:
    if not isinstance(summary, str):
        raise InvalidInput("summary must be a string")
    return summary


def check_query(query: object) -> str:
    if not isinstance(query, str):
        raise InvalidInput("search query must be a string")
    return query


def check_compaction_args(summary: object, from_id: object, to_id: object) -> None:
    for name, value in (("summary", summary), ("from_id", from_id), ("to_id", to_id)):
        if not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string")


def check_limit(limit: object, name: str = "limit") -> int:
    """A result count: an integer that fits a SQL ``LIMIT`` (<= 0 means no results)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidInput(f"{name} must be an integer, got {type(limit).__name__}")
    if not INT64_MIN <= limit <= INT64_MAX:
        raise InvalidInput(f"{name} must be at most {INT64_MAX}, got {limit}")
    return limit


# -- usage ---------------------------------------------------------------------------------
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


def usage_event(delta: tuple[int, int, float]) -> dict[str, Any]:
    """The ``delta`` of a ``session.usage`` event: what this call added."""
    return {"input_tokens": delta[0], "output_tokens": delta[1], "cost": delta[2]}


# -- the registry ----------------------------------------------------------------------------
def registry_events(info: SessionInfo, type_: str, **extra: Any) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Where a registry change is logged, in this order: the session's own stream (its
    subscribers see it), then the registry's (every session list sees it). The same data
    on both. Writers take the streams' counters in this order, so two never deadlock."""
    data = {"session": msgspec.to_builtins(info), **extra}
    return ((session_stream(info.id), data), (REGISTRY, data))


# -- split and overlays ---------------------------------------------------------------------
def split_name(ended: SessionInfo, name: str | None) -> str:
    """The continuation's name: the caller's, else the ended session's, else ``SPLIT_NAME``."""
    return name if name is not None else (ended.name or SPLIT_NAME)


def continuation_message(summary: str) -> Message:
    """The one message a split session's continuation starts with."""
    return Message(
        id=str(uuid.uuid4()),
        role="assistant",
        parts=[{"type": "text", "text": f"[Context from previous session]\n\n{summary}"}],
    )


def new_compaction(summary: str, from_id: str, to_id: str, created_at: datetime) -> Compaction:
    return Compaction(
        id=str(uuid.uuid4()),
        summary=summary,
        from_message_id=from_id,
        to_message_id=to_id,
        created_at=created_at,
    )


def not_one_path(from_id: str, to_id: str) -> Conflict:
    """``add_compaction(verify_path=True)`` refused: the span is no longer one path."""
    return Conflict(
        f"cannot lay an overlay over {from_id!r}..{to_id!r}: they are no longer one path of the session"
    )


def summarized_deleted(from_id: str, to_id: str, missing: int) -> Conflict:
    """``add_compaction(covered=...)`` refused: messages the summary was made from are gone."""
    return Conflict(
        f"cannot lay an overlay over {from_id!r}..{to_id!r}: "
        f"{missing} of the summarized messages were deleted meanwhile"
    )


# -- context blocks of one session --------------------------------------------------------
# A store-backed block's key is ``<label>_<session id>`` (the original's layout), so the keys
# ending in ``_b`` include those of a session ``a_b``. A key belongs to the longest session
# id it ends with that exists: the stores look up the candidates below, then keep the rows
# that are really the session's.


def context_owners(keys: Iterable[str], session_id: str) -> set[str]:
    """The session ids longer than ``session_id`` that keys ending in ``_<session_id>``
    could belong to instead (every suffix after an underscore of the label part)."""
    candidates: set[str] = set()
    cut = len(session_id) + 1
    for key in keys:
        label = key[:-cut]
        for i, ch in enumerate(label):
            if ch == "_":
                candidates.add(key[i + 1 :])
    return candidates


def owned_context(
    rows: Iterable[tuple[str, str]], session_id: str, existing: set[str]
) -> list[tuple[str, str]]:
    """``(label, content)`` of the ``(key, content)`` rows that belong to ``session_id``,
    given which of :func:`context_owners`' candidates are sessions (``existing``)."""
    cut = len(session_id) + 1
    owned: list[tuple[str, str]] = []
    for key, content in rows:
        label = key[:-cut]
        if any(key[i + 1 :] in existing for i, ch in enumerate(label) if ch == "_"):
            continue  # a longer session id that exists owns it
        owned.append((label, content))
    return owned
