"""Running sessionhub's tools in an agent loop, in the OpenAI and the Anthropic formats.

No network: the model's answers are written out as the dicts those SDKs return
(``response.choices[0].message.tool_calls`` and ``response.content``).
Run: ``.venv/bin/python docs/examples/tool_loop.py``
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from hub import ReadonlyText, Session, SqliteStore
from hub.tools import dispatch, to_anthropic, to_openai


async def main() -> None:
    async with await SqliteStore.open(":memory:") as store:
        session = (
            Session(store)
            .for_session("demo")
            .with_context("soul", provider=ReadonlyText("You are a helpful assistant."))
            .with_context("memory", description="Learned facts", max_tokens=200)
        )
        system_prompt = await session.freeze_system_prompt()
        tools = await session.tools()

        # -- OpenAI Chat Completions -------------------------------------------------------
        request: dict[str, Any] = {
            "model": "any",
            "messages": [{"role": "system", "content": system_prompt}],
            "tools": to_openai(tools),
        }
        print("openai tools:", [t["function"]["name"] for t in request["tools"]])
        # The assistant message the model sent back, as the SDK's .model_dump() gives it:
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "set_context",
                        "arguments": json.dumps({"label": "memory", "content": "User likes tea."}),
                    },
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "set_context", "arguments": '{"label": "soul", "content": "x"}'},
                },
            ],
        }
        request["messages"].append(assistant)
        for call in assistant["tool_calls"]:
            result = await dispatch(tools, call["function"]["name"], call["function"]["arguments"])
            request["messages"].append({"role": "tool", "tool_call_id": call["id"], "content": result})
            print("openai ->", result)

        # -- Anthropic Messages ------------------------------------------------------------
        anthropic_request: dict[str, Any] = {"system": system_prompt, "tools": to_anthropic(tools)}
        print("anthropic tools:", [t["name"] for t in anthropic_request["tools"]])
        content: list[dict[str, Any]] = [
            {"type": "text", "text": "Noting that."},
            {
                "type": "tool_use",
                "id": "toolu_1",
                "name": "set_context",
                "input": {"label": "memory", "content": "User deploys on Fridays.", "action": "append"},
            },
        ]
        results = []
        for block in content:
            if block["type"] == "tool_use":
                output = await dispatch(tools, str(block["name"]), block["input"])
                results.append({"type": "tool_result", "tool_use_id": block["id"], "content": output})
                print("anthropic ->", output)

        memory = await session.get_context_block("memory")
        print("memory now:", json.dumps(memory.content if memory else None))
        # The frozen prompt did not change: the model's prefix cache stays warm.
        print("prompt unchanged:", await session.freeze_system_prompt() == system_prompt)


if __name__ == "__main__":
    asyncio.run(main())
