"""Write latency of a steady writer with and without a concurrent prune of a large log.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_retention.py [--events 1000000] [--seconds 10]
                                              [--store sqlite|postgres|both] [--dsn DSN] [--json]

Per store: one session's log is filled with ``--events`` events (written straight into the
``events`` and ``streams`` tables, in one transaction: the bench measures the prune, not the
filling). Then a writer appends one message at a time to another session (one awaited
``append``, the write path of a chat turn), first alone for ``--seconds``, then while
``SessionManager.prune_events(keep_per_session=1000)`` (batches of 1000 events, each its own
transaction) prunes the big log down to its last 1000 events. For both runs: appends/s and
the latency percentiles of the appends; for the prune: its duration and events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.support.nodes import scratch_database  # noqa: E402 - after the checkout is on sys.path

KEEP = 1000


def _text(i: int) -> dict[str, Any]:
    return {"id": f"w{i}", "role": "user", "parts": [{"type": "text", "text": f"steady write number {i}"}]}


def _percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1] * 1000, 2)}


async def _write_while(manager: Any, sid: str, start: int, done: asyncio.Event | float) -> dict[str, Any]:
    """Append one message at a time until ``done`` is set (or for that many seconds)."""
    latencies: list[float] = []
    began = time.perf_counter()
    i = start
    while True:
        if isinstance(done, asyncio.Event) and done.is_set():
            break
        if isinstance(done, float) and time.perf_counter() - began >= done:
            break
        t0 = time.perf_counter()
        await manager.append(sid, _text(i))
        latencies.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - began
    return {"appends": len(latencies), "appends_per_s": round(len(latencies) / elapsed, 1)} | _percentiles(
        latencies
    )


async def _measure(manager: Any, events: int, seconds: float) -> dict[str, Any]:
    writer = (await manager.create("writer")).id
    await manager.append(writer, _text(0))  # the session's first write (its stream row) is not timed
    alone = await _write_while(manager, writer, 1, float(seconds))
    done = asyncio.Event()

    async def prune() -> tuple[float, int]:
        t0 = time.perf_counter()
        try:
            result = await manager.prune_events(keep_per_session=KEEP)
        finally:
            done.set()
        return time.perf_counter() - t0, result.events

    prune_task = asyncio.create_task(prune())
    during = await _write_while(manager, writer, 10_000_000, done)
    took, pruned = await prune_task
    return {
        "events": events,
        "alone": alone,
        "during_prune": during,
        "prune_s": round(took, 1),
        "pruned": pruned,
        "pruned_per_s": round(pruned / took),
    }


def _fill_sqlite(path: Path, stream: str, _session_id: str, events: int) -> None:
    conn = sqlite3.connect(path)
    try:
        now = time.time()
        data = json.dumps({"label": "memory", "content": "x" * 40})
        with conn:
            # The log is replaced whole (its session.created event too): seqs 1..events.
            # The stream exists (the session was created through the store): its key is sk.
            conn.execute("UPDATE streams SET first_seq = 1, last_seq = ? WHERE stream = ?", (events, stream))
            (sk,) = conn.execute("SELECT sk FROM streams WHERE stream = ?", (stream,)).fetchone()
            conn.execute("DELETE FROM events WHERE sk = ?", (sk,))
            # session_id NULL: an event of the session's own log (hub/store/sqlite/tx.py).
            conn.executemany(
                "INSERT INTO events (sk, seq, session_id, type, data, created_at) "
                "VALUES (?, ?, NULL, ?, ?, ?)",
                ((sk, seq, "context.replaced", data, now) for seq in range(1, events + 1)),
            )
    finally:
        conn.close()


def _wal_mb(path: Path) -> float:
    wal = Path(str(path) + "-wal")
    return round(wal.stat().st_size / 2**20, 1) if wal.exists() else 0.0


async def sqlite_retention(events: int, seconds: float) -> dict[str, Any]:
    from hub import SessionManager, SqliteStore, session_stream

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hub.db"
        async with await SqliteStore.open(path) as store:
            big = (await SessionManager(store).create("big log")).id
        t0 = time.perf_counter()
        await asyncio.to_thread(_fill_sqlite, path, session_stream(big), big, events)
        filled = time.perf_counter() - t0
        async with await SqliteStore.open(path) as store:
            peak = 0.0

            async def sample() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, _wal_mb(path))
                    await asyncio.sleep(0.05)

            sampler = asyncio.create_task(sample())
            try:
                out = await _measure(SessionManager(store), events, seconds)
            finally:
                sampler.cancel()
            out["wal_mb_after"] = _wal_mb(path)
            out["wal_mb_peak"] = peak
    return {"store": "sqlite", "fill_s": round(filled, 1)} | out


async def postgres_retention(events: int, seconds: float, dsn: str) -> dict[str, Any]:
    import asyncpg

    from hub import PostgresStore, SessionManager, session_stream

    async with scratch_database(dsn, "sessionhub_retention") as target:
        store = await PostgresStore.connect(target, notify=False)
        try:
            big = (await SessionManager(store).create("big log")).id
            stream = session_stream(big)
            t0 = time.perf_counter()
            conn = await asyncpg.connect(target)
            try:
                now = datetime.now(UTC)
                data = json.dumps({"label": "memory", "content": "x" * 40})
                async with conn.transaction():
                    key = await conn.fetchval(
                        "INSERT INTO streams (stream, epoch, first_seq, last_seq) "
                        "VALUES ($1, 'bench', 1, $2) "
                        "ON CONFLICT (stream) DO UPDATE SET first_seq = 1, last_seq = excluded.last_seq "
                        "RETURNING key",
                        stream,
                        events,
                    )
                    await conn.execute("DELETE FROM events WHERE stream_key = $1", key)
                    # session_id NULL: the session whose stream it is (the store's own form).
                    await conn.copy_records_to_table(
                        "events",
                        records=(
                            (key, seq, None, "context.replaced", data, now) for seq in range(1, events + 1)
                        ),
                        columns=["stream_key", "seq", "session_id", "type", "data", "created_at"],
                    )
                await conn.execute("VACUUM ANALYZE events")
            finally:
                await conn.close()
            filled = time.perf_counter() - t0
            out = await _measure(SessionManager(store), events, seconds)
        finally:
            await store.close()
    return {"store": "postgres", "fill_s": round(filled, 1)} | out


def show(r: dict[str, Any]) -> None:
    print(
        f"{r['store']}: {r['events']:,} events (filled in {r['fill_s']} s); "
        f"prune to the last {KEEP}: {r['prune_s']} s, {r['pruned_per_s']:,} events/s"
    )
    for label in ("alone", "during_prune"):
        w = r[label]
        print(
            f"  writer {label:>12}: {w['appends_per_s']:>7} appends/s  p50 {w['p50_ms']} ms  "
            f"p99 {w['p99_ms']} ms  max {w['max_ms']} ms  ({w['appends']} appends)"
        )
    if "wal_mb_after" in r:
        print(
            f"  the -wal file after the prune: {r['wal_mb_after']} MB, "
            f"its peak (sampled every 50 ms): {r['wal_mb_peak']} MB"
        )
    a, d = r["alone"], r["during_prune"]
    print(f"  p99 during the prune / alone: {d['p99_ms'] / a['p99_ms']:.2f}")


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000, help="events in the big log (default 1000000)")
    p.add_argument("--seconds", type=float, default=10.0, help="the writer's run alone (default 10)")
    p.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument(
        "--dsn",
        default=os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = p.parse_args(argv)
    results = []
    if args.store in ("sqlite", "both"):
        results.append(await sqlite_retention(args.events, args.seconds))
        show(results[-1])
    if args.store in ("postgres", "both"):
        results.append(await postgres_retention(args.events, args.seconds, args.dsn))
        show(results[-1])
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
