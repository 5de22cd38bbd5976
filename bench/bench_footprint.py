"""On-disk bytes per message, against the message's own JSON, on both stores.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_footprint.py [--n 3000] [--sessions 1,20] [--chars 120]
                                              [--corpus random|prose] [--marginal]
                                              [--store sqlite|postgres|both] [--dsn DSN] [--json]

For each layout (``--sessions``: N messages in 1 session, then spread over 20 sessions) it
appends N messages of ~``--chars`` characters of text (default 120) with one awaited
``append_message`` each (the write path of a chat turn: one event per message), then measures:

- SQLite: the database file after ``PRAGMA wal_checkpoint(TRUNCATE)``, so the ``-wal`` file
  is empty and everything is counted once, in the main file; also per table and index
  (``dbstat``, page bytes).
- Postgres: ``pg_total_relation_size`` (heap, TOAST and indexes) summed over the store's
  tables, after ``VACUUM`` so that dead tuples left by the writes do not count; per table too.

"JSON" is the bytes of each message as ``json.dumps`` of its UIMessage dict (no spaces),
summed. The log is retained: every ``message.appended`` event is still there.

The texts (``--corpus``): ``random`` (the default, the figures of docs/benchmarks.md) draws
words of 3-9 random letters from a vocabulary of 600, which neither compresses nor has stop
words; ``prose`` takes consecutive sentences of this repository's own docs (English prose
with code names), the closer thing to what people write.

A store has a fixed cost (each empty table and index takes a page or two: ~80-250 KB), which
weighs on a small database. ``--marginal`` also fills 2N messages and reports the bytes
that the second N added, per message: what one more message costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sqlite3
import string
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.support.nodes import scratch_database  # noqa: E402 - after the checkout is on sys.path

SEED = 16
TABLES = (
    "sessions",
    "messages",
    "compactions",
    "streams",
    "events",
    "context_blocks",
    "search_entries",
    "session_stats",
    "settings",
)


def texts(n: int, chars: int = 120, corpus: str = "random") -> list[str]:
    """N texts of about ``chars`` characters (see the module's docstring for the corpora)."""
    rng = random.Random(SEED)
    if corpus == "prose":
        return _prose(n, chars)
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(600)]
    out = []
    for _ in range(n):
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(vocab))
        out.append(" ".join(words))
    return out


def _prose(n: int, chars: int) -> list[str]:
    # Sentences of the docs, in order, each text as many as reach ``chars``; round and round.
    sentences: list[str] = []
    for doc in sorted((HERE.parent / "docs").glob("*.md")):
        body = re.sub(r"```.*?```", " ", doc.read_text(encoding="utf-8"), flags=re.S)
        for para in re.split(r"\n\s*\n", body):
            if para.lstrip().startswith(("#", "|", "<!--")):
                continue
            flat = " ".join(para.split())
            sentences += [x for x in re.split(r"(?<=[.!?])\s+", flat) if len(x) > 20]
    out = []
    i = 0
    for _ in range(n):
        parts: list[str] = []
        while sum(len(x) + 1 for x in parts) < chars:
            parts.append(sentences[i % len(sentences)])
            i += 1
        out.append(" ".join(parts)[: max(chars * 2, 40)])
    return out


def message(i: int, text: str) -> dict[str, Any]:
    return {
        "id": f"msg-{i:06d}",
        "role": "assistant" if i % 2 else "user",
        "parts": [{"type": "text", "text": text}],
    }


async def fill(store: Any, n: int, sessions: int, chars: int = 120, corpus: str = "random") -> int:
    """Append ``n`` messages round-robin over ``sessions`` sessions; the JSON bytes."""
    from hub import SessionManager

    manager = SessionManager(store)
    infos = [await manager.create(f"footprint {k}") for k in range(sessions)]
    handles = [manager.get_session(info.id) for info in infos]
    json_bytes = 0
    for i, text in enumerate(texts(n, chars, corpus)):
        m = message(i, text)
        json_bytes += len(json.dumps(m, separators=(",", ":")).encode())
        await handles[i % sessions].append_message(m)
    return json_bytes


