"""`HubCheckpointSaver`: a LangGraph checkpointer (``BaseCheckpointSaver``) whose threads
are sessionhub sessions (extra ``sessionhub[langgraph]``; docs/integrations.md, "LangGraph").

Constructed from a ``SessionManager`` (in process) or a connected ``HubClient`` (several
worker processes share threads through one hub): both offer ``.threads``, the checkpoint
operations (``hub.graphthreads.GraphThreads``, or the hub's ``checkpoint_*`` ops). The
thread id is the session id. A checkpoint is stored as LangGraph's serializer gives it
(``serde.dumps_typed``: a type tag and bytes), whole, with its metadata as JSON; each put is
an event on the session's stream, and the root namespace's ``messages`` channel is
projected into the session's tree as UI messages (:mod:`clients.lcmessages`).

The async methods are the saver's own; the sync ones (``put``, ``get_tuple``, ``list``, ...)
run them on the event loop the saver was made on, from another thread, as LangGraph's own
async savers do (called on that loop's thread they would wait for themselves: refused).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        'clients.langgraph needs the langgraph-checkpoint package: pip install "sessionhub[langgraph]"'
    ) from exc

from protocol import Conflict, InvalidInput
from protocol.graphstate import CheckpointRecord, CheckpointWrite

from .lcmessages import ui_messages

__all__ = ["HubCheckpointSaver"]

T = TypeVar("T")

#: ``list`` reads this many checkpoints per request when it has no limit of its own.
PAGE = 500
#: A put projects (converts and sends) this many of the newest messages, unless the thread's
#: tree holds none of them.
TAIL = 16


class Threads(Protocol):
    """The checkpoint operations both a ``SessionManager`` (``manager.threads``) and a
    ``HubClient`` (``hub.threads``) offer."""

    async def put(
        self,
        record: CheckpointRecord,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        partial: bool = False,
    ) -> None: ...

    async def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool = False,
    ) -> None: ...

    async def get(
        self, thread_id: str, ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointRecord | None: ...

    async def list(
        self,
        thread_id: str | None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> list[CheckpointRecord]: ...

    async def delete_thread(self, thread_id: str) -> int: ...

    async def prune(self, thread_id: str, *, keep_latest: bool) -> int: ...

    async def delete_for_runs(self, run_ids: Sequence[str]) -> int: ...

    async def copy_thread(self, source: str, target: str) -> int: ...


class _HasThreads(Protocol):
    @property
    def threads(self) -> Threads: ...


def _not_json(value: Any) -> Any:
    raise InvalidInput(f"checkpoint metadata holds a {type(value).__name__}, which is not JSON")


_to_json = msgspec.json.Encoder(enc_hook=_not_json).encode
_from_json = msgspec.json.Decoder(dict[str, Any]).decode


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    if config is None:
        return {}
    found = config.get("configurable")
    if not isinstance(found, dict):
        raise InvalidInput("config must have a 'configurable' object")
    return found


def _thread(config: RunnableConfig) -> tuple[str, str]:
    conf = _configurable(config)
    thread_id = conf.get("thread_id")
    if thread_id is None:
        raise InvalidInput("config['configurable'] must name a thread_id")
    return str(thread_id), str(conf.get("checkpoint_ns", ""))


def _stored(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}


def _is_tool(m: Any) -> bool:
    kind = m.get("role", m.get("type")) if isinstance(m, Mapping) else getattr(m, "type", None)
    return bool(kind == "tool")


def _tail(chat: list[Any]) -> list[Any] | None:
    """The conversation's last :data:`TAIL` messages, widened back to a message that is no
    tool result (so every tool result in it has its call in it too); None when the whole
    is that short, or when a message of it has no id (a dict's id is derived from the ones
    before it: only the whole conversation gives it)."""
    if len(chat) <= TAIL:
        return None
    start = len(chat) - TAIL
    while start > 0 and _is_tool(chat[start]):
        start -= 1
    tail = chat[start:]
    if not all(getattr(m, "id", None) for m in tail):
        return None
    return tail


class HubCheckpointSaver(BaseCheckpointSaver[int]):
    """LangGraph's checkpointer on sessionhub: ``HubCheckpointSaver(manager)`` or
    ``HubCheckpointSaver(hub)`` (a connected ``HubClient``)."""

    def __init__(self, target: _HasThreads, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        threads = getattr(target, "threads", None)
        if threads is None:
            raise TypeError("HubCheckpointSaver takes a SessionManager or a connected HubClient")
        self.threads: Threads = threads
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    # -- records ---------------------------------------------------------------------------
    def _tuple(self, r: CheckpointRecord) -> CheckpointTuple:
        def conf(checkpoint_id: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": r.thread_id,
                    "checkpoint_ns": r.ns,
                    "checkpoint_id": checkpoint_id,
                }
            }

        checkpoint: Checkpoint = self.serde.loads_typed((r.type, r.data))
        return CheckpointTuple(
            config=conf(r.checkpoint_id),
            checkpoint=checkpoint,
            metadata=r.metadata,  # type: ignore[arg-type]
            parent_config=None if r.parent_id is None else conf(r.parent_id),
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.type, w.value))) for w in r.writes
            ],
        )

    # -- the async saver -----------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns = _thread(config)
        found = await self.threads.get(thread_id, ns, get_checkpoint_id(config))
        return None if found is None else self._tuple(found)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        conf = _configurable(config)
        thread_id = None if conf.get("thread_id") is None else str(conf["thread_id"])
        ns = conf.get("checkpoint_ns")
        cursor = None if before is None else get_checkpoint_id(before)
        left = limit
        while left is None or left > 0:
            page = await self.threads.list(
                thread_id,
                ns=None if ns is None else str(ns),
                before=cursor,
                limit=PAGE if left is None else min(left, PAGE),
                filter=filter,
            )
            for r in page:
                yield self._tuple(r)
            if len(page) < (PAGE if left is None else min(left, PAGE)):
                return
            if left is not None:
                left -= len(page)
            cursor = page[-1].checkpoint_id
            if thread_id is None:
                # Across threads the ids interleave: one page is one listing.
                return

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns = _thread(config)
        type_, data = self.serde.dumps_typed(checkpoint)
        meta = _from_json(_to_json(get_serializable_checkpoint_metadata(config, metadata)))
        record = CheckpointRecord(
            thread_id=thread_id,
            ns=ns,
            checkpoint_id=checkpoint["id"],
            parent_id=get_checkpoint_id(config),
            type=type_,
            data=data,
            metadata=meta,
        )
        values = checkpoint.get("channel_values") or {}
        chat = values.get("messages") if ns == "" else None
        if not isinstance(chat, list):
            await self.threads.put(record)
            return _stored(thread_id, ns, checkpoint["id"])
        tail = _tail(chat)
        if tail is not None:
            # The common put: one message or two beyond what the tree holds. Only the tail
            # is converted and sent; a tree that holds none of it refuses the whole put.
            try:
                await self.threads.put(record, ui_messages(tail), partial=True)
                return _stored(thread_id, ns, checkpoint["id"])
            except Conflict:
                pass
        await self.threads.put(record, ui_messages(chat))
        return _stored(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id, ns = _thread(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id is None:
            raise InvalidInput("put_writes needs config['configurable']['checkpoint_id']")
        rows = []
        for i, (channel, value) in enumerate(writes):
            type_, data = self.serde.dumps_typed(value)
            rows.append(
                CheckpointWrite(
                    task_id=task_id,
                    idx=WRITES_IDX_MAP.get(channel, i),
                    channel=channel,
                    type=type_,
                    value=data,
                    task_path=task_path,
                )
            )
        # The special channels (errors, interrupts, ...) replace; regular writes are kept
        # once (a retried task writes the same rows again).
        replace = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        await self.threads.put_writes(thread_id, ns, checkpoint_id, rows, replace=replace)

    async def adelete_thread(self, thread_id: str) -> None:
        await self.threads.delete_thread(str(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        if run_ids:
            await self.threads.delete_for_runs([str(r) for r in run_ids])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.threads.copy_thread(str(source_thread_id), str(target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInput(f"prune strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        for thread_id in thread_ids:
            await self.threads.prune(str(thread_id), keep_latest=strategy == "keep_latest")

    # -- the sync saver: the async one, on the saver's loop --------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.loop
        problem: Exception | None = None
        if loop is None or not loop.is_running():
            problem = RuntimeError(
                "HubCheckpointSaver's sync methods run on the event loop it was made on, from "
                "another thread (make it inside a running loop); use the async methods otherwise"
            )
        else:
            try:
                mine = asyncio.get_running_loop() is loop
            except RuntimeError:
                mine = False
            if mine:
                problem = asyncio.InvalidStateError(
                    "synchronous HubCheckpointSaver calls from the saver's own event loop would "
                    "block it: use the async methods (ainvoke, astream, aget_state, ...)"
                )
        if problem is not None or loop is None:
            coro.close()  # never started: no "never awaited" warning
            raise problem or RuntimeError("no event loop")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._run(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._run(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run(self.aprune(thread_ids, strategy=strategy))
