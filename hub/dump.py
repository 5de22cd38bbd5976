"""Export and import of sessions as JSON lines (``sessionhub export`` / ``import``).

A dump is one JSON object per line. The first is the header, ``{"sessionhub_dump": 1,
"sessions": N}``; then, per session, a ``session`` line (its registry row, context blocks
and frozen prompt), its ``file`` lines (each file its messages reference, once per dump: a ``file`` line with
its hash, media type and size, then ``file_data`` lines of base64, at most
:data:`FILE_LINE_BYTES` each), its ``message`` lines in storage order (every branch; a parent always
comes before its children), its ``compaction`` lines, its LangGraph ``checkpoint`` lines (a
thread's, by namespace then id, with their writes; the bytes base64), and an ``end`` line. The event log
is not exported: an import writes a fresh one (see :meth:`Store.import_sessions
<hub.store.base.Store.import_sessions>` for its events). Export, import into an empty store
and export again gives the same bytes, on either store. See docs/operations.md.

Engine level: nothing here imports the server.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, Final

import msgspec

from protocol import Compaction, InvalidInput, SessionInfo, SessionNotFound, coerce_message
from protocol.graphstate import CheckpointRecord

from .dumpcheck import check_dumps, nul_problem, time_problem, usage_problem
from .store.attachments import CHUNK, attach_files, check_sha256, has_files
from .store.base import DumpedFile, DumpedMessage, SessionDump, Store
from .store.clientwrites import WRITER
from .store.graphpolicy import check_record, check_writes

__all__ = [
    "DUMP_VERSION",
    "DumpError",
    "ImportResult",
    "dump_lines",
    "export_lines",
    "import_lines",
    "parse_dump",
    "session_lines",
]

#: The version of the format this sessionhub writes and reads.
DUMP_VERSION: Final = 1
#: The bytes of a file one ``file_data`` line carries (base64: a third more): a line fits
#: a WebSocket export's batch (hub/server/ops.py).
FILE_LINE_BYTES: Final = 96 << 10

_encode = msgspec.json.Encoder(order="deterministic").encode
_decode = msgspec.json.Decoder().decode


class DumpError(InvalidInput):
    """A dump line that cannot be imported; ``line`` is its number (from 1)."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}; nothing was written")
        self.line = line
        self.problem = problem


class ImportResult(msgspec.Struct, kw_only=True):
    sessions: list[str]
    messages: int


def _line(obj: dict[str, Any]) -> str:
    return _encode(obj).decode()


def session_lines(dump: SessionDump) -> Iterator[str]:
    """The lines of one session (without the header)."""
    sid = dump.info.id
    yield _line(
        {
            "type": "session",
            "session": msgspec.to_builtins(dump.info),
            "context": dump.context,
            "system_prompt": dump.system_prompt,
        }
    )
    for file in dump.files:
        meta = {"sha256": file.sha256, "mediaType": file.media_type, "size": len(file.data)}
        yield _line({"type": "file", "session_id": sid, **meta})
        for start in range(0, len(file.data), FILE_LINE_BYTES):
            piece = base64.b64encode(file.data[start : start + FILE_LINE_BYTES]).decode()
            yield _line({"type": "file_data", "session_id": sid, "sha256": file.sha256, "data": piece})
    for m in dump.messages:
        yield _line(
            {
                "type": "message",
                "session_id": sid,
                "parent_id": m.parent_id,
                "created_at": m.created_at.isoformat(),
                "message": m.message.to_dict(),
            }
        )
    for c in dump.compactions:
        yield _line({"type": "compaction", "session_id": sid, "compaction": msgspec.to_builtins(c)})
    for r in dump.checkpoints:
        # A LangGraph checkpoint: its bytes base64, as on the wire.
        yield _line({"type": "checkpoint", "session_id": sid, "checkpoint": msgspec.to_builtins(r)})
    yield _line({"type": "end", "session_id": sid, "messages": len(dump.messages)})


def header(count: int) -> str:
    return _line({"sessionhub_dump": DUMP_VERSION, "sessions": count})


def dump_lines(dumps: Sequence[SessionDump]) -> Iterator[str]:
    yield header(len(dumps))
    for d in dumps:
        yield from session_lines(d)


async def export_lines(store: Store, session_ids: Sequence[str] | None = None) -> AsyncIterator[str]:
    """The dump of ``session_ids`` (default: every session, oldest first), line by line
    (without newlines); one session is read at a time, each in one snapshot."""
    if session_ids:
        ids = list(dict.fromkeys(session_ids))
        for sid in ids:
            if await store.get_session(sid) is None:
                raise SessionNotFound(sid)
    else:
        infos = await store.list_sessions()
        ids = [i.id for i in sorted(infos, key=lambda i: (i.created_at, i.id))]
    yield header(len(ids))
    carried: set[str] = set()
    for sid in ids:
        dumped = await store.dump_session(sid)
        for sha in await store.session_files(sid):
            if sha not in carried:
                carried.add(sha)
                dumped.files.append(await _read_file(store, sha))
        for line in session_lines(dumped):
            yield line


