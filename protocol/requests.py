"""Client → server: the requests, one tagged union (:data:`Request`, tagged by ``op``).

Each request has a client-chosen ``id`` that its reply echoes. Messages travel as Vercel AI
SDK ``UIMessage`` dicts; records as JSON objects with the field names of
:mod:`protocol.records`. ``parent_id`` left out means "the latest leaf", ``null`` means "a
new root". What each op may touch and how its session is found is :mod:`protocol.ops`';
:mod:`protocol.frames` names every struct of both directions.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .graphstate import CheckpointRecord, CheckpointWrite

__all__ = ["REQUEST_TYPES", "Msg", "ParentId", "Request"]

Msg = dict[str, Any]
ParentId = str | None | UnsetType


class _Req(msgspec.Struct, tag_field="op", kw_only=True, forbid_unknown_fields=True):
    id: str | int


# -- sessions registry and messages (SessionManager) -------------------------------------


class Create(_Req, tag="create"):
    name: str
    parent_session_id: str | None = None
    model: str | None = None
    source: str | None = None
    #: One of the hub's session templates (docs/configuration.md); None: its default.
    template: str | None = None


class Get(_Req, tag="get"):
    session_id: str


class List(_Req, tag="list"):
    pass


class Rename(_Req, tag="rename"):
    session_id: str
    name: str


class Delete(_Req, tag="delete"):
    session_id: str


class End(_Req, tag="end"):
    """Mark the session ended (``end_reason``); the reply is the ended session."""

    session_id: str
    reason: str = "ended"


class Append(_Req, tag="append"):
    session_id: str
    message: Msg
    parent_id: ParentId = UNSET


class Upsert(_Req, tag="upsert"):
    session_id: str
    message: Msg
    parent_id: ParentId = UNSET


class AppendAll(_Req, tag="append_all"):
    session_id: str
    messages: list[Msg]
    parent_id: ParentId = UNSET


class GetHistory(_Req, tag="get_history"):
    session_id: str
    leaf_id: str | None = None


class GetBranches(_Req, tag="get_branches"):
    session_id: str
    message_id: str


class GetMessageCount(_Req, tag="get_message_count"):
    session_id: str


class ClearMessages(_Req, tag="clear_messages"):
    session_id: str


class DeleteMessages(_Req, tag="delete_messages"):
    session_id: str
    ids: list[str]


class Fork(_Req, tag="fork"):
    session_id: str
    at_message_id: str
    name: str


class AddCompaction(_Req, tag="add_compaction"):
    session_id: str
    summary: str
    from_id: str
    to_id: str


class GetCompactions(_Req, tag="get_compactions"):
    session_id: str


class CompactAndSplit(_Req, tag="compact_and_split"):
    session_id: str
    summary: str
    name: str | None = None


class AddUsage(_Req, tag="add_usage"):
    session_id: str
    input_tokens: int
    output_tokens: int
    cost: float


class Search(_Req, tag="search"):
    query: str
    limit: int = 20


# -- one session (Session) ---------------------------------------------------------------


class GetMessage(_Req, tag="get_message"):
    session_id: str
    message_id: str


class GetLatestLeaf(_Req, tag="get_latest_leaf"):
    session_id: str


class GetPathLength(_Req, tag="get_path_length"):
    session_id: str
    leaf_id: str | None = None


class UpdateMessage(_Req, tag="update_message"):
    session_id: str
    message: Msg


class SessionSearch(_Req, tag="session_search"):
    session_id: str
    query: str
    limit: int = 20


class GetContextBlocks(_Req, tag="get_context_blocks"):
    session_id: str


class GetContextBlock(_Req, tag="get_context_block"):
    session_id: str
    label: str


class ReplaceContextBlock(_Req, tag="replace_context_block"):
    session_id: str
    label: str
    content: str


class AppendContextBlock(_Req, tag="append_context_block"):
    session_id: str
    label: str
    content: str


class FreezeSystemPrompt(_Req, tag="freeze_system_prompt"):
    session_id: str


class RefreshSystemPrompt(_Req, tag="refresh_system_prompt"):
    session_id: str


class Tools(_Req, tag="tools"):
    """The session's tools (``session_id``), or the manager's (``session_id: null``)."""

    session_id: str | None


class RunTool(_Req, tag="run_tool"):
    session_id: str | None
    name: str
    arguments: Msg | str = msgspec.field(default_factory=dict)


class Compact(_Req, tag="compact"):
    session_id: str
    leaf_id: str | None = None


class EstimateTokens(_Req, tag="estimate_tokens"):
    """The token estimate compaction decisions use (``Session.estimate_tokens``)."""

    session_id: str
    leaf_id: str | None = None


# -- event logs (one read, not a subscription) ---------------------------------------------


class ReadEvents(_Req, tag="read_events"):
    """At most ``limit`` logged events of the session (``session_id``) or of the registry
    (``null``) after ``after_seq``, oldest first: ``Session.read_events`` /
    ``SessionManager.read_registry_events``. A position the log cannot serve is
    ``not_found`` with the position's ``detail`` (the clients raise ``PositionLost``)."""

    session_id: str | None
    after_seq: int = 0
    limit: int = 1000


