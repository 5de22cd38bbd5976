"""Engine values as wire data: results, event frames, error frames."""

from __future__ import annotations

from typing import Any

import msgspec

from protocol import Event, Message, PositionLost, SessionHubError
from protocol import frames as f

from ..compaction import CompactResult
from ..store.base import LATEST, ParentArg
from ..tools import Tool


def wire(value: Any) -> Any:
    """An engine result as JSON-ready data (messages as UIMessage dicts)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Message):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, CompactResult):
        return {
            "from_message_id": value.from_message_id,
            "to_message_id": value.to_message_id,
            "summary": value.summary,
        }
    if isinstance(value, Tool):
        return {"name": value.name, "description": value.description, "input_schema": value.input_schema}
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    raise TypeError(f"cannot send {type(value).__name__} over the wire")


def event_frame(event: Event) -> f.EventFrame:
    return f.EventFrame(
        stream=event.stream,
        session_id=event.session_id,
        seq=event.seq,
        epoch=event.epoch,
        type=event.type,
        data=event.data,
        created_at=event.created_at.isoformat(),
    )


def parent_arg(value: Any) -> ParentArg:
    return LATEST if value is msgspec.UNSET else value


def _code(exc: SessionHubError) -> f.ErrorCode:
    if isinstance(exc, PositionLost):
        # "reset" is a frame, not an error code: a read of a lost position (read_events)
        # finds no events there; its detail lets the clients rebuild PositionLost.
        return "not_found"
    code = exc.code
    return code if code in f.ERROR_CODES else "internal"  # type: ignore[return-value]


def error_frame(request_id: str | int, exc: SessionHubError) -> f.ErrorFrame:
    """The error frame that answers a request the engine refused, with the exception's
    ``detail`` so that clients rebuild it (``SessionNotFound(session_id)``) without parsing."""
    return f.ErrorFrame(id=request_id, code=_code(exc), message=str(exc), detail=exc.detail)
