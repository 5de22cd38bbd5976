"""Starting a coroutine eagerly: up to its first wait now, the rest in a task.

A connection's drainer starts this way (hub/server/socket_shell.py, ``kick``): a live push
to a subscriber whose socket has room is then one call, not a task created, scheduled and
run a loop iteration later (docs/benchmarks.md, "Eager drain")."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["start_eagerly"]


def start_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, up to its first wait; the rest, if it waits at all, in a task
    (what Python 3.12's eager task factory does, on 3.11). Returns that task, or None
    when ``coro`` finished without waiting."""
    try:
        first = coro.send(None)
    except StopIteration:
        return None
    except BaseException:
        coro.close()
        raise
    return asyncio.get_running_loop().create_task(_carry_on(coro, first))


async def _carry_on(coro: Coroutine[Any, Any, None], waiting: Any) -> None:
    """Drive ``coro`` on from a suspension, as a task would: wait for the future it
    yielded, then resume it (it takes the result itself), or throw the future's error or
    this task's cancellation into it."""
    while True:
        try:
            if waiting is None:  # a bare yield (asyncio.sleep(0)): one loop iteration
                await asyncio.sleep(0)
            else:
                # What a task does with a future its coroutine yielded: take it over
                # (clear the flag the yield set, or awaiting it here would be refused).
                waiting._asyncio_future_blocking = False
                await waiting
        except BaseException as exc:
            try:
                waiting = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                waiting = coro.send(None)
            except StopIteration:
                return
