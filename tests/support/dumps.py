"""Hand-written dumps for the import tests: a valid one, and one broken in one place per
case (issue 24, items 5-7), with the line a refusal must name and what it must say."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

#: A time every store keeps exactly.
WHEN = "2026-01-02T03:04:05.678000+00:00"
#: The issue's 5,000-deep line: far past msgspec's reach (the interpreter's recursion limit).
DEEP = 5000


def deep(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def session(sid: str, messages: int = 2, **fields: Any) -> list[str]:
    """The lines of one session (``session``, its messages as one chain, ``end``);
    ``fields`` override the registry row's."""
    info = {
        "id": sid,
        "name": f"imported {sid}",
        "parent_session_id": None,
        "model": "m",
        "source": "tests",
        "input_tokens": 1,
        "output_tokens": 2,
        "estimated_cost": 0.5,
        "end_reason": None,
        "created_at": WHEN,
        "updated_at": WHEN,
        **fields,
    }
    lines = [
        json.dumps({"type": "session", "session": info, "context": {"memory": "m"}, "system_prompt": None})
    ]
    for i in range(messages):
        message = {"id": f"{sid}-m{i}", "role": "user", "parts": [{"type": "text", "text": f"line {i}"}]}
        parent = f"{sid}-m{i - 1}" if i else None
        lines.append(
            json.dumps(
                {
                    "type": "message",
                    "session_id": sid,
                    "parent_id": parent,
                    "created_at": WHEN,
                    "message": message,
                }
            )
        )
    lines.append(json.dumps({"type": "end", "session_id": sid, "messages": messages}))
    return lines


def dump(*sessions: list[str]) -> list[str]:
    return [json.dumps({"sessionhub_dump": 1, "sessions": len(sessions)}), *(x for s in sessions for x in s)]


def _compaction(sid: str, created_at: str) -> str:
    body = {"id": "c1", "summary": "s", "from_message_id": f"{sid}-m0", "to_message_id": f"{sid}-m1"}
    return json.dumps(
        {"type": "compaction", "session_id": sid, "compaction": {**body, "created_at": created_at}}
    )


class Bad(NamedTuple):
    lines: list[str]
    line: int  # the line the refusal names (from 1)
    says: str  # what its message says (the field or the problem)


def bad_dumps() -> dict[str, Bad]:
    """Every case: two good sessions come first, so a partial write would show."""
    good = [*session("imp-a"), *session("imp-b")]  # 8 lines after the header
    first = len(good) + 1  # the index (from 0) of the line after them, header included

    def later(*lines: str, says: str, at: int = 0) -> Bad:
        """The good sessions, then ``lines``; the refusal names ``lines[at]``."""
        return Bad([*dump(), *good, *lines], first + at + 1, says)

    third = session("imp-c")
    cases = {
        "the same session twice": Bad(
            dump(session("imp-a"), session("imp-b"), session("imp-a")), 10, "twice"
        ),
        "input_tokens 2**63": later(*session("imp-c", input_tokens=2**63), says="input_tokens"),
        "output_tokens below -2**63": later(
            *session("imp-c", output_tokens=-(2**63) - 1), says="output_tokens"
        ),
        "a cost beyond a double": later(
            third[0].replace('"estimated_cost": 0.5', '"estimated_cost": 1e400'), says="a number out of range"
        ),
        "a 5,000-deep line": later(deep(), says="nested too deeply"),
        "a 5,000-deep message": later(
            third[0],
            third[1].replace('"type": "text"', f'"type": "text", "x": {deep()}'),
            says="nested too deeply",
            at=1,
        ),
        "a 200-deep message": later(
            third[0],
            third[1].replace('"type": "text"', f'"type": "text", "x": {deep(200)}'),
            says="nests deeper",
            at=1,
        ),
        "junk after the JSON": later(third[0] + "x", says="not JSON"),
        "created_at in year 1": later(
            *session("imp-c", created_at="0001-01-01T00:00:00+00:00"), says="session.created_at"
        ),
        "updated_at at the end of time": later(
            *session("imp-c", updated_at="9999-12-31T23:59:59.999999+00:00"), says="session.updated_at"
        ),
        "a time without a zone": later(
            *session("imp-c", created_at="2026-01-02T03:04:05"), says="no time zone"
        ),
        "a message of year 1": later(
            third[0], third[1].replace(WHEN, "0001-01-01T00:00:00+00:00"), says="created_at", at=1
        ),
        "an overlay of year 1": later(
            *third[:-1], _compaction("imp-c", "0001-01-01T00:00:00+00:00"), says="compaction.created_at", at=3
        ),
        "a NUL in a session's name": later(
            *session("imp-c", name="a\x00b"), says="'session.name' holds a NUL"
        ),
        "a NUL in a context block": later(
            third[0].replace('"memory": "m"', '"memory": "m\\u0000"'), says="'context.memory' holds a NUL"
        ),
        "a NUL in a message id": later(
            third[0], third[1].replace('"imp-c-m0"', '"imp-c\\u0000"'), says="'message.id'", at=1
        ),
        "a lone surrogate": later('{"type": "session", "session": {"id": "\\ud800"}}', says="not JSON"),
    }
    return cases
