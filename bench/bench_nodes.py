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

``--throughput`` measures instead how many commits a second get through, and are delivered,
with 1 and then 2 nodes on one scratch database, for each bus::

    .venv/bin/python bench/bench_nodes.py --throughput [--writers 8] [--seconds 10] [--runs 3]

``--writers`` clients, spread round-robin over the nodes, each append as fast as they can
(each append awaited) for ``--seconds``, each to two sessions of its own; on every node one
subscriber follows every session, so each commit is delivered once per node (through the
bus to every node but the writer's). Commits/s = acknowledged appends / the writing time;
deliveries/s = events received / the time until the last one arrived. Every subscriber must
get every event of every session once, in order. The writers and subscribers are this one
process's ``HubClient``s; its CPU share is printed, as on this machine the nodes, Postgres,
Redis and the clients share two cores. Each figure is the median of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
SESSIONS_PER_WRITER = 2
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


async def throughput_point(args: argparse.Namespace, bus: str, nodes: int) -> dict[str, Any]:
    ring = args.redis if bus == "redis" else "postgres"
    async with contextlib.AsyncExitStack() as stack:
        database = await stack.enter_async_context(scratch_database(args.dsn, "sessionhub_bench_nodes"))
        hubs = [await stack.enter_async_context(Node(database, ring)) for _ in range(nodes)]
        writers = [HubClient(hubs[i % nodes].ws_url, name=f"writer{i}") for i in range(args.writers)]
        watchers = [HubClient(h.ws_url, name=f"watcher{k}") for k, h in enumerate(hubs)]
        for client in [*writers, *watchers]:
            await stack.enter_async_context(client)
        ids = [
            [(await w.sessions.create(f"throughput {i}.{j}")).id for j in range(SESSIONS_PER_WRITER)]
            for i, w in enumerate(writers)
        ]
        every = [sid for mine in ids for sid in mine]
        seqs: dict[tuple[int, str], list[int]] = {(k, sid): [] for k in range(nodes) for sid in every}
        last_arrival = 0.0

        async def follow(k: int, sid: str) -> None:
            nonlocal last_arrival
            async for event in watchers[k].subscribe(sid):
                seqs[(k, sid)].append(event.seq)
                last_arrival = perf()

        tasks = [asyncio.create_task(follow(k, sid)) for k in range(nodes) for sid in every]
        await asyncio.sleep(1.0)  # subscriptions in place, session.created delivered
        base = sum(len(v) for v in seqs.values())

        async def write(i: int, until: float) -> int:
            n = 0
            while perf() < until:
                sid = ids[i][n % SESSIONS_PER_WRITER]
                await writers[i].sessions.append(sid, {"id": f"w{i}m{n}", "role": "user", "parts": []})
                n += 1
            return n

        cpu0 = time.process_time()
        start = perf()
        counts = await asyncio.gather(*(write(i, start + args.seconds) for i in range(args.writers)))
        elapsed = perf() - start
        commits = sum(counts)
        expected = base + commits * nodes
        deadline = perf() + 30
        while sum(len(v) for v in seqs.values()) < expected and perf() < deadline:
            await asyncio.sleep(0.05)
        cpu, wall = time.process_time() - cpu0, perf() - start
        span = max(1e-9, last_arrival - start)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delivered = sum(len(v) for v in seqs.values()) - base
    in_order = all(v == list(range(1, len(v) + 1)) for v in seqs.values())
    return {
        "bus": bus,
        "nodes": nodes,
        "writers": args.writers,
        "commits": commits,
        "commits_per_s": round(commits / elapsed, 1),
        "delivered": delivered,
        "deliveries_per_s": round(delivered / span, 1),
        "every_event_once_in_order": in_order and delivered == commits * nodes,
        "client_cpu_share": round(cpu / wall, 2),
    }


async def throughput(args: argparse.Namespace, bus: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for nodes in (1, 2):
        runs = [await throughput_point(args, bus, nodes) for _ in range(args.runs)]
        point = {
            "bus": bus,
            "nodes": nodes,
            "writers": args.writers,
            "commits_per_s": round(statistics.median(r["commits_per_s"] for r in runs), 1),
            "commits_per_s_min": min(r["commits_per_s"] for r in runs),
            "commits_per_s_max": max(r["commits_per_s"] for r in runs),
            "deliveries_per_s": round(statistics.median(r["deliveries_per_s"] for r in runs), 1),
            "client_cpu_share": statistics.median(r["client_cpu_share"] for r in runs),
            "every_event_once_in_order": all(r["every_event_once_in_order"] for r in runs),
            "loadavg": loadavg(),
            "runs": runs,
        }
        print(
            f"== bus {bus}, {nodes} node(s), {args.writers} writers: {point['commits_per_s']:,.0f} commits/s "
            f"[{point['commits_per_s_min']:,.0f}–{point['commits_per_s_max']:,.0f}], "
            f"{point['deliveries_per_s']:,.0f} deliveries/s ({nodes} per commit); every event once, in "
            f"order: {'yes' if point['every_event_once_in_order'] else 'NO'}; this process's CPU "
            f"{point['client_cpu_share']:.0%}; load {point['loadavg']}",
            flush=True,
        )
        out.append(point)
    return out


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


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
    p.add_argument(
        "--throughput", action="store_true", help="commits/s through 1 and 2 nodes instead of latency"
    )
    p.add_argument("--writers", type=int, default=8, help="--throughput: writing clients (default 8)")
    p.add_argument("--runs", type=int, default=3, help="--throughput: runs per figure (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    buses = args.bus or ["postgres", "redis"]
    what = (
        f"{args.writers} writers as fast as they can for {args.seconds:g} s, {args.runs} runs"
        if args.throughput
        else f"rate {args.rate:g}/s for {args.seconds:g} s over {args.sessions} sessions"
    )
    print(
        f"machine: {os.cpu_count()} CPU, Python {platform.python_version()}, {platform.platform()}; "
        f"{what}; load average {loadavg()}",
        flush=True,
    )
    if args.throughput:
        points = [p for bus in buses for p in asyncio.run(throughput(args, bus))]
        if args.json:
            print(json.dumps({"bench": "sessionhub-nodes-throughput", "results": points}), flush=True)
        return 0
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