async def _read_file(store: Store, sha: str) -> DumpedFile:
    info = await store.file_info(sha)
    if info is None:  # referenced, so stored: unless collected by hand meanwhile
        raise SessionNotFound(f"file {sha}")
    chunks = [await store.read_file_chunk(sha, n) for n in range(-(-info.size // CHUNK))]
    return DumpedFile(sha256=sha, media_type=info.media_type, data=b"".join(c or b"" for c in chunks))


# -- reading -------------------------------------------------------------------------------


def _field(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], n: int) -> Any:
    value = obj.get(name)
    if not isinstance(value, kind):
        raise DumpError(n, f"{name!r} is missing or not a {getattr(kind, '__name__', 'value')}")
    return value


def _time(value: object, name: str, n: int) -> datetime:
    """A dump time: ISO 8601 (or already a datetime), with a time zone, in range
    (:data:`~hub.dumpcheck.TIME_RANGE`)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise DumpError(n, f"{name!r} is not an ISO 8601 time") from None
    if not isinstance(value, datetime):
        raise DumpError(n, f"{name!r} is missing or not an ISO 8601 time")
    problem = time_problem(value, repr(name))
    if problem is not None:
        raise DumpError(n, problem)
    return value


def _texts(label: str, fields: Iterable[tuple[str, object]], n: int) -> None:
    if (problem := nul_problem(label, fields)) is not None:
        raise DumpError(n, problem)


def _session(obj: dict[str, Any], n: int) -> SessionDump:
    """A ``session`` line, every field checked as the stores will hold it."""
    try:
        info = msgspec.convert(obj.get("session"), SessionInfo)
    except msgspec.ValidationError as exc:
        raise DumpError(n, f"bad session: {exc}") from None
    if (problem := usage_problem(info)) is not None:
        raise DumpError(n, f"bad session: {problem}")
    _time(info.created_at, "session.created_at", n)
    _time(info.updated_at, "session.updated_at", n)
    context = obj.get("context") or {}
    if not isinstance(context, dict) or not all(isinstance(v, str) for v in context.values()):
        raise DumpError(n, "'context' must map block labels to strings")
    prompt = obj.get("system_prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise DumpError(n, "'system_prompt' must be a string or null")
    _texts("session", msgspec.structs.asdict(info).items(), n)
    _texts("context", [*((f"{label} (its label)", label) for label in context), *context.items()], n)
    _texts("session", [("system_prompt", prompt)], n)
    return SessionDump(info=info, messages=[], compactions=[], context=context, system_prompt=prompt)


def _checkpoint(obj: dict[str, Any], session_id: str, n: int) -> CheckpointRecord:
    try:
        record = check_record(msgspec.convert(obj.get("checkpoint"), CheckpointRecord))
        check_writes(record.writes)
    except (msgspec.ValidationError, InvalidInput) as exc:
        raise DumpError(n, f"bad checkpoint: {exc}") from None
    if record.thread_id != session_id:
        raise DumpError(n, f"checkpoint of thread {record.thread_id!r} inside session {session_id!r}")
    return record


class _Reader:
    """Builds sessions line by line, checking each as it comes: a dump that reads to its end
    holds nothing a store would refuse, so writing it cannot fail half way on its content."""

    def __init__(self) -> None:
        self.n = 0
        self.header = False
        self.current: SessionDump | None = None
        self.ids: set[str] = set()
        self.compaction_ids: set[str] = set()
        #: Every session id read so far, and its line: a second copy would conflict with
        #: the first inside the one transaction.
        self.sessions: dict[str, int] = {}
        self.done: list[SessionDump] = []
        #: The file being read: hash, media type, size, the bytes so far; its line.
        self.file: tuple[str, str, int, bytearray] | None = None
        self.file_line = 0

    def feed(self, raw: str | bytes) -> SessionDump | None:
        """One line; returns a session once its ``end`` line is read."""
        self.n += 1
        try:
            return self._feed(raw, self.n)
        except RecursionError:
            # msgspec bounds nesting by the interpreter's recursion limit; left to
            # propagate, this ended the socket with 1006 and the CLI with a traceback.
            raise DumpError(self.n, "nested too deeply to decode") from None

    def _feed(self, raw: str | bytes, n: int) -> SessionDump | None:
        text = raw.strip()
        if not text:
            raise DumpError(n, "empty line")
        try:
            obj = _decode(text)
        except msgspec.ValidationError as exc:  # JSON, but a number no double or int holds
            raise DumpError(n, f"a number out of range ({exc})") from None
        except msgspec.DecodeError as exc:
            raise DumpError(n, f"not JSON ({exc})") from None
        except UnicodeEncodeError as exc:  # a str line holding a lone surrogate
            raise DumpError(n, f"text that is not valid Unicode ({exc.reason})") from None
        if not isinstance(obj, dict):
            raise DumpError(n, "not a JSON object")
        if not self.header:
            version = obj.get("sessionhub_dump")
            if version is None:
                raise DumpError(
                    n, 'not a sessionhub dump (the first line must be {"sessionhub_dump": 1, ...})'
                )
            if version != DUMP_VERSION:
                raise DumpError(n, f"dump version {version!r}; this sessionhub reads version {DUMP_VERSION}")
            self.header = True
            return None
        kind = obj.get("type")
        if kind == "session":
            if self.current is not None:
                raise DumpError(n, f"session {self.current.info.id!r} has no end line")
            self.current = _session(obj, n)
            sid = self.current.info.id
            if sid in self.sessions:
                raise DumpError(
                    n, f"session {sid!r} is in the dump twice (first at line {self.sessions[sid]})"
                )
            self.sessions[sid] = n
            self.ids = set()
            self.compaction_ids = set()
            return None
        current = self.current
        if current is None:
            raise DumpError(n, f"a {kind!r} line outside a session")
        if obj.get("session_id") != current.info.id:
            raise DumpError(n, f"session_id {obj.get('session_id')!r} inside session {current.info.id!r}")
        if kind == "message":
            self._message(obj, current, n)
            return None
        if kind == "file":
            self._file(obj, current, n)
            return None
        if kind == "file_data":
            self._file_data(obj, n)
            return None
        self._file_done(n)
        if kind == "compaction":
            try:
                c = msgspec.convert(obj.get("compaction"), Compaction)
            except msgspec.ValidationError as exc:
                raise DumpError(n, f"bad compaction: {exc}") from None
            _time(c.created_at, "compaction.created_at", n)
            _texts("compaction", msgspec.structs.asdict(c).items(), n)
            if c.id in self.compaction_ids:
                raise DumpError(n, f"compaction {c.id!r} appears twice")
            self.compaction_ids.add(c.id)
            current.compactions.append(c)
            return None
        if kind == "checkpoint":
            current.checkpoints.append(_checkpoint(obj, current.info.id, n))
            return None
        if kind == "end":
            count = obj.get("messages")
            if count is not None and count != len(current.messages):
                raise DumpError(
                    n, f"the end line counts {count} messages, the session has {len(current.messages)}"
                )
            self.current = None
            return current
        raise DumpError(n, f"unknown line type {kind!r}")

    def _file(self, obj: dict[str, Any], current: SessionDump, n: int) -> None:
        self._file_done(n)
        sha = _field(obj, "sha256", str, n)
        try:
            check_sha256(sha)
        except InvalidInput as exc:
            raise DumpError(n, str(exc)) from None
        media = _field(obj, "mediaType", str, n)
        size = _field(obj, "size", int, n)
        if size < 0:
            raise DumpError(n, "'size' is negative")
        self.file = (sha, media, size, bytearray())
        self.file_line = n
        current.files.append(DumpedFile(sha256=sha, media_type=media, data=b""))

    def _file_data(self, obj: dict[str, Any], n: int) -> None:
        if self.file is None or obj.get("sha256") != self.file[0]:
            raise DumpError(n, "a file_data line that follows no file line of its file")
        try:
            self.file[3].extend(base64.b64decode(_field(obj, "data", str, n), validate=True))
        except (binascii.Error, ValueError):
            raise DumpError(n, "'data' is not base64") from None
        if len(self.file[3]) > self.file[2]:
            raise DumpError(n, f"file {self.file[0]} holds more than its {self.file[2]} bytes")

    def _file_done(self, n: int) -> None:
        """The file being read, complete and true to its hash (checked before what follows)."""
        if self.file is None or self.current is None:
            return
        sha, media, size, data = self.file
        self.file = None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise DumpError(self.file_line, f"file {sha}: its data lines do not hold its {size} bytes")
        self.current.files[-1] = DumpedFile(sha256=sha, media_type=media, data=bytes(data))

    def _message(self, obj: dict[str, Any], current: SessionDump, n: int) -> None:
        self._file_done(n)
        raw_message = obj.get("message")
        if not isinstance(raw_message, dict):
            raise DumpError(n, "'message' is missing or not an object")
        try:
            message = coerce_message(raw_message)
        except InvalidInput as exc:  # InvalidMessage names the field
            raise DumpError(n, f"bad message: {exc}") from None
        parent = obj.get("parent_id")
        if parent is not None and (not isinstance(parent, str) or parent not in self.ids):
            raise DumpError(n, f"parent {parent!r} of message {message.id!r} is not an earlier message")
        if message.id in self.ids:
            raise DumpError(n, f"message {message.id!r} appears twice")
        _texts("message", [("id", message.id)], n)
        at = _time(_field(obj, "created_at", str, n), "created_at", n)
        self.ids.add(message.id)
        current.messages.append(DumpedMessage(message=message, parent_id=parent, created_at=at))

    def finish(self) -> None:
        if not self.header:
            raise DumpError(self.n + 1, "the dump is empty (no header line)")
        if self.current is not None:
            raise DumpError(self.n + 1, f"the dump ends inside session {self.current.info.id!r} (truncated?)")


def parse_dump(lines: Iterable[str | bytes]) -> list[SessionDump]:
    """Every session of a dump, checked whole before anything is written: a bad line raises
    :class:`DumpError` with its number."""
    reader = _Reader()
    out = []
    for raw in lines:
        done = reader.feed(raw)
        if done is not None:
            out.append(done)
    reader.finish()
    return out


async def import_lines(store: Store, lines: Iterable[str | bytes], *, replace: bool = False) -> ImportResult:
    """Import a dump, all or nothing: the whole input is checked first (a bad line:
    :class:`DumpError`, nothing written), then every session is written in one transaction.
    A session already stored is :class:`~protocol.errors.Conflict` unless ``replace``, and
    then nothing of the dump is written either."""
    dumps = parse_dump(lines)
    return await import_dumps(store, dumps, replace=replace)


async def import_dumps(store: Store, dumps: Sequence[SessionDump], *, replace: bool = False) -> ImportResult:
    """Write sessions in one transaction of ``store``, all or nothing, after
    :func:`check_dumps` (the dumps of :func:`parse_dump` pass it; those built elsewhere are
    checked the same way)."""
    check_dumps(dumps)
    # The files first, each once (content-addressed: one already stored is only touched);
    # the messages' references to them are then checked in the import's transaction.
    for file in {f.sha256: f for d in dumps for f in d.files}.values():
        await store.put_file(file.sha256, file.media_type, file.data)
    await _attach(store, dumps)
    stored = await store.import_sessions(dumps, replace=replace)
    return ImportResult(sessions=[i.id for i in stored], messages=sum(len(d.messages) for d in dumps))


async def _attach(store: Store, dumps: Sequence[SessionDump]) -> None:
    """Inline ``data:`` file parts (a UIMessage array, a dump written by hand) stored and
    referenced as an append does it, and every reference checked to be stored; an import is
    an admin's, so no reference is refused for its reader (the writer is trusted)."""
    token = WRITER.set(None)
    try:
        for d in dumps:
            given = [m.message for m in d.messages]
            if has_files(given):
                attached = await attach_files(store, given)
                d.messages = [
                    msgspec.structs.replace(m, message=a) for m, a in zip(d.messages, attached, strict=True)
                ]
    finally:
        WRITER.reset(token)


# -- other formats -------------------------------------------------------------------------
def _utc(text: object) -> datetime:
    from datetime import UTC

    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            at = datetime.fromisoformat(text)
            return at if at.tzinfo else at.replace(tzinfo=UTC)
    return datetime.now(UTC)


def from_ui_messages(data: bytes | str, session_id: str, name: str | None = None) -> SessionDump:
    """One session holding a JSON array of AI SDK ``UIMessage`` objects, as one chain in
    array order (each message's parent is the one before it)."""
    from datetime import UTC

    try:
        items = _decode(data)
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"not JSON ({exc})") from None
    if not isinstance(items, list):
        raise InvalidInput("expected a JSON array of UIMessage objects")
    now = datetime.now(UTC)
    messages: list[DumpedMessage] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInput(f"message {i}: not an object")
        try:
            message = coerce_message(item)
        except InvalidInput as exc:
            raise InvalidInput(f"message {i}: {exc}") from None
        if message.id in seen:
            raise InvalidInput(f"message {i}: id {message.id!r} appears twice")
        seen.add(message.id)
        parent = messages[-1].message.id if messages else None
        at = message.created_at or now
        if (problem := time_problem(at, "'createdAt'")) is not None:
            raise InvalidInput(f"message {i}: {problem}")
        messages.append(DumpedMessage(message=message, parent_id=parent, created_at=at))
    info = SessionInfo(
        id=session_id, name=name or session_id, source="ui-messages", created_at=now, updated_at=now
    )
    return SessionDump(info=info, messages=messages, compactions=[], context={})
