"""What a session template costs: the first use of a session's blocks (the frozen prompt)
with its blocks from a template (one more store read: the session's recorded template)
against the same blocks given to the manager.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_templates.py [--sessions 500] [--runs 5]

On one SQLite file: ``--sessions`` sessions created, then a fresh manager (as after a
restart) freezes each session's prompt once; reported: the median over ``--runs`` runs of
the per-session time, in microseconds, for both ways of configuring the blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub import ReadonlyText, SessionManager, SqliteStore
from hub.templates import Template, TemplateBlock

SOUL = "You are a helpful assistant."


def by_template(store: SqliteStore) -> SessionManager:
    blocks = (TemplateBlock("soul", provider=ReadonlyText(SOUL)), TemplateBlock("memory", "Facts", 1100))
    return SessionManager(store).with_templates([Template("t", blocks)], default="t")


def by_manager(store: SqliteStore) -> SessionManager:
    manager = SessionManager(store).with_context("soul", provider=ReadonlyText(SOUL))
    return manager.with_context("memory", description="Facts", max_tokens=1100)


async def one_run(kind: str, sessions: int, folder: Path) -> float:
    build = by_template if kind == "template" else by_manager
    path = folder / f"{kind}-{time.monotonic_ns()}.db"
    async with await SqliteStore.open(path) as store:
        manager = build(store)
        ids = [(await manager.create(f"s{i}")).id for i in range(sessions)]
        fresh = build(store)  # a restart: nothing cached
        started = time.perf_counter()
        for session_id in ids:
            await fresh.get_session(session_id).freeze_system_prompt()
        return (time.perf_counter() - started) / sessions * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("manager", "template"):
            times = [await one_run(kind, args.sessions, Path(tmp)) for _ in range(args.runs)]
            print(
                f"{kind:>8}: first freeze_system_prompt per session, median of {args.runs}: "
                f"{statistics.median(times):.0f} us (runs: {', '.join(f'{t:.0f}' for t in times)})"
            )


if __name__ == "__main__":
    asyncio.run(main())
