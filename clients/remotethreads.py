"""`RemoteThreads`: LangGraph threads through the hub (``hub.threads``; the ``checkpoint_*``
ops), the same methods as the engine's ``manager.threads``, for
``clients.langgraph.HubCheckpointSaver(hub)``. The bytes travel base64 in the JSON frames.
A copy is a list of the source and puts on the target, so the hub checks the token's read
on the one and write on the other as for any op."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import msgspec

from protocol.graphstate import CheckpointRecord, CheckpointWrite

__all__ = ["RemoteThreads"]

_records = msgspec.convert
#: A list (and a copy) reads this many checkpoints per request.
LIST_PAGE = 50


class _Requester(Protocol):
    async def request(self, op: str, **fields: Any) -> Any: ...


class RemoteThreads:
    def __init__(self, client: _Requester) -> None:
        self._client = client

    async def put(
        self,
        record: CheckpointRecord,
        messages: Sequence[Mapping[str, Any]] | None = None,
        *,
        partial: bool = False,
    ) -> None:
        await self._client.request(
            "checkpoint_put",
            session_id=record.thread_id,
            checkpoint=msgspec.to_builtins(record),
            messages=None if messages is None else [dict(m) for m in messages],
            partial=partial,
        )

    async def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[CheckpointWrite],
        *,
        replace: bool = False,
    ) -> None:
        if writes:
            await self._client.request(
                "checkpoint_writes",
                session_id=thread_id,
                ns=ns,
                checkpoint_id=checkpoint_id,
                writes=msgspec.to_builtins(list(writes)),
                replace=replace,
            )

    async def get(
        self, thread_id: str, ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointRecord | None:
        data = await self._client.request(
            "checkpoint_get", session_id=thread_id, ns=ns, checkpoint_id=checkpoint_id
        )
        return None if data is None else _records(data, CheckpointRecord)

    async def list(
        self,
        thread_id: str | None,
        *,
        ns: str | None = None,
        before: str | None = None,
        limit: int | None = None,
        filter: Mapping[str, Any] | None = None,
    ) -> builtins.list[CheckpointRecord]:
        """Pages of :data:`LIST_PAGE` (each checkpoint holds the thread's whole state: a
        reply stays well under the frame limit), newest first, up to ``limit``."""
        out: builtins.list[CheckpointRecord] = []
        while limit is None or len(out) < limit:
            want = LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(out))
            data = await self._client.request(
                "checkpoint_list",
                session_id=thread_id,
                ns=ns,
                before=before,
                limit=want,
                filter=None if filter is None else dict(filter),
            )
            page = _records(data, builtins.list[CheckpointRecord])
            out += page
            if len(page) < want or thread_id is None:
                # Across threads, ids copied from one thread to another repeat: a cursor
                # could skip one, so that listing is one page.
                break
            before = page[-1].checkpoint_id
        return out

    async def delete_thread(self, thread_id: str) -> int:
        return int(await self._client.request("checkpoint_delete", session_id=thread_id))

    async def prune(self, thread_id: str, *, keep_latest: bool) -> int:
        return int(
            await self._client.request("checkpoint_prune", session_id=thread_id, keep_latest=keep_latest)
        )

    async def delete_for_runs(self, run_ids: Sequence[str]) -> int:
        return int(await self._client.request("checkpoint_delete_runs", run_ids=list(run_ids)))

    async def copy_thread(self, source: str, target: str) -> int:
        # Every namespace, oldest first, so the target's newest is the source's newest.
        found = await self.list(source)
        for r in reversed(found):
            copy = msgspec.structs.replace(r, thread_id=target, writes=[])
            await self.put(copy)
            by_task: dict[tuple[str, bool], builtins.list[CheckpointWrite]] = {}
            for w in r.writes:
                by_task.setdefault((w.task_id, w.idx < 0), []).append(w)
            for (_, special), writes in by_task.items():
                await self.put_writes(target, r.ns, r.checkpoint_id, writes, replace=special)
        return len(found)
