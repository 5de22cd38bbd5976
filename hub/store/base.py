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
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, BinaryIO, Generic, Literal, TypeVar

import msgspec

from protocol import (
    Compaction,
    Event,
    Message,
    PositionLost,
    SearchResult,
    SessionInfo,
)
from protocol.graphstate import CheckpointRecord, CheckpointWrite
from protocol.markers import LATEST, Parent, ParentArg

from ..bus import Bus
from .attachments import StoredFile
from .policy import (
    COST_MAX,
    END_REASON,
    INT64_MAX,
    INT64_MIN,
    REGISTRY,
    check_limit,
    check_session_id,
    check_usage,
    session_stream,
    usage_totals,
)

__all__ = [
    "COST_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "LATEST",
    "PROMPT_LABEL",
    "REGISTRY",
    "AppendResult",
    "DumpedFile",
    "DumpedMessage",
    "LogEntry",
    "Parent",
    "ParentArg",
    "PruneResult",
    "SessionDump",
    "Store",
    "StoredFile",
    "StreamPosition",
    "WriteTx",
    "check_limit",
    "check_session_id",
    "check_usage",
    "context_key",
    "session_stream",
    "usage_totals",
]


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


class PruneResult(msgspec.Struct, kw_only=True):
    """What :meth:`Store.prune_events` removed: events, and the streams whose first seq moved."""

    events: int = 0
    streams: int = 0


class DumpedMessage(msgspec.Struct, kw_only=True):
    """A stored message row: the message, its parent's id (None: a root) and when it was
    stored (what search results report, which is not always the message's ``createdAt``)."""

    message: Message
    parent_id: str | None
    created_at: datetime


class DumpedFile(msgspec.Struct, kw_only=True):
    """A stored file a dump carries (hub/store/attachments.py): once per dump, with the
    first session that references it."""

    sha256: str
    media_type: str
    data: bytes


class SessionDump(msgspec.Struct, kw_only=True):
    """Everything a session holds except its event log: the registry row, every message of
    every branch in storage order (a parent always comes before its children), the
    overlays, and the context rows (``context``: block label -> content; the frozen prompt
    apart, in ``system_prompt``). What ``hub.dump`` writes and reads back."""

    info: SessionInfo
    messages: list[DumpedMessage]
    compactions: list[Compaction]
    context: dict[str, str]
    system_prompt: str | None = None
    #: The files its messages reference that the dump carries with it (hub/dump.py).
    files: list[DumpedFile] = msgspec.field(default_factory=list)
    #: A LangGraph thread's checkpoints (with their writes), by namespace then id.
    checkpoints: list[CheckpointRecord] = msgspec.field(default_factory=list)


#: The context row key of a session's frozen prompt (also ``SessionManager.delete``'s).
PROMPT_LABEL = "_system_prompt"


def context_key(label: str, session_id: str) -> str:
    """The ``context_blocks`` key of a session's store-backed block (or prompt)."""
    return f"{label}_{session_id}"


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


C = TypeVar("C")


