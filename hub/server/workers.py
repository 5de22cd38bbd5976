"""Summaries written by connected workers instead of an LLM endpoint the hub calls itself.

A worker connection says ``summarizer: true`` in its ``hello``. A :class:`WorkerSummarizer`
handed to ``create_app(worker_summarizer=...)`` and used as a session's summarizer
(``create_compact_function(summarizer)``) sends each summary prompt to one such worker, in
turn, and returns its answer. No worker, a timeout, a worker error or a worker that
disconnects is a :class:`~protocol.errors.SummarizerError` (so the compaction fails with an
``error`` event) — never a hang.

A prompt carries a session's history, and its answer becomes that session's overlay: with
auth on, it goes only to a worker whose token has ``write`` on that session (on ``*`` when
the compaction does not say which session; see :data:`hub.compaction.summarizing_session`),
and only the worker asked may answer, while its token still allows it.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass

from protocol import frames as f
from protocol.errors import Forbidden, SummarizerError

from ..compaction import summarizing_session
from .ports import ConnectionRegistry, Peer

__all__ = ["WorkerSummarizer"]


@dataclass
class _Pending:
    worker: Peer
    session_id: str | None
    future: asyncio.Future[str]


class WorkerSummarizer:
    """A summarizer (``await summarizer(prompt) -> str``) backed by the hub's workers."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._peers: ConnectionRegistry | None = None
        self._pending: dict[str, _Pending] = {}
        self._turn = itertools.count()

    def attach(self, peers: ConnectionRegistry) -> None:
        self._peers = peers

    def _workers(self) -> list[Peer]:
        if self._peers is None:
            return []
        return sorted(
            (c for c in self._peers.connections if c.summarizer and not c.closed),
            key=lambda c: c.connection_id,
        )

    async def __call__(self, prompt: str, *, session_id: str | None = None) -> str:
        """The summary of ``prompt``, a summary prompt about ``session_id`` (default: the
        session being compacted, :data:`hub.compaction.summarizing_session`)."""
        if session_id is None:
            session_id = summarizing_session.get()
        connected = self._workers()
        if not connected:
            raise SummarizerError("no connected worker can summarize")
        workers = [c for c in connected if c.may_summarize(session_id)]
        if not workers:
            raise SummarizerError(
                "no connected worker may summarize this session (a summarizer's token needs write on it)"
            )
        worker = workers[next(self._turn) % len(workers)]
        request_id = uuid.uuid4().hex
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = _Pending(worker, session_id, future)
        label = worker.name or worker.connection_id
        try:
            await worker.send(f.SummarizeFrame(request_id=request_id, session_id=session_id, prompt=prompt))
            async with asyncio.timeout(self.timeout):
                return await future
        except TimeoutError:
            raise SummarizerError(f"worker {label} did not answer within {self.timeout:g}s") from None
        except SummarizerError:
            raise
        except Exception as exc:  # the worker was evicted while we sent
            raise SummarizerError(f"worker {label} could not be reached: {exc!r}") from None
        finally:
            self._pending.pop(request_id, None)

    def answer(self, worker: Peer, request: f.Summary) -> bool:
        """A worker's answer; False if it answers nothing this worker was asked. Raises
        :class:`Forbidden` (and fails the compaction) when the worker's token no longer
        allows it to summarize the session (expired, or renewed with less)."""
        pending = self._pending.get(request.request_id)
        if pending is None or pending.worker is not worker:
            return False
        label = worker.name or worker.connection_id
        if not worker.may_summarize(pending.session_id):
            if not pending.future.done():
                pending.future.set_exception(
                    SummarizerError(f"worker {label} may no longer summarize this session")
                )
            raise Forbidden("forbidden")
        if not pending.future.done():
            if request.error is not None or request.summary is None:
                pending.future.set_exception(
                    SummarizerError(f"worker {label} failed: {request.error or 'no summary'}")
                )
            else:
                pending.future.set_result(request.summary)
        return True

    def connection_lost(self, worker: Peer) -> None:
        for pending in list(self._pending.values()):
            if pending.worker is worker and not pending.future.done():
                label = worker.name or worker.connection_id
                pending.future.set_exception(SummarizerError(f"worker {label} disconnected"))

    def __repr__(self) -> str:
        return f"WorkerSummarizer(timeout={self.timeout})"
