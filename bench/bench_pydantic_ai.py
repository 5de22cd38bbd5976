"""A Pydantic AI conversation kept in the hub: what ``load()`` and ``save()`` cost per run.

Prints figures, asserts nothing. Run from the repository root:

    .venv/bin/python bench/bench_pydantic_ai.py [--turns 50] [--repeat 3] [--json]

A real ``pydantic_ai.Agent`` with an offline ``FunctionModel`` that calls a tool once per
turn (so each run adds four messages: the prompt, the call, its result, the answer), on a
fresh SQLite file each repeat, over an in-process ``SessionManager``. Each turn:
``load()`` the history, run the agent on it, ``save(result.new_messages())``. Reported, as the
median over the repeats of each turn's time (ms): the first ten turns and the last ten.

Beside it, the same turns kept the way Pydantic AI's docs show without a store: the run's
``all_messages_json()`` in one row of a SQLite table (``sqlite3``, WAL, one commit per save),
read back with ``ModelMessagesTypeAdapter.validate_json``. That keeps the bytes only; the hub
also projects each message into the session's tree, logs its event and indexes it for search.

Last, ``capability()`` (saves after each step of the run): the whole run's time with it,
beside a run with ``load()``/``save()`` around it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

from clients.pydantic_ai import HubMessageHistory  # noqa: E402
from hub import SessionManager, SqliteStore  # noqa: E402
from tests.clients.pydantic_ai_worker import get_weather, weather_model  # noqa: E402

Turn = Callable[[int], Awaitable[tuple[float, float]]]


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def _hub_turns(turns: int, db: Path, capability: bool) -> list[tuple[float, float, float]]:
    """(load ms, save ms, whole turn ms) of each turn over the hub."""
    out: list[tuple[float, float, float]] = []
    async with await SqliteStore.open(db) as store:
        history = await HubMessageHistory.create(SessionManager(store), "bench")
        caps = [history.capability()] if capability else []
        agent = Agent(FunctionModel(weather_model), tools=[get_weather], capabilities=caps)
        for turn in range(turns):
            start = time.perf_counter()
            messages = await history.load()
            load = _ms(start)
            result = await agent.run(f"Weather, turn {turn}?", message_history=messages)
            saving = time.perf_counter()
            await history.save(result.new_messages())
            out.append((load, _ms(saving), _ms(start)))
    return out


async def _row_turns(turns: int, db: Path) -> list[tuple[float, float, float]]:
    """The same turns, the whole history as one JSON row of a SQLite table."""
    out: list[tuple[float, float, float]] = []
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE conversations (id TEXT PRIMARY KEY, messages BLOB NOT NULL)")
    conn.execute("INSERT INTO conversations VALUES ('bench', '[]')")
    conn.commit()
    agent = Agent(FunctionModel(weather_model), tools=[get_weather])
    try:
        for turn in range(turns):
            start = time.perf_counter()
            (blob,) = conn.execute("SELECT messages FROM conversations WHERE id = 'bench'").fetchone()
            messages: list[ModelMessage] = ModelMessagesTypeAdapter.validate_json(blob)
            load = _ms(start)
            result = await agent.run(f"Weather, turn {turn}?", message_history=messages)
            saving = time.perf_counter()
            conn.execute(
                "UPDATE conversations SET messages = ? WHERE id = 'bench'", (result.all_messages_json(),)
            )
            conn.commit()
            out.append((load, _ms(saving), _ms(start)))
    finally:
        conn.close()
    return out


def _window(runs: list[list[tuple[float, float, float]]], which: slice, column: int) -> float:
    """The median over repeats of the median of one column over a window of turns."""
    return statistics.median(statistics.median(turn[column] for turn in run[which]) for run in runs)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[list[tuple[float, float, float]]]] = {"hub": [], "row": [], "capability": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeat):
            results["hub"].append(await _hub_turns(args.turns, Path(tmp) / f"hub{repeat}.db", False))
            results["row"].append(await _row_turns(args.turns, Path(tmp) / f"row{repeat}.db"))
            results["capability"].append(await _hub_turns(args.turns, Path(tmp) / f"cap{repeat}.db", True))
    first, last = slice(0, 10), slice(-10, None)
    figures: dict[str, Any] = {}
    for name, runs in results.items():
        figures[name] = {
            "load_first10_ms": _window(runs, first, 0),
            "load_last10_ms": _window(runs, last, 0),
            "save_first10_ms": _window(runs, first, 1),
            "save_last10_ms": _window(runs, last, 1),
            "turn_first10_ms": _window(runs, first, 2),
            "turn_last10_ms": _window(runs, last, 2),
        }
    if args.json:
        print(json.dumps({"turns": args.turns, "repeat": args.repeat, **figures}, indent=2))
        return
    print(f"{args.turns} turns (4 messages each), median of {args.repeat} repeats, ms per turn")
    heads = ("load 1-10", "load last10", "save 1-10", "save last10", "turn last10")
    print(f"{'':28} " + " ".join(f"{head:>12}" for head in heads))
    labels = {
        "hub": "hub load()/save()",
        "row": "one JSON row (sqlite3)",
        "capability": "hub capability() + load()",
    }
    for name, row in figures.items():
        print(
            f"{labels[name]:28} {row['load_first10_ms']:12.2f} {row['load_last10_ms']:12.2f} "
            f"{row['save_first10_ms']:12.2f} {row['save_last10_ms']:12.2f} {row['turn_last10_ms']:12.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
