"""LangGraph checkpoint put and get: sessionhub's ``HubCheckpointSaver`` (in process, on
the SQLite and Postgres stores) beside LangGraph's own ``AsyncSqliteSaver`` and
``AsyncPostgresSaver``, in the same run, on the same checkpoints.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_langgraph.py [--puts 200] [--runs 3] [--store sqlite|postgres|both]
                                              [--dsn DSN] [--json]

A thread grows as a chat does: put ``i`` holds ``i`` LangChain messages in its ``messages``
channel (one new each put, alternately human and AI, ~200 characters), with its metadata,
its parent and the new channel version. ``put`` is the awaited ``aput`` (for the hub: the
checkpoint, its ``checkpoint.put`` event and the projection of the new message into the
session's tree); ``get`` is ``aget_tuple`` of the thread's latest checkpoint, after the
puts. Each figure is the median latency of a run; the run's figures are printed, and the
median over the runs. Needs the ``bench`` extra (``langgraph-checkpoint-sqlite``,
``langgraph-checkpoint-postgres``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint  # noqa: E402
from langgraph.checkpoint.base.id import uuid6  # noqa: E402

from clients.langgraph import HubCheckpointSaver  # noqa: E402
from hub import PostgresStore, SessionManager, SqliteStore  # noqa: E402
from tests.support.nodes import scratch_database  # noqa: E402

Saver = BaseCheckpointSaver[Any]
DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TEXT = (
    "The deployment plan: blue/green behind the load balancer, a canary of five percent, then the rest. " * 2
)


def _messages(n: int) -> list[BaseMessage]:
    return [(HumanMessage if i % 2 == 0 else AIMessage)(content=f"{i}: {TEXT}", id=f"m{i}") for i in range(n)]


def _checkpoint(i: int) -> Checkpoint:
    return Checkpoint(
        v=1,
        id=str(uuid6(clock_seq=i)),
        ts=datetime.now(UTC).isoformat(),
        channel_values={"messages": _messages(i + 1)},
        channel_versions={"messages": i + 1},
        versions_seen={"agent": {"messages": i}},
        updated_channels=["messages"],
    )


async def _measure(saver: Saver, thread: str, puts: int) -> dict[str, float]:
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    put_times: list[float] = []
    for i in range(puts):
        cp = _checkpoint(i)
        t0 = time.perf_counter()
        config = await saver.aput(
            config, cp, {"source": "loop", "step": i, "parents": {}}, {"messages": i + 1}
        )
        put_times.append(time.perf_counter() - t0)
    latest: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    get_times: list[float] = []
    for _ in range(puts):
        t0 = time.perf_counter()
        found = await saver.aget_tuple(latest)
        get_times.append(time.perf_counter() - t0)
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == puts
    return {
        "put_ms": round(statistics.median(put_times) * 1000, 3),
        "get_ms": round(statistics.median(get_times) * 1000, 3),
    }


@asynccontextmanager
async def _hub_sqlite(tmp: Path) -> AsyncIterator[Saver]:
    async with await SqliteStore.open(tmp / "hub.db") as store:
        yield HubCheckpointSaver(SessionManager(store))


@asynccontextmanager
async def _lg_sqlite(tmp: Path) -> AsyncIterator[Saver]:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(str(tmp / "langgraph.db")) as saver:
        await saver.setup()
        yield saver


def _hub_postgres(dsn: str) -> Callable[[Path], AbstractAsyncContextManager[Saver]]:
    @asynccontextmanager
    async def make(tmp: Path) -> AsyncIterator[Saver]:
        async with scratch_database(dsn, "bench_lg") as db:
            store = await PostgresStore.connect(db, min_size=1, max_size=4)
            try:
                yield HubCheckpointSaver(SessionManager(store))
            finally:
                await store.close()

    return make


def _lg_postgres(dsn: str) -> Callable[[Path], AbstractAsyncContextManager[Saver]]:
    @asynccontextmanager
    async def make(tmp: Path) -> AsyncIterator[Saver]:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with scratch_database(dsn, "bench_lg") as db, AsyncPostgresSaver.from_conn_string(db) as saver:
            await saver.setup()
            yield saver

    return make


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--puts", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--dsn", default=DSN)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    savers: dict[str, Callable[[Path], AbstractAsyncContextManager[Saver]]] = {}
    if args.store in ("sqlite", "both"):
        savers |= {"hub sqlite": _hub_sqlite, "AsyncSqliteSaver": _lg_sqlite}
    if args.store in ("postgres", "both"):
        savers |= {"hub postgres": _hub_postgres(args.dsn), "AsyncPostgresSaver": _lg_postgres(args.dsn)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in savers}
    for run in range(args.runs):
        for name, make in savers.items():  # interleaved: the VM's swings hit every saver alike
            with tempfile.TemporaryDirectory() as tmp:
                async with make(Path(tmp)) as saver:
                    runs[name].append(await _measure(saver, f"bench-{run}", args.puts))
    out: dict[str, dict[str, Any]] = {
        name: {
            "runs": figures,
            "put_ms": statistics.median(f["put_ms"] for f in figures),
            "get_ms": statistics.median(f["get_ms"] for f in figures),
        }
        for name, figures in runs.items()
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(
        f"{args.puts} puts then {args.puts} gets of a growing chat thread, {args.runs} runs (median of runs)"
    )
    print(f"{'saver':<20} {'put ms':>8} {'get ms':>8}   runs (put/get)")
    for name, figures in out.items():
        each = ", ".join(f"{f['put_ms']}/{f['get_ms']}" for f in runs[name])
        print(f"{name:<20} {figures['put_ms']:>8} {figures['get_ms']:>8}   {each}")


if __name__ == "__main__":
    asyncio.run(main())
