"""Test helpers for turns and the chat endpoints: a scripted responder (a real
``HubClient`` iterating ``turns()``) and an SSE reader over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2

from clients import HubClient, Turn

__all__ = ["BIG_PIECE", "answer", "responder", "sse_chunks"]

#: The characters a "big" reply's deltas repeat, one per delta in turn.
BIG_PIECE = "abcdefghij"


async def answer(turn: Turn) -> None:
    """Reply by the user's text (see tests/js/chat.test.mjs for the script)."""
    asked = turn.history[-1].text() if turn.history else ""
    metadata = {"model": "scripted"} if asked.startswith("parts") else None
    async with turn.reply(metadata) as st:
        if asked.startswith("tool"):
            await st.reasoning("Let me look that up.")
            call = {"type": "tool-lookup", "toolCallId": "call-1", "input": {"q": asked}}
            await st.tool_part({**call, "state": "input-available"})
            await st.tool_part({**call, "state": "output-available", "output": {"found": 3}})
            await st.text("Found 3.")
        elif asked.startswith("approve"):
            # Human in the loop: ask, wait for the user's answer, act on it.
            call = {"type": "tool-deploy", "toolCallId": f"call-{turn.turn_id[:8]}", "input": {"what": asked}}
            approval = f"ap-{turn.turn_id[:8]}"
            await st.text("Deploy needs your approval.")
            await st.tool_part({**call, "state": "input-available"})
            await st.tool_part({**call, "state": "approval-requested", "approval": {"id": approval}})
            answer = await st.approval(approval)
            if answer.approved:
                await st.tool_part(
                    {
                        **call,
                        "state": "output-available",
                        "output": {"deployed": True},
                        "approval": {"id": approval, "approved": True},
                    }
                )
                await st.text("Deployed.")
            else:
                await st.tool_part(
                    {
                        **call,
                        "state": "output-denied",
                        "approval": {"id": approval, "approved": False, "reason": answer.reason},
                    }
                )
                await st.text(f"Not deployed: {answer.reason or 'denied'}.")
        elif asked.startswith("client"):
            # A client-side tool: the page runs it and sends its output back.
            call_id = f"loc-{turn.turn_id[:8]}"
            await st.tool_part(
                {"type": "tool-locate", "toolCallId": call_id, "input": {}, "state": "input-available"}
            )
            where = await st.tool_output(call_id)
            await st.text(f"You are in {where}.")
        elif asked.startswith("steer"):
            # Works until the user steers it (steer_turn), then says what it was told.
            await st.text("Working")
            async with asyncio.timeout(10):
                async for message in turn.steering():
                    await st.text(f" -> told: {message.text()}")
                    break
            await st.text(" Done.")
        elif asked.startswith("parts"):
            # AI SDK 7's parts beyond text and tools, a retried step among them.
            await st.part({"type": "step-start"})
            await st.text("first try")
            await st.reset_step()
            await st.text("second try")
            await st.part({"type": "custom", "kind": "acme.note"})
            await st.part({"type": "data-weather", "id": "w1", "data": {"c": 20}})
            await st.part({"type": "data-weather", "id": "w1", "data": {"c": 21}})
            await st.part(
                {
                    "type": "reasoning-file",
                    "mediaType": "image/png",
                    "url": "data:image/png;base64,iVBORw0KGgo=",
                }
            )
            await st.part({"type": "source-url", "sourceId": "s1", "url": "https://example.com/"})
        elif asked.startswith("slow"):
            for i in range(40):
                await st.text(f"w{i} ")
                await asyncio.sleep(0.04)
        elif asked.startswith("big"):
            # "big N": N KiB of text in 64 KiB deltas, paced so that the turn is still in
            # flight when a second reader joins.
            for i in range(int(asked.split()[1]) // 64):
                await st.text(BIG_PIECE[i % 10] * (64 << 10))
                await asyncio.sleep(0.005)
        elif asked.startswith("fail"):
            await st.text("Thinking")
            raise RuntimeError("the model is down")
        else:
            for piece in ("You said: ", asked[: len(asked) // 2], asked[len(asked) // 2 :]):
                await st.text(piece)


@contextlib.asynccontextmanager
async def responder(
    url: str, ready: Callable[[], bool], token: str | None = None, name: str = "agent"
) -> AsyncIterator[HubClient]:
    """A connected responder answering every turn with :func:`answer`, concurrently.
    ``ready()`` tells when the hub counts it (e.g. ``lambda: len(hub.turns.responders) == 1``)."""
    async with HubClient(url, token=token, name=name, role="worker") as client:
        tasks: set[asyncio.Task[None]] = set()
        started = asyncio.Event()

        async def run() -> None:
            turns = client.turns()
            first = asyncio.ensure_future(anext(turns))
            await asyncio.sleep(0)
            started.set()
            turn = await first
            while True:
                task = asyncio.create_task(_quietly(answer(turn)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                turn = await anext(turns)

        loop = asyncio.create_task(run())
        async with asyncio.timeout(5):
            await started.wait()
            while not ready():
                await asyncio.sleep(0.005)
        try:
            yield client
        finally:
            loop.cancel()
            for task in [loop, *tasks]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                    await task


async def _quietly(coro: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the scripted failure
        await coro


async def sse_chunks(response: httpx2.Response) -> AsyncIterator[dict[str, Any] | str]:
    """The chunks of a UI message stream response (``"[DONE]"`` last)."""
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            yield "[DONE]" if data == "[DONE]" else json.loads(data)
