"""Micro-benchmark of the sessionhub engine on a file-backed SQLite store.

Prints figures, never asserts timings. Run from the repository root:

    .venv/bin/python bench/bench_engine.py [--n 10000] [--search-n 100000] [--reps 5]
                                           [--search-calls 200] [--branches 1000]
                                           [--json] [--skip-peer] [--pin-cpu CPU]

Sections, in order:

1. ``Session.append_message`` x N in one chain, each awaited (default parent: the latest
   leaf); the cost of the first and the last 1,000 appends. 1b repeats it with
   ``synchronous=FULL``, the setting the Python peer runs with.
2. ``SessionManager.append_all`` of N messages into a fresh session, one call.
3. ``get_history`` at depth N: warm, and the first call on a freshly opened store.
4. ``get_branches`` of a message with 1,000 (+1) children.
5. ``Session.search`` / ``SessionManager.search`` p50 over N and over SEARCH_N messages.
6. The same rows for the Python peer, the OpenAI Agents SDK's ``AsyncSQLiteSession``.
   openai-agents conflicts with our websockets pin, so the peer runs in its own venv,
   ``bench/.venv-peer``, as ``bench_engine.py --peer-only --json`` in a subprocess::

       python3 -m venv bench/.venv-peer
       bench/.venv-peer/bin/pip install openai-agents==0.24.0 aiosqlite==0.22.1

The corpus follows the idea of the original's ``bench.mjs``: a fixed 600-word vocabulary
from a seeded generator, 20 words a message plus tag words: ``deployment`` in every 100th
message, ``zebracorn`` in 11 messages per corpus, ``deploying pipeline`` in every 7th.
Every file lives in a temporary directory that is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import importlib.metadata
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hub import Store

HERE = Path(__file__).resolve().parent
# This checkout's code, not whatever `hub` the venv has installed (an editable install of
# another checkout would otherwise be measured).
sys.path.insert(0, str(HERE.parent))
PEER_VENV = HERE / ".venv-peer"
PEER_PYTHON = PEER_VENV / "bin" / "python"
PEER_SETUP = (
    "python3 -m venv bench/.venv-peer && "
    "bench/.venv-peer/bin/pip install openai-agents==0.24.0 aiosqlite==0.22.1"
)

SEED = 20_260_101
VOCAB_SIZE = 600
TAG_SPECIFIC = "deployment"  # every 100th message: ~1 % of the corpus
TAG_RARE = "zebracorn"  # 11 messages per corpus, whatever its size
TAG_PHRASE = ("deploying", "pipeline")  # every 7th message
NO_MATCH = "nomatchword"

# Targets (from the port's brief). Printed next to the figures; never asserted.
TARGET_APPEND_US = 290.0
TARGET_APPEND_RATIO = 1.2
TARGET_BULK_PER_S = 50_000.0
TARGET_HISTORY_WARM_MS = 60.0
TARGET_HISTORY_COLD_MS = 100.0
TARGET_SEARCH_MS = 2.0  # p50 at SEARCH_N = 100,000

perf = time.perf_counter


# ---------------------------------------------------------------------------------------
# Corpus
# ---------------------------------------------------------------------------------------


def make_vocab() -> list[str]:
    """600 distinct lowercase pseudo-words of 3-9 letters, always the same."""
    rng = random.Random(SEED)
    taken = {TAG_SPECIFIC, TAG_RARE, *TAG_PHRASE, NO_MATCH}
    words: list[str] = []
    while len(words) < VOCAB_SIZE:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9)))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


VOCAB = make_vocab()


def build_texts(count: int) -> list[str]:
    """Message texts 0..count-1: 20 vocabulary words plus the tag words."""
    rng = random.Random(SEED + 1)
    rare_every = -(-count // 11)  # ceil: exactly 11 rare hits for any count >= 11
    out: list[str] = []
    for i in range(count):
        words = rng.choices(VOCAB, k=20)
        if i % 100 == 0:
            words.append(TAG_SPECIFIC)
        if i % rare_every == 0:
            words.append(TAG_RARE)
        if i % 7 == 0:
            words.extend(TAG_PHRASE)
        out.append(" ".join(words))
    return out


def _node_rng(seed: int) -> Callable[[], float]:
    """bench.mjs's generator (an LCG on 32 bits), so ``--corpus original`` is its data."""
    state = seed % 2**32

    def step() -> float:
        nonlocal state
        state = (state * 1664525 + 1013904223) % 2**32
        return state / 2**32

    return step


