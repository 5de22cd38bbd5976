"""``sessionhub serve``'s compaction options (hub/apps/serve_compaction.py), through real ``serve``
processes: an OpenAI-compatible server (a real local one speaking chat completions) or a
connected worker writes the summaries, ``--compact-after`` compacts by itself, the
``compact`` op summarizes, and every bad combination is one line and exit code 2."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from clients import HubClient
from protocol import Compaction, InvalidInput
from tests.apps.test_cli import one_line, run, serve
from tests.support.hubtest import Client, is_event, served, text

SUMMARY = "## Topic\nThe deploy plan, summarized by the model."
WORDS = "we keep talking about the deploy on friday and what could go wrong with it " * 3


@dataclass
class Model:
    """A chat-completions server: what it was asked, and with which headers."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def model() -> AsyncIterator[Model]:
    seen = Model()

    async def chat(request: Request) -> Response:
        seen.requests.append(await request.json())
        seen.headers.append(dict(request.headers))
        message = {"role": "assistant", "content": SUMMARY}
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": message}],
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    async with served(app=app) as server:
        seen.url = f"{server.url}/v1"
        yield seen


def turns(first: int, last: int) -> list[dict[str, Any]]:
    return [
        text(f"m{i}", f"turn {i}: {WORDS}", "user" if i % 2 == 0 else "assistant") for i in range(first, last)
    ]


async def compactions(hub: HubClient, session_id: str, timeout: float = 15) -> list[Compaction]:
    """The session's overlays, once there is one (automatic compaction runs after the append)."""
    async with asyncio.timeout(timeout):
        while not (found := await hub.sessions.get_compactions(session_id)):
            await asyncio.sleep(0.05)
    return found


def texts(messages: list[Any]) -> list[str]:
    return [p["text"] for m in messages for p in m.parts if p.get("type") == "text"]


# -- an OpenAI-compatible server -------------------------------------------------------------


async def test_a_session_past_compact_after_is_summarized_by_the_url(tmp_path: Path, model: Model) -> None:
    options = ["--summarizer-url", model.url, "--summarizer-model", "fake-model"]
    options += ["--compact-after", "400", "--compact-tail-tokens", "10"]
    env = {"SESSIONHUB_SUMMARIZER_API_KEY": "sk-from-the-environment"}
    async with serve("--db", str(tmp_path / "hub.db"), *options, env=env) as url, HubClient(url) as hub:
        info = await hub.sessions.create("long")
        await hub.sessions.append_all(info.id, turns(0, 4))  # ~200 tokens: under the threshold
        await asyncio.sleep(0.3)
        assert model.requests == [] and await hub.sessions.get_compactions(info.id) == []

        await hub.sessions.append_all(info.id, turns(4, 10))
        (overlay,) = await compactions(hub, info.id)
        assert overlay.summary == SUMMARY
        # The head (3 messages) and the tail (the newest 2) are kept; the middle is the summary.
        assert (overlay.from_message_id, overlay.to_message_id) == ("m3", "m7")
        history = await hub.sessions.get_history(info.id)
        assert [m.id for m in history] == ["m0", "m1", "m2", f"compaction_{overlay.id}", "m8", "m9"]
        assert SUMMARY in texts(history)
        (asked,) = model.requests
        assert (
            asked["model"] == "fake-model" and "turn 5: we keep talking" in asked["messages"][-1]["content"]
        )
        assert model.headers[0]["authorization"] == "Bearer sk-from-the-environment"


async def test_the_compact_op_summarizes_and_nothing_compacts_by_itself(tmp_path: Path, model: Model) -> None:
    options = ["--summarizer-url", model.url, "--summarizer-model", "m", "--compact-tail-tokens", "10"]
    async with serve("--db", str(tmp_path / "hub.db"), *options) as url, HubClient(url) as hub:
        info = await hub.sessions.create("by hand")
        await hub.sessions.append_all(info.id, turns(0, 10))
        await asyncio.sleep(0.3)
        assert model.requests == []  # no --compact-after: only when asked
        result = await hub.session(info.id).compact()
        assert result is not None and result["summary"] == SUMMARY
        assert [c.summary for c in await hub.sessions.get_compactions(info.id)] == [SUMMARY]
        assert "authorization" not in model.headers[0]  # no key in the environment, none sent


async def test_without_the_options_there_is_no_summarizer(tmp_path: Path) -> None:
    async with serve("--db", str(tmp_path / "hub.db")) as url, HubClient(url) as hub:
        info = await hub.sessions.create("plain")
        await hub.sessions.append_all(info.id, turns(0, 10))
        with pytest.raises(InvalidInput, match="this hub has no summarizer, so it cannot compact"):
            await hub.session(info.id).compact()
        assert await hub.sessions.get_compactions(info.id) == []


# -- connected workers -----------------------------------------------------------------------


