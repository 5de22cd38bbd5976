"""What every record of an import must satisfy before a store is handed it: the checks
both the dump reader (``hub.dump``, naming the line) and sessions built elsewhere (the
``--from`` sources, callers of ``import_dumps``; naming the session) go through, so that
an import cannot fail half way on its content, nor store what a later read or export
cannot hold. Each check returns the problem (a phrase naming the field) or None.

Engine level: nothing here imports the server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final

import msgspec

from protocol import InvalidInput, SessionInfo

from .store.base import SessionDump, check_usage

__all__ = ["TIME_RANGE", "check_dumps", "nul_problem", "session_problem", "time_problem", "usage_problem"]

#: The times a dump may carry (from, until): the range both stores keep to the microsecond.
#: SQLite stores epoch seconds as a double, exact to the microsecond only within ~2**33 s of
#: 1970 (1697..2242); asyncpg writes 0001-01-01T00:00Z and 9999-12-31T23:59:59.999999Z as
#: the infinities, which read back without a time zone and then broke every export.
TIME_RANGE: Final = (datetime(1700, 1, 1, tzinfo=UTC), datetime(2200, 1, 1, tzinfo=UTC))


def time_problem(value: datetime, label: str) -> str | None:
    """Why a time cannot be stored as it is; ``label`` names it."""
    if value.tzinfo is None:
        return f"{label} has no time zone"
    first, until = TIME_RANGE
    if not first <= value < until:
        return f"{label} {value.isoformat()} is outside {first.isoformat()} .. {until.isoformat()}"
    return None


def usage_problem(info: SessionInfo) -> str | None:
    """Token counts beyond int64 (SQLite's binding raised OverflowError), a cost no double holds."""
    try:
        check_usage(info.input_tokens, info.output_tokens, info.estimated_cost)
    except InvalidInput as exc:  # names the field: "input_tokens must fit in 64 bits ..."
        return str(exc)
    return None


def nul_problem(label: str, fields: Iterable[tuple[str, object]]) -> str | None:
    """A NUL in a field a store keeps as a text column: Postgres text cannot hold one, so
    the same dump would import on SQLite and fail, unnamed, on Postgres."""
    for name, value in fields:
        if isinstance(value, str) and "\x00" in value:
            return f"'{label}.{name}' holds a NUL character (Postgres text cannot store it)"
    return None


def session_problem(d: SessionDump) -> str | None:
    """Every check of a whole session, as the reader makes them line by line."""
    context = [*((f"{label} (its label)", label) for label in d.context), *d.context.items()]
    checks = [
        usage_problem(d.info),
        nul_problem("session", [*msgspec.structs.asdict(d.info).items(), ("system_prompt", d.system_prompt)]),
        nul_problem("context", context),
        time_problem(d.info.created_at, "'session.created_at'"),
        time_problem(d.info.updated_at, "'session.updated_at'"),
    ]
    for m in d.messages:
        checks.append(time_problem(m.created_at, f"the created_at of message {m.message.id!r}"))
        checks.append(nul_problem("message", [("id", m.message.id)]))
    for c in d.compactions:
        checks.append(time_problem(c.created_at, f"the created_at of overlay {c.id!r}"))
        checks.append(nul_problem("compaction", msgspec.structs.asdict(c).items()))
    return next((p for p in checks if p is not None), None)


def check_dumps(dumps: Sequence[SessionDump]) -> None:
    """Refuse (:class:`~protocol.errors.InvalidInput`, naming the session) what a store
    would hold wrongly or a transaction would refuse half way: a session twice, and
    whatever :func:`session_problem` finds."""
    seen: set[str] = set()
    for d in dumps:
        sid = d.info.id
        problem = "it is in the dump twice" if sid in seen else session_problem(d)
        if problem is not None:
            raise InvalidInput(f"session {sid!r}: {problem}; nothing was written")
        seen.add(sid)
