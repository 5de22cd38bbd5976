"""The op table: what each request runs. One entry per request type, one dispatch.

The reader hands every frame to :func:`receive`; the connection's protocol state refuses
what cannot run (the hub is draining, a malformed frame, a request the token does not
allow: :class:`protocol.serverconn.ServerConnection`) and :func:`receive` calls
``ops[request type](connection, request)`` for the rest, in the reader, in the order the
frames came. Three kinds of entry:

- engine ops (:func:`engine`, the table's bulk): a call on the :class:`~hub.SessionManager`
  or a session, run in a task of its own, timed (``sessionhub_op_seconds``), its result
  converted to wire data (:func:`hub.server.wire.wire`);
- connection ops run in a task (:func:`local`): ``hello``, ``presence``, the stream ops,
  ``take_turns`` and ``turn_failed`` (:mod:`.turndispatch`);
- connection ops that change the connection's state at once, so that the frames read
  after them see it: ``subscribe``, ``unsubscribe`` (:mod:`.subscriptions`), ``auth``
  (the connection's protocol state renews its grant: :mod:`protocol.serverconn`),
  ``summary``, and each ``import`` chunk (checked in the order read).

``export`` streams ``dump`` frames through the connection's outbox (a slow reader holds
the export back, as it does any reply) before its reply.

Adding an op: docs/architecture.md, "Where to add an op".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from protocol import Event, Forbidden, InvalidInput, PresenceEntry, SessionHubError, SessionNotFound
from protocol import frames as f
from protocol.serverconn import Refused

from .. import dump
from ..manager import SessionManager
from ..session import Session
from ..store.base import PruneResult, SessionDump, Store, session_stream
from ..store.clientwrites import WRITER, Writer
from ..tools import Tool, dispatch
from .ports import Sessions
from .socket_shell import Connection
from .subscriptions import subscribe, unsubscribe
from .turndispatch import Turns
from .wire import error_frame, parent_arg, wire

__all__ = [
    "DUMP_BATCH_BYTES",
    "IMPORT_MAX_BYTES",
    "READ_EVENTS_MAX",
    "Op",
    "engine",
    "local",
    "operations",
    "receive",
]

log = logging.getLogger("sessionhub.server")

#: A handler: called in the reader with the connection and the decoded request.
Op = Callable[[Connection, Any], None]
#: An engine call: the request in, the result (any engine value) out.
Call = Callable[[Any], Awaitable[Any]]


def receive(ops: Mapping[str, Op], connection: Connection, data: str) -> None:
    """One text frame read from the socket: hand it to its op, unless the connection's
    protocol state refused it (the shell has sent the refusal)."""
    parsed = connection.read(data)
    if isinstance(parsed, Refused):
        pending = connection.dump_import
        if parsed.frame.code == "too_large" and isinstance(pending, _Import) and not pending.writing:
            # A frame too large to read may have been the import's next chunk: the dump
            # cannot go on whole, so the import ends (nothing was written) rather than
            # taking the next import's lines as its continuation.
            connection.end_import()
        return
    ops[str(type(parsed).__struct_config__.tag)](connection, parsed)


def engine(op: str, call: Call) -> Op:
    """The handler of an engine op: ``call`` runs in a task; its result is the reply."""

    def handle(connection: Connection, request: Any) -> None:
        connection.spawn(_run(connection, op, call, request))

    return handle


async def _run(connection: Connection, op: str, call: Call, request: Any) -> None:
    started = time.perf_counter()
    _writing(connection)
    try:
        result = await call(request)
        frame: Any = f.ReplyFrame(id=request.id, result=wire(result))
    except SessionHubError as exc:
        frame = error_frame(request.id, exc)
    except Exception:
        log.exception("op %s failed", op)
        frame = f.ErrorFrame(id=request.id, code="internal", message="internal error; nothing was changed")
    finally:
        connection.hub.metrics.op_seconds.labels(op).observe(time.perf_counter() - started)
    await connection.send(frame)


def _writing(connection: Connection) -> None:
    """The op's task is the writer the engine checks its messages for (clientwrites.py):
    an engine op's, and a connection op's (a streamed file part is checked for it)."""
    config = connection.hub.config
    reserved = frozenset(config.reserved_metadata_keys)
    quota = config.max_upload_bytes_per_token
    WRITER.set(Writer(config.auth_secret is not None, connection.grant, reserved, quota))


def local(call: Callable[[Connection, Any], Awaitable[Any]]) -> Op:
    """The handler of a connection op run in a task: ``call(connection, request)``'s
    result is the reply; an engine refusal is the error frame."""

    async def run(connection: Connection, request: Any) -> None:
        _writing(connection)
        try:
            frame: Any = f.ReplyFrame(id=request.id, result=await call(connection, request))
        except SessionHubError as exc:
            frame = error_frame(request.id, exc)
        await connection.send(frame)

    def handle(connection: Connection, request: Any) -> None:
        connection.spawn(run(connection, request))

    return handle


# -- connection ops --------------------------------------------------------------------------


async def hello(connection: Connection, request: f.Hello) -> dict[str, Any]:
    """Who this connection is, and the sessions it is on without subscribing."""
    return connection.hello(request)


async def present(connection: Connection, request: f.Presence) -> list[PresenceEntry]:
    return connection.hub.presence.present(request.session_id)


async def stream_start(connection: Connection, request: f.StreamStart) -> dict[str, Any]:
    # Through turns: a stream naming a turn claims it first (only its responder may).
    return await connection.hub.turns.start_stream(connection, request)


async def stream_delta(connection: Connection, request: f.StreamDelta) -> int:
    return await connection.hub.streams.delta(connection, request)


async def stream_end(connection: Connection, request: f.StreamEnd) -> None:
    await connection.hub.streams.end(connection, request, request.status)


async def take_turns(connection: Connection, request: f.TakeTurns) -> None:
    """The connection answers turns from now on."""
    connection.hub.turns.serve(connection)


async def turn_failed(connection: Connection, request: f.TurnFailed) -> None:
    """A responder cannot answer the turn it was given."""
    connection.hub.turns.refused(connection, request)


def summary(connection: Connection, request: f.Summary) -> None:
    """A worker's answer to a summary prompt (:mod:`hub.server.workers`)."""
    workers = connection.hub.worker_summarizer
    try:
        answered = workers is not None and workers.answer(connection, request)
    except Forbidden:  # asked, but its token no longer allows it
        connection.spawn(connection.send(f.ErrorFrame(id=request.id, code="forbidden", message="forbidden")))
        return
    if answered:
        connection.spawn(connection.send(f.ReplyFrame(id=request.id, result=None)))
    else:
        message = "no summary was asked of this connection with that request_id"
        connection.spawn(connection.send(f.ErrorFrame(id=request.id, code="not_found", message=message)))