async def test_a_worker_writes_the_summary_past_compact_after(tmp_path: Path) -> None:
    prompts: list[str] = []

    async def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Topic\nSummarized by worker w1."

    options = ["--summarizer", "workers", "--compact-after", "400", "--compact-tail-tokens", "10"]
    async with (
        serve("--db", str(tmp_path / "hub.db"), *options) as url,
        HubClient(url, name="w1", role="worker", summarize=summarize),
        HubClient(url) as ui,
    ):
        await asyncio.sleep(0.1)  # the worker's hello is in
        info = await ui.sessions.create("long")
        await ui.sessions.append_all(info.id, turns(0, 10))
        (overlay,) = await compactions(ui, info.id)
        assert overlay.summary == "## Topic\nSummarized by worker w1."
        assert "turn 5: we keep talking" in prompts[0]
        assert "## Topic\nSummarized by worker w1." in texts(await ui.sessions.get_history(info.id))
        # Past the threshold again: the worker is asked to update its summary.
        await ui.sessions.append_all(info.id, turns(10, 16))
        async with asyncio.timeout(15):
            while len(prompts) < 2:
                await asyncio.sleep(0.05)
        assert "Summarized by worker w1." in prompts[1] and "turn 11: we keep talking" in prompts[1]


async def test_summarizer_timeout_bounds_a_silent_worker(tmp_path: Path) -> None:
    options = ["--summarizer", "workers", "--summarizer-timeout", "0.5", "--compact-tail-tokens", "10"]
    async with (
        serve("--db", str(tmp_path / "hub.db"), *options) as url,
        Client.connect(url) as silent,
        Client.connect(url) as ui,
    ):
        await silent.call("hello", name="silent", summarizer=True)  # asked, never answers
        sid = (await ui.call("create", name="s"))["id"]
        await ui.call("append_all", session_id=sid, messages=turns(0, 10))
        await ui.subscribe(sid)
        started = asyncio.get_running_loop().time()
        assert await ui.call("compact", session_id=sid) is None
        assert asyncio.get_running_loop().time() - started < 5  # not the 60 s default
        failed = await ui.take(lambda f: is_event(f) and f["type"] == "error")
        assert "worker silent did not answer within 0.5s" in failed["data"]["error"]
        assert [f for f in silent.received if f["frame"] == "summarize"]


# -- mistakes --------------------------------------------------------------------------------

NEEDS = "needs a summarizer: --summarizer workers, or --summarizer-url URL --summarizer-model MODEL"


def _bad_url(
    url: str, says: str = "--summarizer-url must be an http:// or https:// URL with a host"
) -> tuple[list[str], dict[str, str], str]:
    """A case of the table below: ``--summarizer-url url`` (with a model), and what it says."""
    return (["--summarizer-url", url, "--summarizer-model", "m"], {}, says)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--compact-after", "1000"], {}, f"--compact-after {NEEDS}"),
        (["--compact-tail-tokens", "10"], {}, f"--compact-tail-tokens {NEEDS}"),
        (["--summarizer-timeout", "5"], {}, f"--summarizer-timeout {NEEDS}"),
        (["--compact-after", "0"], {}, "argument --compact-after: must be at least 1, not 0"),
        (["--summarizer", "llm"], {}, "argument --summarizer: invalid choice: 'llm'"),
        (
            [
                "--summarizer",
                "workers",
                "--summarizer-url",
                "http://127.0.0.1:9/v1",
                "--summarizer-model",
                "m",
            ],
            {},
            "--summarizer and --summarizer-url are two summarizers: pick one",
        ),
        (
            ["--summarizer-url", "http://127.0.0.1:9/v1"],
            {},
            "--summarizer-url needs --summarizer-model MODEL",
        ),
        (["--summarizer-model", "m"], {}, "--summarizer-model needs --summarizer-url BASE_URL"),
        _bad_url("ftp://host/v1"),
        _bad_url("http://[::1/v1"),
        _bad_url("http://host:99999/v1"),
        _bad_url(
            "http://me:hunter2@host/v1",
            "--summarizer-url must not carry credentials: put the API key in $SESSIONHUB_SUMMARIZER_API_KEY",
        ),
        (
            ["--summarizer", "workers", "--summarizer-timeout", "0"],
            {},
            "--summarizer-timeout 0.0 must be above 0",
        ),
        (
            ["--summarizer", "workers", "--summarizer-timeout", "inf"],
            {},
            "--summarizer-timeout inf is not a finite",
        ),
        (["--summarizer-api-key", "sk-x"], {}, "unrecognized arguments: --summarizer-api-key sk-x"),
        # From the environment: the line says where the value came from.
        ([], {"SESSIONHUB_SUMMARIZER": "worker"}, "--summarizer ($SESSIONHUB_SUMMARIZER) 'worker' is not a"),
        (
            ["--summarizer", "workers"],
            {"SESSIONHUB_SUMMARIZER_URL": "http://127.0.0.1:9/v1", "SESSIONHUB_SUMMARIZER_MODEL": "m"},
            "--summarizer and --summarizer-url ($SESSIONHUB_SUMMARIZER_URL) are two summarizers",
        ),
        (
            ["--compact-after", "100"],
            {"SESSIONHUB_SUMMARIZER_URL": "http://127.0.0.1:9/v1"},
            "--summarizer-url ($SESSIONHUB_SUMMARIZER_URL) needs --summarizer-model",
        ),
    ],
)
def test_bad_combinations_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], says: str
) -> None:
    result = run("serve", "--db", str(tmp_path / "hub.db"), "--port", "0", *args, env=env, cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result)
    assert says in line
    assert "hunter2" not in line  # a URL's password is never echoed
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # checked before anything starts


def test_the_options_and_the_key_variable_are_in_help() -> None:
    result = run("serve", "--help")
    assert result.returncode == 0
    for name in ("--summarizer {workers}", "--summarizer-url BASE_URL", "--compact-after TOKENS"):
        assert name in result.stdout
    assert "$SESSIONHUB_SUMMARIZER_API_KEY" in result.stdout
