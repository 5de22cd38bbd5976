"""Cross-node delivery latency: a write on hub node A, delivered to a subscriber on node B.

Prints figures, never asserts timings. Run from the repository root (Postgres, and Redis
for ``--bus redis``, must be running)::

    .venv/bin/python bench/bench_nodes.py [--rate 100] [--seconds 20] [--sessions 10]
                                          [--bus postgres --bus redis] [--json]

Two ``sessionhub serve`` processes share a scratch Postgres database (created and dropped
here). A writer on A appends ``--rate`` messages a second, round-robin over ``--sessions``
sessions, each append awaited; one subscriber per session on B (and, as the same-node
baseline, one on A) records when each event arrives. Latency is measured from just before
the append request is sent to the arrival of its event, in this one process, so both ends
read the same clock. The target (issue 8) is p99 <= 50 ms at 100 appends/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clients import HubClient
from tests.support.nodes import Node, scratch_database

TARGET_P99_MS = 50.0
perf = time.perf_counter


def pct(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "count": len(ordered),
        "p50_ms": round(pct(ordered, 0.50), 2),
        "p95_ms": round(pct(ordered, 0.95), 2),
        "p99_ms": round(pct(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2) if ordered else float("nan"),
        "mean_ms": round(statistics.fmean(ordered), 2) if ordered else float("nan"),
    }


async def watch(client: HubClient, session_id: str, arrivals: dict[str, float], seqs: list[int]) -> None:
    async for event in client.subscribe(session_id):
        seqs.append(event.seq)
        if event.type == "message.appended":
            arrivals.setdefault(event.data["message"]["id"], perf())


async def run_bus(args: argparse.Namespace, bus: str) -> dict[str, Any]:
    ring = args.redis if bus == "redis" else "postgres"
    async with (
        scratch_database(args.dsn, "sessionhub_bench_nodes") as database,
        Node(database, ring) as a,
        Node(database, ring) as b,
    ):
        writer = HubClient(a.ws_url, name="writer")
        far = HubClient(b.ws_url, name="far")
        near = HubClient(a.ws_url, name="near")
        async with writer, far, near:
            ids = [(await writer.sessions.create(f"bench {i}")).id for i in range(args.sessions)]
            far_arrivals: dict[str, float] = {}
            near_arrivals: dict[str, float] = {}
            far_seqs: dict[str, list[int]] = {sid: [] for sid in ids}
            near_seqs: dict[str, list[int]] = {sid: [] for sid in ids}
            tasks = [asyncio.create_task(watch(far, sid, far_arrivals, far_seqs[sid])) for sid in ids]
            tasks += [asyncio.create_task(watch(near, sid, near_arrivals, near_seqs[sid])) for sid in ids]
            await asyncio.sleep(0.5)  # subscriptions in place

            sent: dict[str, float] = {}
            acked: dict[str, float] = {}
            total = int(args.rate * args.seconds)
            period = 1.0 / args.rate
            start = perf()
            for i in range(total):
                delay = start + i * period - perf()
                if delay > 0:
                    await asyncio.sleep(delay)
                mid = f"m{i}"
                sent[mid] = perf()
                await writer.sessions.append(ids[i % len(ids)], {"id": mid, "role": "user", "parts": []})
                acked[mid] = perf()
            elapsed = perf() - start
            deadline = perf() + 10
            while (len(far_arrivals) < total or len(near_arrivals) < total) and perf() < deadline:
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    far_ms = [(far_arrivals[m] - t) * 1000 for m, t in sent.items() if m in far_arrivals]
    near_ms = [(near_arrivals[m] - t) * 1000 for m, t in sent.items() if m in near_arrivals]
    ack_ms = [(acked[m] - t) * 1000 for m, t in sent.items()]
    in_order = all(seqs == list(range(1, len(seqs) + 1)) for seqs in far_seqs.values())
    return {
        "bus": bus,
        "appends": total,
        "achieved_rate": round(total / elapsed, 1),
        "cross_node": figures(far_ms),
        "same_node": figures(near_ms),
        "write_ack": figures(ack_ms),
        "missing_cross_node": total - len(far_arrivals),
        "every_event_once_in_order": in_order and len(far_arrivals) == total,
    }


def report(result: dict[str, Any]) -> None:
    x, s, w = result["cross_node"], result["same_node"], result["write_ack"]
    ok = "meets" if x["p99_ms"] <= TARGET_P99_MS else "MISSES"
    print(
        f"== bus {result['bus']}: {result['appends']:,} appends at {result['achieved_rate']} /s\n"
        f"   write on A -> event on B: p50 {x['p50_ms']} ms  p95 {x['p95_ms']} ms  "
        f"p99 {x['p99_ms']} ms  max {x['max_ms']} ms  ({ok} p99 <= {TARGET_P99_MS:g} ms)\n"
        f"   same node (A -> A):       p50 {s['p50_ms']} ms  p95 {s['p95_ms']} ms  p99 {s['p99_ms']} ms\n"
        f"   append acknowledged:      p50 {w['p50_ms']} ms  p99 {w['p99_ms']} ms\n"
        f"   missing on B: {result['missing_cross_node']}; every event once, in order: "
        f"{'yes' if result['every_event_once_in_order'] else 'NO'}",
        flush=True,
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=100.0, help="appends per second (default 100)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to write (default 20)")
    p.add_argument("--sessions", type=int, default=10, help="sessions written round-robin (default 10)")
    p.add_argument("--bus", action="append", choices=["postgres", "redis"], help="default: both")
    p.add_argument(
        "--dsn",
        default=os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--redis", default=os.environ.get("SESSIONHUB_TEST_REDIS", "redis://127.0.0.1:6379/0"))
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    buses = args.bus or ["postgres", "redis"]
    print(
        f"machine: {os.cpu_count()} CPU, Python {platform.python_version()}, {platform.platform()}; "
        f"rate {args.rate:g}/s for {args.seconds:g} s over {args.sessions} sessions",
        flush=True,
    )
    results = []
    for bus in buses:
        result = asyncio.run(run_bus(args, bus))
        report(result)
        results.append(result)
    if args.json:
        print(json.dumps({"bench": "sessionhub-nodes", "results": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