# -- export and import (admin on ``*``) -----------------------------------------------------

#: Bytes of dump lines in one ``dump`` frame (at most, and at most a quarter of the frame
#: limit): a line longer than that goes alone.
DUMP_BATCH_BYTES = 256 << 10
#: Bytes of dump lines one connection may hold for an import in progress; past it the
#: import is refused ``too_large`` (a bigger dump goes through ``sessionhub import``).
IMPORT_MAX_BYTES = 64 << 20


async def export(connection: Connection, request: f.Export, store: Store) -> None:
    started = time.perf_counter()
    budget = min(DUMP_BATCH_BYTES, connection.hub.config.max_frame_bytes // 4)
    batch: list[str] = []
    size = lines = 0
    sessions = 0
    try:
        async for line in dump.export_lines(store, request.session_ids):
            cost = len(line.encode()) + 3  # quotes and a comma
            if batch and size + cost > budget:
                # send() waits for room in the outbox: a slow reader slows the export down.
                await connection.send(f.DumpFrame(id=request.id, lines=batch))
                batch, size = [], 0
            batch.append(line)
            size += cost
            lines += 1
            if lines == 1:  # the header: {"sessionhub_dump": 1, "sessions": N}
                sessions = msgspec.json.decode(line)["sessions"]
        if batch:
            await connection.send(f.DumpFrame(id=request.id, lines=batch))
        frame: Any = f.ReplyFrame(id=request.id, result={"sessions": sessions, "lines": lines})
    except SessionHubError as exc:
        frame = error_frame(request.id, exc)
    except Exception:
        log.exception("op export failed")
        frame = f.ErrorFrame(id=request.id, code="internal", message="internal error; the export stopped")
    finally:
        connection.hub.metrics.op_seconds.labels("export").observe(time.perf_counter() - started)
    await connection.send(frame)


class _Import:
    """An import in progress on one connection: the sessions read so far, checked."""

    def __init__(self) -> None:
        self.reader = dump._Reader()
        self.dumps: list[SessionDump] = []
        self.bytes = 0
        self.writing = False


def import_chunk(connection: Connection, request: f.Import, manager: SessionManager) -> None:
    """One chunk, read in the reader so that chunks are checked in the order they came."""

    def refuse(frame: f.ErrorFrame) -> None:
        connection.end_import()  # a refusal ends the import: nothing was written
        connection.spawn(connection.send(frame))

    state = connection.dump_import
    if isinstance(state, _Import) and state.writing:
        message = "an import is being written on this connection; wait for its reply"
        connection.spawn(connection.send(f.ErrorFrame(id=request.id, code="conflict", message=message)))
        return
    if not isinstance(state, _Import):
        state = _Import()
        connection.begin_import(state)
    state.bytes += sum(len(line.encode()) for line in request.lines)
    if state.bytes > IMPORT_MAX_BYTES:
        message = (
            f"the import holds over {IMPORT_MAX_BYTES} bytes of lines; nothing was written "
            "(import a dump this large with sessionhub import)"
        )
        refuse(f.ErrorFrame(id=request.id, code="too_large", message=message))
        return
    try:
        for line in request.lines:
            done = state.reader.feed(line)
            if done is not None:
                state.dumps.append(done)
        if request.final:
            state.reader.finish()
    except dump.DumpError as exc:
        refuse(error_frame(request.id, exc))
        return
    except Exception:
        # The reader runs in the socket's loop: anything escaping it would drop the
        # connection without an answer (as a 5,000-deep line did). Nothing is written yet.
        log.exception("op import failed reading line %d", state.reader.n)
        refuse(f.ErrorFrame(id=request.id, code="internal", message="internal error; nothing was written"))
        return
    if not request.final:
        connection.spawn(connection.send(f.ReplyFrame(id=request.id, result={"lines": state.reader.n})))
        return
    state.writing = True
    connection.spawn(_write_import(connection, request, manager, state))


async def _write_import(
    connection: Connection, request: f.Import, manager: SessionManager, state: _Import
) -> None:
    started = time.perf_counter()
    try:
        done = await dump.import_dumps(manager.store, state.dumps, replace=request.replace)
        for sid in done.sessions:  # a replaced session's cached context is stale
            manager._sessions.pop(sid, None)
        frame: Any = f.ReplyFrame(id=request.id, result=msgspec.to_builtins(done))
    except SessionHubError as exc:
        frame = error_frame(request.id, exc)
    except Exception:
        log.exception("op import failed")
        frame = f.ErrorFrame(id=request.id, code="internal", message="internal error; the import stopped")
    finally:
        connection.end_import(state)
        connection.hub.metrics.op_seconds.labels("import").observe(time.perf_counter() - started)
    await connection.send(frame)


# -- event logs ------------------------------------------------------------------------------

#: The most events one ``read_events`` reply carries: a bigger read would be one reply of
#: many megabytes in the connection's outbox (read on from the last seq instead).
READ_EVENTS_MAX = 10_000


async def read_events(manager: SessionManager, request: f.ReadEvents) -> list[Event]:
    if request.limit > READ_EVENTS_MAX:
        raise InvalidInput(f"limit must be at most {READ_EVENTS_MAX} over the socket, got {request.limit}")
    if request.session_id is None:
        return await manager.read_registry_events(request.after_seq, request.limit)
    if await manager.get(request.session_id) is not None:
        return await manager.get_session(request.session_id).read_events(request.after_seq, request.limit)
    # A deleted session's log keeps its final session.deleted, which subscribe serves too.
    stream = session_stream(request.session_id)
    if (await manager.store.stream_position(stream)).last_seq == 0:
        raise SessionNotFound(request.session_id)
    return await manager.store.read_events(stream, request.after_seq, request.limit)


def _age(older_than: float | datetime | None) -> datetime | timedelta | None:
    if older_than is None or isinstance(older_than, datetime):
        return older_than
    if not older_than > 0:
        raise InvalidInput(f"older_than must be more than 0 seconds, got {older_than}")
    try:
        return timedelta(seconds=older_than)
    except OverflowError:
        raise InvalidInput(f"older_than of {older_than} seconds is too long") from None


async def prune_events(manager: SessionManager, request: f.PruneEvents) -> PruneResult:
    return await manager.prune_events(
        older_than=_age(request.older_than), keep_per_session=request.keep_per_session, batch=request.batch
    )


# -- the table -------------------------------------------------------------------------------


def operations(hub: Sessions, turns: Turns) -> dict[str, Op]:
    """Every request type's handler, and nothing else (assertions, and
    tests/project/test_ops_declared.py, keep the table exact)."""
    m = hub.manager

    async def session_op(request: Any) -> Session:
        return await hub.session(request.session_id)

    async def tools(r: f.Tools) -> list[Tool]:
        return m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()

    async def run_tool(r: f.RunTool) -> str:
        available = m.tools() if r.session_id is None else await (await hub.session(r.session_id)).tools()
        return await dispatch(available, r.name, r.arguments)

    async def ping(r: f.Ping) -> str:
        return "pong"

    async def get_turn(r: f.GetTurn) -> dict[str, Any] | None:
        await hub.session(r.session_id)
        return turns.describe(turns.in_flight(r.session_id))

    async def start_turn(r: f.StartTurn) -> dict[str, Any] | None:
        return turns.describe(await turns.start(r.session_id, r.message_id or r.leaf_id, r.trigger))

    async def stop_turn(r: f.StopTurn) -> dict[str, Any]:
        await hub.session(r.session_id)
        return await turns.stop(r.session_id, r.turn_id, r.reason)

    async def answer_tool(r: f.AnswerTool) -> dict[str, Any]:
        await hub.session(r.session_id)
        return await turns.answer_tool(r)

    async def steer_turn(r: f.SteerTurn) -> dict[str, Any]:
        await hub.session(r.session_id)
        return await turns.steer(r)

    async def checkpoint_put(r: f.CheckpointPut) -> None:
        if r.checkpoint.thread_id != r.session_id:
            raise InvalidInput("checkpoint.thread_id must be the request's session_id")
        await m.threads.put(r.checkpoint, r.messages, partial=r.partial)

    t = m.threads
    calls: dict[str, Call] = {
        "checkpoint_put": checkpoint_put,
        "checkpoint_writes": lambda r: t.put_writes(
            r.session_id, r.ns, r.checkpoint_id, r.writes, replace=r.replace
        ),
        "checkpoint_get": lambda r: t.get(r.session_id, r.ns, r.checkpoint_id),
        "checkpoint_list": lambda r: t.list(
            r.session_id, ns=r.ns, before=r.before, limit=r.limit, filter=r.filter
        ),
        "checkpoint_delete": lambda r: t.delete_thread(r.session_id),
        "checkpoint_prune": lambda r: t.prune(r.session_id, keep_latest=r.keep_latest),
        "checkpoint_delete_runs": lambda r: t.delete_for_runs(r.run_ids),
        "create": lambda r: m.create(r.name, r.parent_session_id, r.model, r.source, r.template),
        "get": lambda r: m.get(r.session_id),
        "list": lambda r: m.list(),
        "rename": lambda r: m.rename(r.session_id, r.name),
        "delete": lambda r: m.delete(r.session_id),
        "end": lambda r: m.end(r.session_id, r.reason),
        "append": lambda r: m.append(r.session_id, r.message, parent_arg(r.parent_id)),
        "upsert": lambda r: m.upsert(r.session_id, r.message, parent_arg(r.parent_id)),
        "append_all": lambda r: m.append_all(r.session_id, r.messages, parent_arg(r.parent_id)),
        "get_history": lambda r: m.get_history(r.session_id, r.leaf_id),
        "get_branches": lambda r: m.get_branches(r.session_id, r.message_id),
        "get_message_count": lambda r: m.get_message_count(r.session_id),
        "clear_messages": lambda r: m.clear_messages(r.session_id),
        "delete_messages": lambda r: m.delete_messages(r.session_id, r.ids),
        "fork": lambda r: m.fork(r.session_id, r.at_message_id, r.name),
        "add_compaction": lambda r: m.add_compaction(r.session_id, r.summary, r.from_id, r.to_id),
        "get_compactions": lambda r: m.get_compactions(r.session_id),
        "compact_and_split": lambda r: m.compact_and_split(r.session_id, r.summary, r.name),
        "add_usage": lambda r: m.add_usage(r.session_id, r.input_tokens, r.output_tokens, r.cost),
        "search": lambda r: m.search(r.query, r.limit),
        "read_events": lambda r: read_events(m, r),
        "prune_events": lambda r: prune_events(m, r),
        "tools": tools,
        "run_tool": run_tool,
        "ping": ping,
        "start_turn": start_turn,
        "get_turn": get_turn,
        "stop_turn": stop_turn,
        "answer_tool": answer_tool,
        "steer_turn": steer_turn,
    }

    def on_session(name: str, call: Callable[[Session, Any], Awaitable[Any]]) -> None:
        async def run(r: Any) -> Any:
            return await call(await session_op(r), r)

        calls[name] = run

    on_session("get_message", lambda s, r: s.get_message(r.message_id))
    on_session("get_latest_leaf", lambda s, r: s.get_latest_leaf())
    on_session("get_path_length", lambda s, r: s.get_path_length(r.leaf_id))
    on_session("update_message", lambda s, r: s.update_message(r.message))
    on_session("session_search", lambda s, r: s.search(r.query, r.limit))
    on_session("get_context_blocks", lambda s, r: s.get_context_blocks())
    on_session("get_context_block", lambda s, r: s.get_context_block(r.label))
    on_session("replace_context_block", lambda s, r: s.replace_context_block(r.label, r.content))
    on_session("append_context_block", lambda s, r: s.append_context_block(r.label, r.content))
    on_session("freeze_system_prompt", lambda s, r: s.freeze_system_prompt())
    on_session("refresh_system_prompt", lambda s, r: s.refresh_system_prompt())

    async def compact(s: Session, r: Any) -> Any:
        if not m.can_compact:  # said for an operator, not as the engine's builder hint
            raise InvalidInput(
                "this hub has no summarizer, so it cannot compact: serve it with --summarizer workers, "
                "--summarizer-url URL --summarizer-model MODEL, or [compaction] in sessionhub.toml"
            )
        return await s.compact(r.leaf_id)

    on_session("compact", compact)
    on_session("estimate_tokens", lambda s, r: s.estimate_tokens(r.leaf_id))
    ops: dict[str, Op] = {name: engine(name, call) for name, call in calls.items()}
    ops |= {
        "subscribe": subscribe,
        "unsubscribe": unsubscribe,
        "auth": Connection.renew,
        "summary": summary,
        "hello": local(hello),
        "presence": local(present),
        "stream_start": local(stream_start),
        "stream_delta": local(stream_delta),
        "stream_end": local(stream_end),
        "take_turns": local(take_turns),
        "turn_failed": local(turn_failed),
        "export": lambda c, r: c.spawn(export(c, r, m.store)),
        "import": lambda c, r: import_chunk(c, r, m),
    }
    missing, stray = set(f.REQUEST_TYPES) - set(ops), set(ops) - set(f.REQUEST_TYPES)
    assert not missing, f"ops without a handler: {missing}"
    assert not stray, f"handlers without a request type: {stray}"  # a request renamed
    return ops
