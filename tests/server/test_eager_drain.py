"""A connection's drainer starts eagerly (hub/server/eager.py ``start_eagerly``): it
writes in the call that queues a frame, and becomes a task only when it has to wait. These
pin the two halves: no task when nothing waits, and a waiting drainer that a task carries on
to the end, or cancels, exactly as if it had been a task from the start."""

from __future__ import annotations

import asyncio

from hub.server.eager import start_eagerly


async def test_a_coroutine_that_never_waits_runs_in_the_call_and_leaves_no_task() -> None:
    ran: list[int] = []

    async def body() -> None:
        ran.append(1)

    assert start_eagerly(body()) is None
    assert ran == [1]  # before any loop iteration


async def test_a_coroutine_that_waits_is_carried_on_by_a_task_through_every_wait() -> None:
    writable = asyncio.Event()
    sent: list[int] = []

    async def drain() -> None:
        for i in range(3):
            await writable.wait()  # uvicorn's send waits like this under flow control
            writable.clear()
            sent.append(i)

    task = start_eagerly(drain())
    assert task is not None and sent == []
    for i in range(3):
        writable.set()
        async with asyncio.timeout(5):
            while len(sent) <= i:
                await asyncio.sleep(0)
    await asyncio.wait_for(task, 5)
    assert sent == [0, 1, 2]


async def test_a_waiting_drainer_is_cancelled_inside_and_lets_go_of_what_it_waited_on() -> None:
    writable = asyncio.Event()
    seen: list[str] = []

    async def drain() -> None:
        try:
            await writable.wait()
        except asyncio.CancelledError:
            seen.append("cancelled inside")
            raise

    task = start_eagerly(drain())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        seen.append("task cancelled")
    assert seen == ["cancelled inside", "task cancelled"]
    assert not writable._waiters  # the Event's waiter went with the cancellation


async def test_an_error_in_what_it_waited_on_is_raised_inside_the_coroutine() -> None:
    failing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def drain() -> None:
        try:
            await failing
        except ConnectionResetError:
            seen.append("raised inside")

    task = start_eagerly(drain())
    assert task is not None
    failing.set_exception(ConnectionResetError())
    await asyncio.wait_for(task, 5)
    assert seen == ["raised inside"]