async def sqlite_footprint(n: int, sessions: int, chars: int = 120, corpus: str = "random") -> dict[str, Any]:
    from hub import SqliteStore

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "footprint.db"
        store = await SqliteStore.open(path)
        try:
            json_bytes = await fill(store, n, sessions, chars, corpus)
        finally:
            await store.close()
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            tables: dict[str, int] = {}
            try:
                for name, size in conn.execute(
                    "SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
                ):
                    tables[name] = int(size)
            except sqlite3.OperationalError:  # dbstat not compiled in
                pass
        finally:
            conn.close()
        wal = path.with_name(path.name + "-wal")
        total = path.stat().st_size
        return {
            "store": "sqlite",
            "messages": n,
            "sessions": sessions,
            "json_bytes": json_bytes,
            "bytes": total,
            "wal_bytes": wal.stat().st_size if wal.exists() else 0,
            "ratio": round(total / json_bytes, 2),
            "tables": tables,
        }


async def postgres_footprint(
    n: int, sessions: int, dsn: str, chars: int = 120, corpus: str = "random"
) -> dict[str, Any]:
    import asyncpg

    from hub import PostgresStore

    async with scratch_database(dsn, "sessionhub_footprint") as target:
        store = await PostgresStore.connect(target, notify=False)
        try:
            json_bytes = await fill(store, n, sessions, chars, corpus)
        finally:
            await store.close()
        conn = await asyncpg.connect(target)
        try:
            await conn.execute("VACUUM")
            tables = {
                t: int(await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", t))
                for t in TABLES
                if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", t)
            }
            detail = {
                r[0]: int(r[1])
                for r in await conn.fetch(
                    "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
                    "JOIN pg_namespace s ON s.oid = c.relnamespace "
                    "WHERE s.nspname = 'public' AND c.relkind IN ('r', 'i', 't') "
                    "AND pg_relation_size(c.oid) > 0 ORDER BY 2 DESC"
                )
            }
        finally:
            await conn.close()
    total = sum(tables.values())
    return {
        "store": "postgres",
        "messages": n,
        "sessions": sessions,
        "json_bytes": json_bytes,
        "bytes": total,
        "ratio": round(total / json_bytes, 2),
        "tables": tables,
        "relations": detail,
    }


def show(result: dict[str, Any]) -> None:
    n = result["messages"]
    print(
        f"{result['store']:8} {n:,} messages of ~{result['chars']} chars ({result['corpus']}) in "
        f"{result['sessions']} session(s): "
        f"{result['bytes'] / 1e6:.2f} MB on disk for {result['json_bytes'] / 1e6:.2f} MB of JSON "
        f"= {result['ratio']:.2f}x ({result['bytes'] / n:.0f} B/message)"
    )
    if "marginal_ratio" in result:
        print(
            f"    one more message: {result['marginal_bytes']:.0f} B for {result['marginal_json']:.0f} B "
            f"of JSON = {result['marginal_ratio']:.2f}x (the second {n:,} of {2 * n:,})"
        )
    for name, size in result.get("relations", result["tables"]).items():
        if size:
            print(f"    {name:32} {size / 1e6:8.3f} MB  {size / n:7.1f} B/message")


async def measure(store: str, n: int, sessions: int, args: argparse.Namespace) -> dict[str, Any]:
    async def once(count: int) -> dict[str, Any]:
        if store == "sqlite":
            return await sqlite_footprint(count, sessions, args.chars, args.corpus)
        return await postgres_footprint(count, sessions, args.dsn, args.chars, args.corpus)

    result = await once(n)
    result.update(chars=args.chars, corpus=args.corpus)
    if args.marginal:
        double = await once(2 * n)
        added = double["bytes"] - result["bytes"]
        added_json = double["json_bytes"] - result["json_bytes"]
        result.update(
            marginal_bytes=added / n,
            marginal_json=added_json / n,
            marginal_ratio=round(added / added_json, 2),
        )
    return result


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="messages (default 3000)")
    p.add_argument("--sessions", default="1,20", help="comma-separated session counts (default 1,20)")
    p.add_argument("--chars", type=int, default=120, help="characters of text a message (default 120)")
    p.add_argument(
        "--corpus", choices=("random", "prose"), default="random", help="the texts (default random)"
    )
    p.add_argument("--marginal", action="store_true", help="also the bytes one more message adds")
    p.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument(
        "--dsn",
        default=os.environ.get("SESSIONHUB_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = p.parse_args(argv)
    results = []
    for sessions in (int(s) for s in args.sessions.split(",")):
        for store in ("sqlite", "postgres"):
            if args.store in (store, "both"):
                results.append(await measure(store, args.n, sessions, args))
                show(results[-1])
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