class PruneEvents(_Req, tag="prune_events"):
    """``SessionManager.prune_events``: ``older_than`` is an age in seconds or an
    ISO-8601 time (naive: UTC). Answered with ``{"events", "streams"}``."""

    older_than: float | datetime | None = None
    keep_per_session: int | None = None
    batch: int = 1000


# -- subscriptions -----------------------------------------------------------------------


class Subscribe(_Req, tag="subscribe"):
    """Every event of the session (``session_id``) or of the registry (``null``) after
    ``after_seq``, then live. ``epoch``: the epoch the position belongs to, if known."""

    session_id: str | None
    after_seq: int = 0
    epoch: str | None = None
    #: Also send ``presence`` frames (who joins and leaves the session). Off by default:
    #: with n subscribers that is n frames per arrival.
    presence: bool = False


class Unsubscribe(_Req, tag="unsubscribe"):
    session_id: str | None


class Ping(_Req, tag="ping"):
    pass


class Hello(_Req, tag="hello"):
    """Who this connection is (shown in presence), and the sessions it is on besides the
    ones it subscribes to. Answered with ``{"connection_id": ...}``."""

    name: str | None = None
    role: str | None = None
    sessions: list[str] = msgspec.field(default_factory=list)
    #: This connection can write summaries: the hub may send it ``summarize`` frames.
    summarizer: bool = False


class Auth(_Req, tag="auth"):
    """Present a new token on this connection (renewal before ``exp``, or a first token).
    A token that verifies replaces the connection's grant, and the subscriptions it no
    longer covers end: the reply is ``{"sub", "exp", "ended": [session id or null]}``. A
    token that does not verify is ``forbidden`` and the previous grant stays."""

    token: str


class Summary(_Req, tag="summary"):
    """A worker's answer to a ``summarize`` frame: the summary, or why there is none."""

    request_id: str
    summary: str | None = None
    error: str | None = None


class StreamStart(_Req, tag="stream_start"):
    """Start streaming a message: it is stored at once (with no parts) and grows as deltas
    arrive. Answered with ``{"index": 0}``."""

    session_id: str
    message_id: str
    role: str = "assistant"
    parent_id: ParentId = UNSET
    metadata: Any = None
    #: The turn this message answers (from a ``turn`` frame): only the connection the turn
    #: was given to may start it, with the turn's ``reply_id`` and ``parent_id``.
    turn_id: str | None = None


