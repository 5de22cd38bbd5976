"""CPU instructions per engine operation on SQLite, counted by valgrind (callgrind).

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_instructions.py [--n 20] [--appends 300] [--messages 10000]
                                                 [--ops search,history,events,append]
                                                 [--chars N] [--no-deflate] [--json]

Timings on a shared VM move by up to 2x between runs of the same code; instruction counts
do not (the same binary, inputs and environment give the same count, whatever else the
machine does), so this is how a change is shown not to slow a read or a write when the
timings cannot tell. One session of ``--messages`` messages (bench_engine's corpus, one
``append_all``) is built once with this checkout's code; then, per operation, two
processes run under ``valgrind --tool=callgrind``: one that opens the store and does the
operation once (warm-up) and one that does it ``--n`` more times. The difference divided
by ``--n`` is the operation's cost, without the interpreter's start-up and the open.

Operations: ``search:<query>`` (``Session.search``, inline on the event loop at this size),
``history`` (``get_history`` of the whole session), ``events`` (``read_events`` of 1,000),
``append`` (``SessionManager.append``, one awaited append each, ``--appends`` of them).
``--chars N``: every message (the session's and the appended ones) is ~N characters of
bench_footprint's prose instead of bench_engine's short texts; ``--no-deflate`` stores long
messages whole (``packing.DEFLATE_AT``), so that a pair of runs shows what deflating costs.
Needs valgrind (``apt-get install -y valgrind``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

QUERIES = ("deploying pipeline", "deployment", "jotqr")


def corpus(messages: int, chars: int) -> list[str]:
    if chars:
        from bench_footprint import texts

        return texts(messages, chars, "prose")
    from bench_engine import build_texts

    return build_texts(messages)


def no_deflate() -> None:
    from hub.store.sqlite import packing

    packing.DEFLATE_AT = 1 << 30  # type: ignore[misc]  # the bench's A/B switch


async def build(db: Path, messages: int, chars: int) -> str:
    from bench_engine import ui_message

    from hub import SessionManager
    from hub.store.sqlite import SqliteStore

    store = await SqliteStore.open(db)
    try:
        manager = SessionManager(store)
        info = await manager.create("instructions")
        texts = corpus(messages, chars)
        await manager.append_all(info.id, [ui_message(f"m{i}", i, texts[i]) for i in range(messages)])
        return info.id
    finally:
        await store.close()


async def run(db: Path, session_id: str, op: str, n: int, chars: int) -> None:
    from hub import SessionManager
    from hub.store.policy import session_stream
    from hub.store.sqlite import SqliteStore

    store = await SqliteStore.open(db)
    try:
        manager = SessionManager(store)
        session = manager.get_session(session_id)
        if op.startswith("search:"):
            query = op.removeprefix("search:")
            for _ in range(n + 1):
                await session.search(query)
        elif op == "history":
            for _ in range(n + 1):
                await session.get_history()
        elif op == "events":
            for _ in range(n + 1):
                await store.read_events(session_stream(session_id), 0, 1000)
        elif op == "append":
            long = corpus(n, chars) if chars else None
            for i in range(n):
                text = long[i] if long else f"an appended message number {i} with some words"
                await manager.append(
                    session_id, {"id": f"x{i}", "role": "user", "parts": [{"type": "text", "text": text}]}
                )
        else:
            raise SystemExit(f"unknown operation {op!r}")
    finally:
        await store.close()


def count(db: Path, session_id: str, op: str, n: int, scratch: Path, extra: list[str]) -> int:
    """Instructions of one process doing ``op`` (on a copy of the database: appends change it)."""
    copy = scratch / "run.db"
    shutil.copyfile(db, copy)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--worker",
            str(copy),
            session_id,
            op,
            str(n),
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"valgrind printed no count for {op}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        if "--no-deflate" in argv:
            no_deflate()
        asyncio.run(run(Path(argv[1]), argv[2], argv[3], int(argv[4]), int(argv[5])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=20, help="repetitions of a read (default 20)")
    p.add_argument("--appends", type=int, default=300, help="appends counted (default 300)")
    p.add_argument("--messages", type=int, default=10_000, help="messages in the session (default 10000)")
    p.add_argument("--ops", default="search,history,events,append", help="what to count")
    p.add_argument("--chars", type=int, default=0, help="messages of ~N characters of prose")
    p.add_argument("--no-deflate", action="store_true", help="store long messages whole")
    p.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = p.parse_args(argv)
    if args.no_deflate:
        no_deflate()
    extra = [str(args.chars)] + (["--no-deflate"] if args.no_deflate else [])
    if shutil.which("valgrind") is None:
        print("valgrind not found: apt-get install -y valgrind", file=sys.stderr)
        return 2
    ops: list[str] = []
    for op in args.ops.split(","):
        ops.extend(f"search:{q}" for q in QUERIES) if op == "search" else ops.append(op)
    result: dict[str, Any] = {
        "messages": args.messages,
        "n": args.n,
        "chars": args.chars,
        "deflate": not args.no_deflate,
        "ops": {},
    }
    with tempfile.TemporaryDirectory(prefix="sessionhub-instructions-") as tmp:
        scratch = Path(tmp)
        db = scratch / "built.db"
        session_id = asyncio.run(build(db, args.messages, args.chars))
        what = f" of ~{args.chars} characters" if args.chars else ""
        whole = ", stored whole" if args.no_deflate else ""
        print(
            f"one session of {args.messages:,} messages{what}{whole}; instructions per operation (callgrind)"
        )
        for op in ops:
            n = args.appends if op == "append" else args.n
            base = count(db, session_id, op, 0, scratch, extra)
            total = count(db, session_id, op, n, scratch, extra)
            per = (total - base) // n
            result["ops"][op] = per
            print(f"  {op:32} {per:>14,}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