class WriteTx(Generic[C]):
    """The one shape of a write transaction, on every store: its connection, one clock
    reading for everything it writes (``now``, epoch seconds), and the ``(stream, seq)``
    it logged (``notes``), rung on the bus by :meth:`ring` once the commit is done.

    Each store's subclass adds the same statements: ``emit(stream, session_id, type_,
    data)`` and ``emit_many(stream, session_id, events)`` (append to a log, return the last
    seq, note it), ``emit_session``, ``touch(session_id)`` (a managed write's check and
    ``updated_at``), ``session_row(session_id)`` and ``registry_change(info, type_,
    **extra)`` (both logs, per :func:`~hub.store.policy.registry_events`). On SQLite they
    are plain calls (the whole transaction runs as one call in the connection's thread),
    on Postgres they are awaited.
    """

    __slots__ = ("conn", "notes", "now")

    def __init__(self, conn: C) -> None:
        self.conn = conn
        self.now = time.time()
        self.notes: list[tuple[str, int]] = []

    def ring(self, bus: Bus) -> None:
        """After the commit: tell the bus what was written (never before: a subscriber
        woken early would read a log without the events)."""
        for stream, seq in self.notes:
            bus.publish(stream, seq)


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
    async def end_session(self, session_id: str, reason: str = END_REASON) -> SessionInfo:
        """Mark the session ended (``end_reason=reason``, a non-empty string of at most
        :data:`~hub.store.policy.END_REASON_MAX` characters) and log ``session.ended`` to
        its stream and the registry, like a compaction's split. Its messages stay and stay
        writable: ending is what lists show, not a lock. An ended session is
        :class:`~protocol.errors.Conflict`, nothing written."""

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
        one message carries the summary. A session that has ended already (split or not)
        is :class:`~protocol.errors.Conflict`, nothing written, as in :meth:`end_session`."""

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

    def read_events_nowait(self, stream: str, after_seq: int, limit: int) -> list[Event] | None:
        """:meth:`read_events` answered at once, without awaiting, or None when this store
        cannot (the default). A store whose reads cross a thread may answer a short read
        of a log's newest events on the calling thread: what a stream's tail asks right
        after each commit. It may return fewer than ``limit`` events before the log's end;
        the caller reads on."""
        return None

    @abc.abstractmethod
    async def stream_position(self, stream: str) -> StreamPosition: ...

    def stream_position_nowait(self, stream: str) -> StreamPosition | None:
        """:meth:`stream_position` answered at once, without awaiting, or None when this
        store cannot right now (the default): what a subscribe asks first, one row, cheaper
        on the calling thread than a trip to a store's reader thread."""
        return None

    async def current_position(self, stream: str) -> StreamPosition:
        """:meth:`stream_position`, at once when the store can answer so."""
        position = self.stream_position_nowait(stream)
        return position if position is not None else await self.stream_position(stream)

    # -- LangGraph checkpoints (protocol/graphstate.py, the rules in graphpolicy) ----------
    # A thread is a session: each change is one transaction with its event on the
    # session's stream; the bytes are stored as given, never decoded.
    @abc.abstractmethod
    async def put_checkpoint(
        self,
        record: CheckpointRecord,
        *,
        name: str,
        messages: Sequence[Message | Mapping[str, Any]] = (),
        partial: bool = False,
    ) -> bool:
        """Store (or replace) the checkpoint and log ``checkpoint.put``; the thread's first
        put registers its session (named ``name``, source ``langgraph``). ``messages`` are
        projected into its tree in the same transaction (``graphpolicy``); True if that
        appended any. ``partial``: they are the conversation's tail, and a tree that holds
        none of them is :class:`~protocol.errors.Conflict` (nothing written)."""

    @abc.abstractmethod
    async def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool,
    ) -> None:
        """Store a task's pending writes (``replace``: over the same ``(task_id, idx)``,
        else a duplicate is ignored) and log ``checkpoint.writes``."""

    @abc.abstractmethod
    async def get_checkpoint(
        self, session_id: str, ns: str, checkpoint_id: str | None
    ) -> CheckpointRecord | None:
        """That checkpoint (the namespace's newest for None) with its writes, or None."""

    @abc.abstractmethod
    async def list_checkpoints(
        self,
        session_id: str | None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> list[CheckpointRecord]:
        """Newest first, with their writes; None for the session or the namespace: all."""

    @abc.abstractmethod
    async def delete_checkpoints(self, session_id: str, *, keep_latest: bool = False) -> int:
        """Delete the thread's checkpoints and writes (``keep_latest``: all but each
        namespace's newest); how many checkpoints went."""

    @abc.abstractmethod
    async def delete_checkpoint_runs(self, run_ids: Sequence[str]) -> int:
        """Delete the checkpoints (and writes) whose metadata's ``run_id`` is listed."""

    @abc.abstractmethod
    async def copy_checkpoints(self, source: str, target: str, *, name: str) -> int:
        """Copy every checkpoint and write of ``source`` onto ``target`` (registered if
        need be), in one transaction; none when the source has none."""

    # -- retention (docs/operations.md) ----------------------------------------------------
    @abc.abstractmethod
    async def prune_events(
        self,
        *,
        older_than: datetime | None = None,
        keep_per_session: int | None = None,
        batch: int = 1000,
    ) -> PruneResult:
        """Delete the oldest events of every stream (each session's and the registry's):
        those stored before ``older_than``, and those beyond the newest ``keep_per_session``
        of their stream (either rule prunes an event). Only the log: messages, overlays and
        context stay. Each batch of at most ``batch`` events is its own short transaction
        that also moves the stream's ``first_seq``, so a reader of an older position gets
        :class:`~protocol.errors.PositionLost`, never a gap; a batch re-reads the stream
        under its write lock, so two nodes pruning at once delete each event once."""

    @abc.abstractmethod
    async def count_events(self) -> int:
        """Events held in every log (from the streams' first and last seqs: no scan)."""

    # -- files (hub/store/attachments.py, docs/files.md) ------------------------------------
    @abc.abstractmethod
    async def put_file(
        self,
        sha256: str,
        media_type: str,
        data: bytes | BinaryIO,
        *,
        subject: str | None = None,
        quota: int | None = None,
    ) -> StoredFile:
        """Store a file under its SHA-256 (checked against the bytes: InvalidInput if they
        differ), once: the same bytes again only touch it. ``subject`` (a token's) is
        recorded as an uploader, who may reference and read it. ``quota``: the bytes the
        subject's files may hold; a file new to it that would pass them is
        :class:`~.attachments.UploadQuotaExceeded`, nothing stored, judged in the
        transaction that records the upload (two at once cannot both pass)."""

    @abc.abstractmethod
    async def file_info(self, sha256: str) -> StoredFile | None: ...

    @abc.abstractmethod
    async def read_file_chunk(self, sha256: str, n: int) -> bytes | None:
        """Chunk ``n`` (:data:`~.attachments.CHUNK` bytes each) of a stored file."""

    @abc.abstractmethod
    async def file_sessions(self, sha256: str) -> list[str]:
        """The sessions whose messages reference the file."""

    @abc.abstractmethod
    async def file_uploaded_by(self, sha256: str, subject: str) -> bool: ...

    @abc.abstractmethod
    async def uploaded_bytes(self, subject: str) -> int:
        """The bytes of the stored files ``subject`` uploaded (each file once)."""

    @abc.abstractmethod
    async def session_files(self, session_id: str) -> list[str]:
        """The files the session's messages reference, by hash."""

    @abc.abstractmethod
    async def collect_files(self, older_than: datetime) -> list[str]:
        """Delete the files that no message and no event references, stored (or sent again)
        before ``older_than``; their hashes. One transaction, so a file referenced
        meanwhile either stays or fails that write."""

    # -- export and import (hub/dump.py) ---------------------------------------------------
    @abc.abstractmethod
    async def dump_session(self, session_id: str) -> SessionDump:
        """The session's contents, read in one snapshot; SessionNotFound if unregistered."""

    @abc.abstractmethod
    async def import_sessions(
        self, dumps: Sequence[SessionDump], *, replace: bool = False
    ) -> list[SessionInfo]:
        """Write dumped sessions, all in one transaction (all or nothing), with their ids,
        timestamps and usage. A registered id is :class:`~protocol.errors.Conflict` unless
        ``replace`` (then its messages, overlays and context rows are replaced); then
        nothing is written. Logs what a subscriber needs: ``session.created`` (both logs;
        on replace ``messages.cleared`` then ``session.renamed``), a ``message.appended``
        per message and a ``compaction.added`` per overlay. The dumps are taken as checked
        (``hub.dump`` checks every line before it calls this)."""

    async def import_session(self, dump: SessionDump, *, replace: bool = False) -> SessionInfo:
        """One dumped session in one transaction (:meth:`import_sessions`)."""
        return (await self.import_sessions([dump], replace=replace))[0]