class StreamDelta(_Req, tag="stream_delta"):
    """One piece of a streamed message: ``kind`` ``text`` or ``reasoning`` with ``text``
    (appended to the last part of that kind), ``tool`` with a whole tool ``part``
    (replacing the part with the same ``toolCallId``), ``part`` with any other part
    (appended), ``reset`` (the current step's parts dropped) or ``await`` (no change: the
    writer waits for the user's answer to a tool; :mod:`protocol.deltas`). Answered with
    its ``index``."""

    session_id: str
    message_id: str
    kind: Literal["text", "reasoning", "tool", "part", "reset", "await"]
    text: str | None = None
    part: dict[str, Any] | None = None


class StreamEnd(_Req, tag="stream_end"):
    """Finish (``status: finished``, the default) or abort a streamed message."""

    session_id: str
    message_id: str
    status: Literal["finished", "aborted"] = "finished"


class Presence(_Req, tag="presence"):
    """Who is on a session: a list of :class:`~protocol.records.PresenceEntry`
    (``{"connection_id", "name", "role", "streaming"}``)."""

    session_id: str


class TakeTurns(_Req, tag="take_turns"):
    """This connection answers turns: the hub may send it ``turn`` frames, each for a
    session its token can write. Answered with ``null``."""


class StartTurn(_Req, tag="start_turn"):
    """Ask for an assistant reply to ``message_id`` (default: the latest leaf) from a
    connected responder. A user message is answered (the reply is its child); an assistant
    message is regenerated (the reply is its sibling). ``leaf_id`` is an alias of
    ``message_id``. Answered with ``{"turn_id", "reply_id", "parent_id", "trigger"}``."""

    session_id: str
    message_id: str | None = None
    leaf_id: str | None = None
    trigger: Literal["submit-message", "regenerate-message"] | None = None


class GetTurn(_Req, tag="get_turn"):
    """The session's turn in flight: ``{"turn_id", "reply_id", "message_id", "trigger",
    "started"}``, or ``null`` (what a chat reconnecting after a reload asks first)."""

    session_id: str


class TurnFailed(_Req, tag="turn_failed"):
    """A responder cannot answer the turn it was given: the turn ends with ``error``
    (a reply it already streams should then be ended with ``aborted``)."""

    turn_id: str
    error: str


class StopTurn(_Req, tag="stop_turn"):
    """Stop the session's turn in flight (``turn_id``: that one, which must be in flight),
    on whichever node it runs: its reply ends as it stands (stream status ``stopped``), its
    responder gets a ``turn_stopped`` frame, and ``turn.ended`` says ``status: stopped``
    with ``reason``. Answered with ``{"turn_id", "reply_id", "started"}``; ``not_found``
    when no such turn is in flight."""

    session_id: str
    turn_id: str | None = None
    reason: str = "stopped by request"


class AnswerTool(_Req, tag="answer_tool"):
    """The user's answer to a tool of the reply the session's turn is streaming: an
    approval (``approval_id`` of a tool part in state ``approval-requested``, with
    ``approved`` and ``reason``) or a client-side tool's result (``tool_call_id`` of a part
    in state ``input-available``, with ``output`` or ``error_text``). The hub checks that it
    is pending and unanswered, writes the answered part into the reply, and sends the
    turn's responder a ``tool_answer`` frame. Answered with ``{"turn_id", "reply_id",
    "tool_call_id"}``; ``not_found`` when nothing of that id is pending, ``conflict`` when it
    was answered already."""

    session_id: str
    approval_id: str | None = None
    approved: bool | None = None
    reason: str | None = None
    tool_call_id: str | None = None
    output: Any = None
    error_text: str | None = None


class SteerTurn(_Req, tag="steer_turn"):
    """A user ``message`` (a ``UIMessage`` of role ``user``) for the turn in flight, not a
    new turn: it is stored in the reply as a ``steering-message`` part (the AI SDK's own)
    and sent to the turn's responder as a ``steering`` frame. Answered with ``{"turn_id",
    "reply_id"}``; ``not_found`` when no turn is streaming in the session."""

    session_id: str
    message: Msg
    turn_id: str | None = None


# -- export and import (admin on ``*``; docs/protocol.md) -----------------------------------