def _node_vocab() -> list[str]:
    out = []
    for i in range(600):
        r = _node_rng(i + 7)
        length = 3 + int(r() * 7)
        out.append("".join(chr(97 + int(r() * 26)) for _ in range(length)))
    return out


NODE_VOCAB = _node_vocab()
NODE_QUERIES: list[tuple[str, str]] = [
    ("specific word, 1 %", "deployment"),
    ("rare word, every 1000th", "zebracorn"),
    ("2-word phrase, ~14 %", "deploying pipeline"),
    ("common vocab word", NODE_VOCAB[3]),
    ("no match", "nomatchword"),
]


def node_texts(count: int) -> list[str]:
    """bench.mjs's ``textFor(i)`` for i < count, exactly."""
    out = []
    for i in range(count):
        r = _node_rng(i * 31 + 1)
        words = [NODE_VOCAB[int(r() * 600)] for _ in range(20)]
        if i % 100 == 0:
            words.append("deployment")
        if i % 1000 == 0:
            words.append("zebracorn")
        if i % 7 == 0:
            words.extend(["deploying", "pipeline"])
        out.append(" ".join(words))
    return out


def ui_message(message_id: str, i: int, text: str) -> dict[str, Any]:
    role = "assistant" if i % 2 else "user"
    return {"id": message_id, "role": role, "parts": [{"type": "text", "text": text}]}


def peer_item(i: int, text: str) -> dict[str, Any]:
    return {"role": "assistant" if i % 2 else "user", "content": text}


QUERIES: list[tuple[str, str]] = [
    ("specific word, ~1 %", TAG_SPECIFIC),
    ("rare word, 11 msgs", TAG_RARE),
    ("2-word phrase, ~14 %", " ".join(TAG_PHRASE)),
    ("common vocab word, ~3 %", VOCAB[3]),
    ("no match", NO_MATCH),
]


# ---------------------------------------------------------------------------------------
# Timing and printing
# ---------------------------------------------------------------------------------------


def r3(x: float) -> float:
    return round(x, 3)


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """(milliseconds, result) of one awaited call."""
    t0 = perf()
    value = await fn()
    return (perf() - t0) * 1000.0, value


async def repeat(fn: Callable[[], Awaitable[Any]], reps: int) -> tuple[dict[str, float], Any]:
    times: list[float] = []
    value: Any = None
    for _ in range(reps):
        value = None  # drop the previous result first: it is not part of the next call
        ms, value = await timed(fn)
        times.append(ms)
    return summary(times), value


