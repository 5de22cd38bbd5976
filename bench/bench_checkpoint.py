"""Commit latency across WAL checkpoints: large appends on a file-backed SqliteStore.

Prints figures, never asserts timings. Run from the repository root:

    .venv/bin/python bench/bench_checkpoint.py [--n 3000] [--size 65536] [--writers 1]
                                               [--readers 1] [--json]

``--writers`` tasks each append ``--n / --writers`` messages of ``--size`` bytes of text
(one chain per writer, each append awaited), long enough to cross many checkpoints, while
``--readers`` tasks read the latest message every 10 ms, as a subscriber following the
session does (a reader snapshot can hold a checkpoint back). It prints the p50 / p99 /
p99.9 / max latency of one awaited append, the throughput, and the WAL file's peak size
(sampled after every append and by a 5 ms poller).
The store is opened with its defaults (``synchronous=NORMAL``). The database lives in a
temporary directory deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hub import Session, SqliteStore


def pct(sorted_ms: Sequence[float], q: float) -> float:
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


async def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    db = tmp / "bench.db"
    wal = Path(f"{db}-wal")
    rng = random.Random(7)
    # Words, so FTS indexes the text as it would a real message (a realistic page count).
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(2000)]
    texts = []
    for _ in range(64):
        out: list[str] = []
        length = 0
        while length < args.size:
            w = rng.choice(words)
            out.append(w)
            length += len(w) + 1
        texts.append(" ".join(out)[: args.size])

    latencies: list[float] = []
    peak = 0
    done = asyncio.Event()

    def sample() -> None:
        nonlocal peak
        with contextlib.suppress(FileNotFoundError):
            peak = max(peak, os.stat(wal).st_size)

    async def poll() -> None:
        while not done.is_set():
            sample()
            await asyncio.sleep(0.005)

    async with await SqliteStore.open(db) as store:
        per_writer = args.n // args.writers

        async def writer(w: int) -> None:
            session = Session(store, session_id=f"s{w}")
            for i in range(per_writer):
                message = {
                    "id": f"m{i}",
                    "role": "user",
                    "parts": [{"type": "text", "text": texts[(i + w) % len(texts)]}],
                }
                t0 = time.perf_counter()
                await session.append_message(message)
                latencies.append((time.perf_counter() - t0) * 1000)
                sample()
                # A hub serves other requests between two appends: let other tasks run.
                await asyncio.sleep(0)

        reads = 0

        async def reader(r: int) -> None:
            nonlocal reads
            session = Session(store, session_id=f"s{r % args.writers}")
            while not done.is_set():
                await session.get_latest_leaf()
                reads += 1
                await asyncio.sleep(0.01)

        poller = asyncio.create_task(poll())
        readers = [asyncio.create_task(reader(r)) for r in range(args.readers)]
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(args.writers)))
        elapsed = time.perf_counter() - t0
        done.set()
        await asyncio.gather(poller, *readers)
        # Checkpointer counters (absent on stores from before the background checkpointer).
        checkpointer = getattr(store, "_checkpointer", None)
        passes = getattr(checkpointer, "passes", None)
        catch_ups = getattr(checkpointer, "catch_ups", None)
    db_size = os.stat(db).st_size
    lat = sorted(latencies)
    return {
        "appends": len(lat),
        "size": args.size,
        "writers": args.writers,
        "readers": args.readers,
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "p999_ms": round(pct(lat, 0.999), 2),
        "max_ms": round(lat[-1], 2),
        "appends_per_s": round(len(lat) / elapsed),
        "wal_peak_mib": round(peak / 2**20, 1),
        "db_mib": round(db_size / 2**20, 1),
        "reads": reads,
        "over_10ms": sum(1 for x in lat if x > 10),
        "passes": passes,
        "catch_ups": catch_ups,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="appends in all (default 3000)")
    p.add_argument("--size", type=int, default=65536, help="bytes of text per message (default 65536)")
    p.add_argument("--writers", type=int, default=1, help="concurrent writer tasks (default 1)")
    p.add_argument("--readers", type=int, default=1, help="concurrent reader tasks (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sessionhub-ckpt-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    cores = os.cpu_count()
    result["machine"] = (
        f"{platform.system()} {platform.machine()}, {cores} cores, Python {platform.python_version()}"
    )

    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
