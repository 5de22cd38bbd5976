"""The chat doors across hub nodes: two ``sessionhub serve`` processes on one Postgres (the
Postgres bus), a responder on node A, readers on node B. One pair of nodes for all of it:
they take seconds to start.

- Cloudflare's client in a tab on each node (tests/js7/cf-agents-nodes.test.mjs): messages,
  a reply streaming and a clear reach the other node's tab (hub/adapters/cf_rooms.py).
- An AG-UI follower on node B (``?follow=1``) gets the runs posted on node A, each whole,
  found in the shared log (hub/adapters/aguifollow.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx2
import pytest

from tests.support.chatkit import responder
from tests.support.nodes import Node, scratch_database
from tests.support.nodetests import JS7, node22, run_node_tests
from tests.support.services import postgres_dsn


def _run(thread: str, text: str) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": str(uuid.uuid4()),
        "messages": [{"id": str(uuid.uuid4()), "role": "user", "content": text}],
    }


@pytest.mark.timeout(120)
async def test_tabs_and_followers_on_another_node() -> None:
    node = node22()
    async with (
        scratch_database(postgres_dsn()) as database,
        Node(database, "postgres", None, "--turn-timeout", "20") as a,
        Node(database, "postgres", None, "--turn-timeout", "20") as b,
        responder(a.ws_url, lambda: True),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        url_a, url_b = f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}"
        await run_node_tests(
            node,
            JS7 / "cf-agents-nodes.test.mjs",
            {"SESSIONHUB_URL": url_a, "SESSIONHUB_URL_B": url_b},
            passes=1,
        )

        thread = "t-" + uuid.uuid4().hex
        async with http.stream("GET", f"{url_b}/agui/{thread}/stream?follow=1") as follow:
            assert follow.status_code == 200
            lines = follow.aiter_lines()

            async def run_events() -> list[dict[str, Any]]:
                events: list[dict[str, Any]] = []
                async for line in lines:
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                            return events
                raise AssertionError("the follow stream ended")

            assert [e["type"] for e in await run_events()][1] == "MESSAGES_SNAPSHOT"  # the sync run
            for text in ("hello nodes", "slow nodes"):
                async with http.stream("POST", f"{url_a}/agui", json=_run(thread, text)) as posted:
                    assert posted.status_code == 200
                    await posted.aread()
                events = await run_events()
                kinds = [e["type"] for e in events]
                assert kinds[:2] == ["RUN_STARTED", "MESSAGES_SNAPSHOT"] and kinds[-1] == "RUN_FINISHED", (
                    kinds
                )
                assert events[1]["messages"][-1]["content"] == text
                said = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
                if text.startswith("slow"):
                    assert said.split() == [f"w{i}" for i in range(40)]
                else:
                    assert said == f"You said: {text}"
