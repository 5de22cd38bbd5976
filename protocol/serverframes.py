"""Server → client: the frames, one tagged union (:data:`ServerFrame`, tagged by ``frame``).

``reply`` (to a request), ``error`` (to a request, or ``id: null`` for a frame that could
not be read; its ``code`` one of :data:`ERROR_CODES`), ``event`` (a logged change on a
subscribed stream), ``reset`` (a subscription position the log cannot serve: reload a
snapshot, then subscribe again from its ``last_seq``), and the frames of presence,
streamed messages, turns, summaries and dumps.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec

from .records import PresenceEntry

__all__ = ["ERROR_CODES", "ErrorCode", "ServerFrame"]

#: Error codes, a closed set. ``reset`` is not among them: it is its own frame.
ErrorCode = Literal[
    "bad_frame",  # not JSON, not an object, or not a known request shape
    "unknown_op",  # ``op`` names no operation
    "invalid",  # a field has the wrong type or value; nothing was done
    "not_found",  # the session (or message) does not exist
    "forbidden",  # the token does not allow this
    "too_large",  # the frame is over the size limit
    "too_many",  # too many subscriptions on this connection
    "conflict",  # the state changed under the operation; nothing was written
    "upstream",  # a summarizer or worker failed
    "unavailable",  # the hub is shutting down (and the clients' ConnectionLost)
    "internal",  # a bug or a failing database; the operation was rolled back
]

ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)


class _Frame(msgspec.Struct, tag_field="frame", kw_only=True):
    pass


class ReplyFrame(_Frame, tag="reply"):
    id: str | int
    result: Any = None


class ErrorFrame(_Frame, tag="error", omit_defaults=True):
    """``detail``: what the client needs to rebuild the engine's exception without parsing
    ``message`` (``{"session_id"}`` for an unknown session, ``{"field", "problem"}`` for an
    invalid message); left out when there is none."""

    id: str | int | None
    code: ErrorCode
    message: str
    detail: dict[str, Any] | None = None


class EventFrame(_Frame, tag="event"):
    """One logged change. ``stream`` is ``session`` (``seq`` counts the session's changes)
    or ``registry`` (``seq`` counts registry changes; ``session_id`` is their subject)."""

    stream: Literal["session", "registry"]
    session_id: str
    seq: int
    epoch: str
    type: str
    data: dict[str, Any]
    created_at: str


class ResetFrame(_Frame, tag="reset"):
    """The subscription to ``session_id`` (``null``: the registry) cannot continue from the
    position asked for: reload a snapshot and subscribe again from ``last_seq`` of
    ``epoch``. The subscription has ended."""

    session_id: str | None
    after_seq: int
    epoch: str
    first_seq: int
    last_seq: int
    message: str


class UnsubscribedFrame(_Frame, tag="unsubscribed"):
    """The hub ended the subscription to ``session_id`` (``null``: the registry): it could
    not read the log for a while (``code`` ``unavailable``: the database is out of reach).
    Nothing was skipped: subscribe again, after a pause, from the last event you hold. It
    may answer the subscribe request in place of its reply."""

    session_id: str | None
    code: ErrorCode
    message: str


class PresenceFrame(_Frame, tag="presence"):
    """A connection joined or left a session (sent to the session's subscribers; not part
    of the event log). A ``join`` for a connection already present replaces its entry (a
    new name or role, a stream started or ended)."""

    session_id: str
    action: Literal["join", "leave"]
    entry: PresenceEntry


class SummarizeFrame(_Frame, tag="summarize"):
    """The hub asks a worker (one that said ``summarizer: true`` in ``hello``, and, with
    auth on, whose token has ``write`` on ``session_id``) to write a summary of that
    session; the worker answers with a ``summary`` request carrying ``request_id``.
    ``session_id`` is ``null`` when the compaction did not say which session it is for
    (then only a worker with ``write`` on ``*`` is asked)."""

    request_id: str
    session_id: str | None
    prompt: str


class StreamFrame(_Frame, tag="stream"):
    """A streamed message, live (not part of the event log), to the session's subscribers.

    ``action``: ``start`` (``message`` with no parts), ``delta`` (``deltas``: the deltas
    since the previous frame, each ``{"index", "kind", "text" | "part"}``, coalesced over a
    few milliseconds so a fast stream costs each subscriber tens of frames a second, not
    thousands), ``state`` (``message`` as accumulated so far: sent to a subscriber that
    catches up while the stream runs), or ``end`` (``status``: ``finished``, ``aborted``,
    ``interrupted`` when the writer's connection died, ``stopped`` when its turn was
    stopped, or ``too_large`` when it grew past the hub's ``max_stream_bytes``; ``message``
    is what was stored).
    ``index`` counts deltas (the last one, in a ``delta`` frame): apply a delta only if its
    index is one more than what you hold.
    """

    session_id: str
    message_id: str
    action: Literal["start", "delta", "state", "end"]
    index: int
    deltas: list[dict[str, Any]] | None = None
    message: dict[str, Any] | None = None
    status: str | None = None


class TurnFrame(_Frame, tag="turn"):
    """The hub gives a turn to this responder (a connection that sent ``take_turns``):
    stream the reply with ``stream_start`` (``message_id: reply_id``, ``parent_id``,
    ``turn_id``), or answer ``turn_failed``. ``message_id`` is the message answered;
    ``history`` the branch up to ``parent_id`` (overlays applied); ``regenerates`` the
    assistant message this reply replaces, if any."""

    turn_id: str
    session_id: str
    message_id: str
    parent_id: str | None
    reply_id: str
    trigger: str
    history: list[dict[str, Any]]
    regenerates: str | None = None


class TurnStoppedFrame(_Frame, tag="turn_stopped"):
    """A turn given to this responder was stopped (``stop_turn``): stop answering it. Its
    reply, if started, was already ended by the hub as it stood (further deltas are
    refused); a turn not started must not be."""

    turn_id: str
    session_id: str
    reply_id: str
    reason: str


class ToolAnswerFrame(_Frame, tag="tool_answer"):
    """The user answered a tool of this responder's reply (``answer_tool``): an approval
    (``approval_id``, ``approved``, ``reason``) or a client tool's ``output`` /
    ``error_text``. The hub has written the answered part into the reply already."""

    turn_id: str
    session_id: str
    reply_id: str
    tool_call_id: str
    approval_id: str | None = None
    approved: bool | None = None
    reason: str | None = None
    output: Any = None
    error_text: str | None = None


class SteeringFrame(_Frame, tag="steering"):
    """A user message for this responder's turn in flight (``steer_turn``), already stored
    in the reply as a ``steering-message`` part."""

    turn_id: str
    session_id: str
    reply_id: str
    message: dict[str, Any]


class DumpFrame(_Frame, tag="dump"):
    """Lines of the dump an ``export`` request (``id``) asked for, in order, before its
    reply; a batch is bounded in bytes, well under the frame limit."""

    id: str | int
    lines: list[str]


ServerFrame = (
    ReplyFrame
    | ErrorFrame
    | EventFrame
    | ResetFrame
    | UnsubscribedFrame
    | PresenceFrame
    | SummarizeFrame
    | StreamFrame
    | TurnFrame
    | TurnStoppedFrame
    | ToolAnswerFrame
    | SteeringFrame
    | DumpFrame
)