class Export(_Req, tag="export"):
    """The dump of ``session_ids`` (default: every session), as ``dump`` frames of lines
    (each well under the frame limit), then the reply ``{sessions, lines}``."""

    session_ids: list[str] | None = None


class Import(_Req, tag="import"):
    """One chunk of a dump, in order: the hub checks each line as it comes and holds the
    sessions read so far; ``final`` writes them (``replace``: over sessions already
    stored) and replies ``{sessions, messages}``; a chunk before it replies ``{lines}``, the
    lines read so far. A refusal (a bad line, too large) ends the import: nothing written."""

    lines: list[str]
    final: bool = False
    replace: bool = False


# -- LangGraph checkpoints (clients.langgraph; the session is the thread) -------------------


class CheckpointPut(_Req, tag="checkpoint_put"):
    """Store a checkpoint (``checkpoint.thread_id`` is ``session_id``; the first put
    registers the session) and project ``messages`` (UIMessages, oldest first) into its
    tree; the reply is null."""

    session_id: str
    checkpoint: CheckpointRecord
    messages: list[Msg] | None = None
    #: ``messages`` is the conversation's tail: refused (``conflict``, nothing written) when
    #: the tree holds none of it, and the client sends the whole conversation.
    partial: bool = False


class CheckpointWrites(_Req, tag="checkpoint_writes"):
    session_id: str
    ns: str
    checkpoint_id: str
    writes: list[CheckpointWrite]
    replace: bool = False


class CheckpointGet(_Req, tag="checkpoint_get"):
    """The checkpoint with its writes (the namespace's newest without an id), or null."""

    session_id: str
    ns: str = ""
    checkpoint_id: str | None = None


class CheckpointList(_Req, tag="checkpoint_list"):
    """Newest first; ``session_id`` null: every thread (read on ``*``)."""

    session_id: str | None = None
    ns: str | None = None
    before: str | None = None
    limit: int | None = None
    filter: dict[str, Any] | None = None


class CheckpointDelete(_Req, tag="checkpoint_delete"):
    """Delete the thread's checkpoints and writes (its session and messages stay)."""

    session_id: str


class CheckpointPrune(_Req, tag="checkpoint_prune"):
    """``keep_latest``: all but each namespace's newest checkpoint; else all of them."""

    session_id: str
    keep_latest: bool = True


class CheckpointDeleteRuns(_Req, tag="checkpoint_delete_runs"):
    """Delete the checkpoints of these runs, in every thread (write on ``*``)."""

    run_ids: list[str]


Request = (
    Create
    | Get
    | List
    | Rename
    | Delete
    | End
    | Append
    | Upsert
    | AppendAll
    | GetHistory
    | GetBranches
    | GetMessageCount
    | ClearMessages
    | DeleteMessages
    | Fork
    | AddCompaction
    | GetCompactions
    | CompactAndSplit
    | AddUsage
    | Search
    | GetMessage
    | GetLatestLeaf
    | GetPathLength
    | UpdateMessage
    | SessionSearch
    | GetContextBlocks
    | GetContextBlock
    | ReplaceContextBlock
    | AppendContextBlock
    | FreezeSystemPrompt
    | RefreshSystemPrompt
    | Tools
    | RunTool
    | Compact
    | EstimateTokens
    | ReadEvents
    | PruneEvents
    | Subscribe
    | Unsubscribe
    | Ping
    | Hello
    | Presence
    | Summary
    | Auth
    | StreamStart
    | StreamDelta
    | StreamEnd
    | TakeTurns
    | StartTurn
    | GetTurn
    | TurnFailed
    | StopTurn
    | AnswerTool
    | SteerTurn
    | Export
    | Import
    | CheckpointPut
    | CheckpointWrites
    | CheckpointGet
    | CheckpointList
    | CheckpointDelete
    | CheckpointPrune
    | CheckpointDeleteRuns
)

REQUEST_TYPES: dict[str, type[_Req]] = {str(t.__struct_config__.tag): t for t in Request.__args__}