def summary(times_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return {
        "median_ms": r3(statistics.median(ordered)),
        "p95_ms": r3(p95),
        "min_ms": r3(ordered[0]),
        "max_ms": r3(ordered[-1]),
        "n": len(ordered),
    }


def verdict(value: float, target: float, *, higher_is_better: bool = False) -> str:
    ok = value >= target if higher_is_better else value <= target
    sign = ">=" if higher_is_better else "<="
    return f"[target {sign} {target:g}: {'meets' if ok else 'MISSES'}]"


def say(line: str = "") -> None:
    print(line, flush=True)


def check(ok: bool, what: str) -> None:
    """A correctness check of what a benchmarked call returned (never a timing)."""
    if not ok:
        raise RuntimeError(f"benchmark sanity check failed: {what}")


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        default_sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    return {
        "nproc": os.cpu_count(),
        "cpu": model or platform.processor(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlite_default_synchronous": default_sync,
        "os": platform.platform(),
        "aiosqlite": _version("aiosqlite"),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------


async def append_chain(store: Store, session_id: str, texts: Sequence[str]) -> dict[str, Any]:
    """Section 1: one awaited ``append_message`` per message, default parent (LATEST)."""
    from hub import Session

    n = len(texts)
    session = Session(store, session_id=session_id)
    messages = [ui_message(f"m{i}", i, t) for i, t in enumerate(texts)]
    window = max(1, min(1000, n // 10))
    marks: dict[int, float] = {}
    t0 = perf()
    for i, message in enumerate(messages):
        if i in (window, n - window):
            marks[i] = perf()
        await session.append_message(message)
    total = perf() - t0
    end = t0 + total
    first_us = (marks[window] - t0) * 1e6 / window
    last_us = (end - marks[n - window]) * 1e6 / window
    depth = await session.get_path_length()
    check(depth == n, f"chain depth {depth} != {n}")
    return {
        "n": n,
        "total_s": r3(total),
        "per_op_us": r3(total * 1e6 / n),
        "window": window,
        "first_window_us": r3(first_us),
        "last_window_us": r3(last_us),
        "ratio_last_first": r3(last_us / first_us),
    }


class Stores:
    """Opens the named stores the sections use: SQLite files in the temp dir, or, with
    ``--store postgres``, one scratch database per name on ``--dsn`` (dropped at the end)."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.kind: str = args.store
        self.dsn: str = args.dsn
        self.tmp = tmp
        self.prefix = f"sessionhub_bench_{os.getpid()}"
        self.databases: list[str] = []

    def describe(self) -> str:
        if self.kind == "postgres":
            return f"PostgresStore (a scratch database per section on {self.dsn})"
        return "file-backed SqliteStore (files in a temp dir)"

    def _dsn(self, name: str) -> str:
        from urllib.parse import urlsplit, urlunsplit

        return urlunsplit(urlsplit(self.dsn)._replace(path=f"/{self.prefix}_{name}"))

    async def open(self, name: str, **sqlite_options: Any) -> Store:
        from hub import PostgresStore, SqliteStore

        if self.kind == "sqlite":
            return await SqliteStore.open(self.tmp / f"{name}.db", **sqlite_options)
        if name not in self.databases:
            import asyncpg

            admin = await asyncpg.connect(self.dsn)
            try:
                await admin.execute(f'CREATE DATABASE "{self.prefix}_{name}"')
            finally:
                await admin.close()
            self.databases.append(name)
        return await PostgresStore.connect(self._dsn(name), notify=False)

    async def settle(self, store: Store) -> None:
        """After a bulk load: on Postgres, ANALYZE, as autovacuum does within a minute of
        one (without statistics the planner walks a session's rows instead of the index)."""
        if self.kind == "postgres":
            from hub import PostgresStore

            assert isinstance(store, PostgresStore)
            await store.analyze()

    async def drop_all(self) -> None:
        if not self.databases:
            return
        import asyncpg

        admin = await asyncpg.connect(self.dsn)
        try:
            for name in self.databases:
                await admin.execute(f'DROP DATABASE IF EXISTS "{self.prefix}_{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def bench_engine(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    stores = Stores(args, tmp)
    try:
        if args.search_only:
            say(f"== sessionhub search only: {stores.describe()}")
            return {
                "store": stores.kind,
                "search": {str(args.search_n): await bench_search(args, stores, args.search_n)},
            }
        return await _bench_engine(args, stores)
    finally:
        await stores.drop_all()


async def _bench_engine(args: argparse.Namespace, stores: Stores) -> dict[str, Any]:
    from hub import Session, SessionManager

    n: int = args.n
    reps: int = args.reps
    out: dict[str, Any] = {"store": stores.kind}
    texts = build_texts(n)

    say(f"== sessionhub engine: {stores.describe()}, N={n:,}")

    # 1. Append a chain, one awaited call per message.
    store = await stores.open("engine")
    chain = await append_chain(store, "chain", texts)
    out["append_chain"] = chain
    say(
        f"1. append_message x {n:,} (chain, each awaited): {chain['total_s']:.2f} s total, "
        f"{chain['per_op_us']:.1f} µs/op {verdict(chain['per_op_us'], TARGET_APPEND_US)}"
    )
    w = chain["window"]
    say(
        f"   per append over 0-{w:,}: {chain['first_window_us']:.1f} µs; "
        f"over {n - w:,}-{n:,}: {chain['last_window_us']:.1f} µs; "
        f"ratio {chain['ratio_last_first']:.2f} "
        f"{verdict(chain['ratio_last_first'], TARGET_APPEND_RATIO)}"
    )

    # 1b. The same with synchronous=FULL (fsync per commit), the Python peer's default.
    # Postgres commits are already durable by default (synchronous_commit = on).
    if stores.kind == "sqlite":
        full_store = await stores.open("engine-full", synchronous="FULL")
        try:
            full = await append_chain(full_store, "chain", texts)
        finally:
            await full_store.close()
        out["append_chain_sync_full"] = full
        say(
            f"1b. same, synchronous=FULL: {full['total_s']:.2f} s total, {full['per_op_us']:.1f} µs/op "
            f"(first {full['first_window_us']:.1f} / last {full['last_window_us']:.1f} µs, "
            f"ratio {full['ratio_last_first']:.2f})"
        )

    # 2. append_all of N messages into a fresh registered session, one call.
    manager = SessionManager(store)
    bulk_rates: list[float] = []
    bulk_reps = max(1, min(3, reps))
    for rep in range(bulk_reps):
        info = await manager.create(f"bulk-{rep}")
        batch = [ui_message(f"m{i}", i, t) for i, t in enumerate(texts)]
        ms, last_id = await timed(functools.partial(manager.append_all, info.id, batch))
        check(last_id == f"m{n - 1}", f"append_all returned {last_id!r}")
        bulk_rates.append(n / (ms / 1000.0))
        del batch
    bulk_rate = statistics.median(bulk_rates)
    out["append_all"] = {
        "n": n,
        "reps": bulk_reps,
        "median_msgs_per_s": round(bulk_rate),
        "best_msgs_per_s": round(max(bulk_rates)),
    }
    say(
        f"2. SessionManager.append_all({n:,} msgs, one call, fresh session), "
        f"median of {bulk_reps}: "
        f"{bulk_rate:,.0f} msgs/s (best {max(bulk_rates):,.0f}) "
        f"{verdict(bulk_rate, TARGET_BULK_PER_S, higher_is_better=True)}"
    )

    # 3. get_history at depth N: warm, then first call on freshly opened stores.
    session = Session(store, session_id="chain")
    warm, history = await repeat(session.get_history, reps)
    check(len(history) == n and history[-1].id == f"m{n - 1}", "history is not the chain")
    await store.close()
    cold_ms: list[float] = []
    open_ms: list[float] = []
    for _ in range(3):
        t0 = perf()
        fresh = await stores.open("engine")
        open_ms.append((perf() - t0) * 1000.0)
        try:
            ms, history = await timed(Session(fresh, session_id="chain").get_history)
        finally:
            await fresh.close()
        check(len(history) == n, "cold history is not the chain")
        cold_ms.append(ms)
    cold = summary(cold_ms)
    out["get_history"] = {"depth": n, "warm": warm, "cold": cold, "open": summary(open_ms)}
    say(
        f"3. get_history at depth {n:,}: warm median of {reps} {warm['median_ms']:.1f} ms "
        f"{verdict(warm['median_ms'], TARGET_HISTORY_WARM_MS)}"
    )
    say(
        f"   cold (first call on a freshly opened store), median of 3: {cold['median_ms']:.1f} ms "
        f"{verdict(cold['median_ms'], TARGET_HISTORY_COLD_MS)} "
        f"(SqliteStore.open itself: {statistics.median(open_ms):.1f} ms)"
    )

    # 4. get_branches of a message with BRANCHES extra children.
    store = await stores.open("engine")
    try:
        session = Session(store, session_id="chain")
        parent = f"m{n // 2}"
        branches: int = args.branches
        t0 = perf()
        for k in range(branches):
            await session.append_message(ui_message(f"b{k}", k, texts[k % n]), parent_id=parent)
        branch_append_us = (perf() - t0) * 1e6 / max(1, branches)
        gb, children = await repeat(lambda: session.get_branches(parent), reps)
        expected = branches + (1 if n // 2 + 1 < n else 0)
        check(len(children) == expected, f"get_branches returned {len(children)} != {expected}")
        out["get_branches"] = {
            "parent": parent,
            "children": len(children),
            "append_with_parent_us": r3(branch_append_us),
            **gb,
        }
        say(
            f"4. append_message x {branches:,} with parent={parent}: {branch_append_us:.1f} µs/op; "
            f"get_branches({parent}) -> {len(children):,} children: median {gb['median_ms']:.2f} ms"
        )
    finally:
        await store.close()

    # 5. Search over N and over SEARCH_N messages, each corpus in its own store file.
    out["search"] = {}
    sizes = sorted({n, args.search_n})
    for size in sizes:
        out["search"][str(size)] = await bench_search(args, stores, size)
    return out


async def bench_search(args: argparse.Namespace, stores: Stores, size: int) -> dict[str, Any]:
    from hub import SessionManager

    calls: int = args.search_calls
    original = args.corpus == "original"
    queries = NODE_QUERIES if original else QUERIES
    sessions: int = args.search_sessions
    texts = node_texts(size) if original else build_texts(size)
    store = await stores.open(f"search-{size}")
    try:
        manager = SessionManager(store)
        info = await manager.create(f"search-{size}")
        t0 = perf()
        if sessions <= 1:
            batch_size = 10_000
            for start in range(0, size, batch_size):
                batch = [
                    ui_message(f"m{i}", i, texts[i]) for i in range(start, min(size, start + batch_size))
                ]
                await manager.append_all(info.id, batch)
        else:
            # The corpus spread over ``sessions`` sessions, written in rounds of 10 messages
            # per session, so sessions interleave in the index as live ones do; the first
            # session is searched.
            ids = [info.id] + [(await manager.create(f"other-{k}")).id for k in range(1, sessions)]
            per = size // sessions
            batch_size = 10
            for start in range(0, per, batch_size):
                for k, sid in enumerate(ids):
                    rows = range(k * per + start, k * per + min(per, start + batch_size))
                    await manager.append_all(sid, [ui_message(f"m{i}", i - k * per, texts[i]) for i in rows])
        build_s = perf() - t0
        await stores.settle(store)
        del texts
        session = manager.get_session(info.id)
        result: dict[str, Any] = {
            "messages": size,
            "build_s": r3(build_s),
            "build_msgs_per_s": round(size / build_s),
            "calls": calls,
            "sessions": max(sessions, 1),
            "corpus": args.corpus,
            "session_search": {},
            "manager_search": {},
        }
        say(
            f"5. search over {size:,} messages "
            f"(built with append_all in batches of {batch_size:,}: "
            f"{build_s:.1f} s, {size / build_s:,.0f} msgs/s); p50 of {calls} calls"
        )
        for api, fn in (
            ("session_search", session.search),
            ("manager_search", manager.search),
        ):
            label = "Session.search (phrase)" if api == "session_search" else "SessionManager.search (words)"
            say(f"   {label}:")
            for desc, query in queries:
                hits = await fn(query)  # warm-up call, and the hit count
                stats, _ = await repeat(functools.partial(fn, query), calls)
                result[api][query] = {"what": desc, "hits": len(hits), **stats}
                tail = ""
                if size >= 100_000:
                    tail = " " + verdict(stats["median_ms"], TARGET_SEARCH_MS)
                say(
                    f"     {query!r:24} {desc:24} hits {len(hits):>3}  "
                    f"p50 {stats['median_ms']:7.3f} ms  p95 {stats['p95_ms']:7.3f} ms{tail}"
                )
        return result
    finally:
        await store.close()


# ---------------------------------------------------------------------------------------
# Python peer: openai-agents' AsyncSQLiteSession (run in bench/.venv-peer)
# ---------------------------------------------------------------------------------------


async def bench_peer(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    # Imported by name so that this file type-checks with or without openai-agents.
    module = importlib.import_module("agents.extensions.memory.async_sqlite_session")
    peer_cls: Any = module.AsyncSQLiteSession
    n: int = args.n
    reps: int = args.reps
    texts = build_texts(n)
    items = [peer_item(i, t) for i, t in enumerate(texts)]
    path = tmp / "peer.db"
    out: dict[str, Any] = {"package": f"openai-agents {_version('openai-agents')}"}
    say(f"== peer: {out['package']} AsyncSQLiteSession (file-backed), N={n:,}")

    # add_items one item per call, each awaited.
    session: Any = peer_cls("chain", db_path=path)
    window = max(1, min(1000, n // 10))
    marks: dict[int, float] = {}
    t0 = perf()
    for i, item in enumerate(items):
        if i in (window, n - window):
            marks[i] = perf()
        await session.add_items([item])
    total = perf() - t0
    first_us = (marks[window] - t0) * 1e6 / window
    last_us = (t0 + total - marks[n - window]) * 1e6 / window
    out["append_chain"] = {
        "n": n,
        "total_s": r3(total),
        "per_op_us": r3(total * 1e6 / n),
        "window": window,
        "first_window_us": r3(first_us),
        "last_window_us": r3(last_us),
        "ratio_last_first": r3(last_us / first_us),
    }
    say(
        f"6. add_items([item]) x {n:,} (each awaited): {total:.2f} s total, "
        f"{total * 1e6 / n:.1f} µs/op; "
        f"first {first_us:.1f} / last {last_us:.1f} µs, ratio {last_us / first_us:.2f}"
    )

    # add_items with all N items in one call, fresh session id each time.
    rates: list[float] = []
    bulk_reps = max(1, min(3, reps))
    for rep in range(bulk_reps):
        bulk: Any = peer_cls(f"bulk-{rep}", db_path=path)
        try:
            ms, _ = await timed(functools.partial(bulk.add_items, items))
        finally:
            await bulk.close()
        rates.append(n / (ms / 1000.0))
    rate = statistics.median(rates)
    out["append_all"] = {
        "n": n,
        "reps": bulk_reps,
        "median_msgs_per_s": round(rate),
        "best_msgs_per_s": round(max(rates)),
    }
    say(f"   add_items({n:,} items, one call), median of {bulk_reps}: {rate:,.0f} items/s")

    # get_items: the whole session, warm; then on a fresh session object (new connection).
    warm, got = await repeat(session.get_items, reps)
    check(len(got) == n, f"get_items returned {len(got)} != {n}")
    await session.close()
    cold_ms: list[float] = []
    for _ in range(3):
        fresh: Any = peer_cls("chain", db_path=path)
        try:
            ms, got = await timed(fresh.get_items)
        finally:
            await fresh.close()
        check(len(got) == n, "cold get_items is not the session")
        cold_ms.append(ms)
    cold = summary(cold_ms)
    out["get_history"] = {"depth": n, "warm": warm, "cold": cold}
    say(
        f"   get_items() of {n:,}: warm median of {reps} {warm['median_ms']:.1f} ms; "
        f"cold (fresh session object, first call; includes connect + schema check), "
        f"median of 3: {cold['median_ms']:.1f} ms"
    )
    out["get_branches"] = None
    out["search"] = None
    say("   get_branches: n/a (a flat list, no tree)")
    say(
        "   search: n/a (AsyncSQLiteSession has no search; AdvancedSQLiteSession's "
        "find_turns_by_content is a LIKE scan, not measured)"
    )
    return out


def run_peer_subprocess(args: argparse.Namespace) -> dict[str, Any] | None:
    if not PEER_PYTHON.exists():
        say(f"6. peer skipped: {PEER_PYTHON.relative_to(HERE.parent)} not found. Create it with:")
        say(f"     {PEER_SETUP}")
        return None
    cmd = [
        str(PEER_PYTHON),
        str(Path(__file__).resolve()),
        "--peer-only",
        "--json",
        "--n",
        str(args.n),
        "--reps",
        str(args.reps),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        say(line)
    if proc.returncode != 0 or not lines:
        say(f"6. peer run failed (exit {proc.returncode}):")
        say(proc.stderr.strip())
        return None
    data: dict[str, Any] = json.loads(lines[-1])
    peer: dict[str, Any] = data["peer"]
    peer["machine"] = data["machine"]
    return peer


# ---------------------------------------------------------------------------------------
# Comparison table
# ---------------------------------------------------------------------------------------


def _get(d: dict[str, Any] | None, *keys: str) -> Any:
    cur: Any = d
    for key in keys:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "n/a"
    return format(value, fmt)


def comparison_rows(
    engine: dict[str, Any], peer: dict[str, Any] | None, search_n: int
) -> list[tuple[str, str, str, str]]:
    n = engine["append_chain"]["n"]
    peer_missing = "not run" if peer is None else "n/a"
    rows: list[tuple[str, str, str, str]] = [
        (
            f"append one at a time x {n:,}, µs/op",
            _fmt(engine["append_chain"]["per_op_us"], ".1f"),
            _fmt(_get(peer, "append_chain", "per_op_us"), ".1f") if peer else peer_missing,
            f"<= {TARGET_APPEND_US:g}",
        ),
        (
            "  same, synchronous=FULL, µs/op",
            _fmt(_get(engine, "append_chain_sync_full", "per_op_us"), ".1f"),
            _fmt(_get(peer, "append_chain", "per_op_us"), ".1f") + " (its default)" if peer else peer_missing,
            "",
        ),
        (
            f"  last/first {engine['append_chain']['window']:,} appends, ratio",
            _fmt(engine["append_chain"]["ratio_last_first"], ".2f"),
            _fmt(_get(peer, "append_chain", "ratio_last_first"), ".2f") if peer else peer_missing,
            f"<= {TARGET_APPEND_RATIO:g}",
        ),
        (
            f"bulk append {n:,} in one call, msgs/s",
            _fmt(engine["append_all"]["median_msgs_per_s"], ",d"),
            _fmt(_get(peer, "append_all", "median_msgs_per_s"), ",d") if peer else peer_missing,
            f">= {TARGET_BULK_PER_S:,.0f}",
        ),
        (
            f"read full history ({n:,}), warm, ms",
            _fmt(engine["get_history"]["warm"]["median_ms"], ".1f"),
            _fmt(_get(peer, "get_history", "warm", "median_ms"), ".1f") if peer else peer_missing,
            f"<= {TARGET_HISTORY_WARM_MS:g}",
        ),
        (
            f"read full history ({n:,}), cold, ms",
            _fmt(engine["get_history"]["cold"]["median_ms"], ".1f"),
            _fmt(_get(peer, "get_history", "cold", "median_ms"), ".1f") if peer else peer_missing,
            f"<= {TARGET_HISTORY_COLD_MS:g}",
        ),
        (
            f"get_branches ({engine['get_branches']['children']:,} children), ms",
            _fmt(engine["get_branches"]["median_ms"], ".2f"),
            peer_missing,
            "",
        ),
    ]
    for size_key, res in engine["search"].items():
        size = int(size_key)
        for query, stats in res["session_search"].items():
            target = f"<= {TARGET_SEARCH_MS:g}" if size == search_n and size >= 100_000 else ""
            rows.append(
                (
                    f"search p50 @{size:,}: {query!r} ({stats['hits']} hits), ms",
                    _fmt(stats["median_ms"], ".3f"),
                    peer_missing,
                    target,
                )
            )
    return rows


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    head = ("operation", "sessionhub", "AsyncSQLiteSession", "target")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    say()
    say("== comparison (Session.search rows; SessionManager.search figures are above)")
    for row in [head, tuple("-" * w for w in widths), *rows]:
        say(
            "  ".join(
                cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
            )
        )


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def run_original(args: argparse.Namespace) -> dict[str, Any] | None:
    """The original (agents@0.32.0 ``Sessions``) on bench.mjs's corpus of ``--search-n``
    messages in one session, ``--search-calls`` calls per query; its search medians."""
    here = Path(args.original)
    if not (here / "node_modules").is_dir():
        say(f"   original: skipped, no node_modules in {here} (run `npm ci` there)")
        return None
    command = [
        "node",
        "bench.mjs",
        "--impl",
        "v032",
        "--n",
        str(args.search_n),
        "--branches",
        "0",
        "--reps",
        str(args.search_calls),
        "--agent-n",
        "0",
    ]
    done = subprocess.run(command, cwd=here, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        say(f"   original: failed ({done.stderr.strip()[-300:]})")
        return None
    v032 = json.loads(done.stdout.strip().splitlines()[-1])["v0_32_0"]
    corpus = v032["search_corpus_messages"]
    say(f"   original v0.32.0 search over {corpus:,} messages, p50 of {args.search_calls}:")
    for query, stats in v032["search"].items():
        say(f"     {query!r:24} hits {stats['hits']:>3}  p50 {stats['median_ms']:7.3f} ms")
    return {"messages": v032["search_corpus_messages"], "search": v032["search"]}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=10_000, help="chain length / bulk size (default 10000)")
    p.add_argument("--search-n", type=int, default=100_000, help="large search corpus (default 100000)")
    p.add_argument("--reps", type=int, default=5, help="repetitions of read measurements (default 5)")
    p.add_argument("--search-calls", type=int, default=200, help="calls per search query (default 200)")
    p.add_argument("--branches", type=int, default=1_000, help="children added for get_branches")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    p.add_argument("--skip-peer", action="store_true", help="do not run the openai-agents peer")
    p.add_argument(
        "--store", choices=["sqlite", "postgres"], default="sqlite", help="the backend (default sqlite)"
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"),
        help="Postgres server for --store postgres (scratch databases are created and dropped there)",
    )
    p.add_argument(
        "--pin-cpu",
        type=int,
        default=None,
        metavar="CPU",
        help="run on this one CPU only (the peer subprocess inherits it)",
    )
    p.add_argument(
        "--corpus",
        choices=["own", "original"],
        default="own",
        help="search corpus: ours, or exactly bench.mjs's textFor() (default own)",
    )
    p.add_argument(
        "--search-sessions",
        type=int,
        default=1,
        metavar="K",
        help="spread each search corpus over K interleaved sessions, search the first (default 1)",
    )
    p.add_argument("--search-only", action="store_true", help="run only section 5 (search), at --search-n")
    p.add_argument(
        "--original",
        metavar="DIR",
        default=None,
        help="also run the original (node DIR/bench.mjs --impl v032 --n SEARCH_N --branches 0) "
        "and print its search medians beside ours; use with --corpus original",
    )
    p.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.n < 20:
        p.error("--n must be at least 20")
    if args.reps < 1 or args.search_calls < 1 or args.branches < 0:
        p.error("--reps and --search-calls must be >= 1, --branches >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})
    started = perf()
    machine = machine_info()
    result: dict[str, Any] = {
        "bench": "sessionhub-engine",
        "machine": machine,
        "params": {
            "n": args.n,
            "search_n": args.search_n,
            "reps": args.reps,
            "search_calls": args.search_calls,
            "branches": args.branches,
            "queries": [q for _, q in QUERIES],
        },
    }
    tmp = Path(tempfile.mkdtemp(prefix="sessionhub-bench-"))
    try:
        if args.peer_only:
            result["peer"] = asyncio.run(bench_peer(args, tmp))
        else:
            say(
                f"machine: {machine['nproc']} CPU ({machine['cpu']}), {machine['mem_gib']} GiB, "
                f"Python {machine['python']}, SQLite {machine['sqlite']}, {machine['os']}; "
                f"running on CPUs {machine['cpu_affinity']}"
            )
            result["engine"] = asyncio.run(bench_engine(args, tmp))
            if args.original:
                result["original"] = run_original(args)
            if args.search_only:
                args.skip_peer = True
            # The peer is SQLite-only: it has no row to stand beside a Postgres run.
            args.skip_peer = args.skip_peer or args.store == "postgres"
            result["peer"] = None if args.skip_peer else run_peer_subprocess(args)
            if args.skip_peer:
                say("6. peer skipped (--skip-peer)")
            if not args.search_only:
                print_table(comparison_rows(result["engine"], result["peer"], args.search_n))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["wall_s"] = r3(perf() - started)
    if not args.peer_only:
        say(f"\ntotal wall time {result['wall_s']:.1f} s")
    if args.json:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
