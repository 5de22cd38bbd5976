"""``sessionhub.toml`` through real processes: ``config check`` and ``init``, and a real
``sessionhub serve --config`` whose templates a worker over the socket and an MCP client
see and use, whose frozen prompt is the engine's golden one, and whose flags beat the file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from clients import HubClient
from hub import FileSkillProvider, SqliteStore, StoreSearchProvider
from protocol.errors import InvalidInput
from tests.apps.test_cli import run, serve

GOLDEN = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "golden" / "prompts.json").read_text(encoding="utf-8")
)
ALL_KINDS = next(c for c in GOLDEN["cases"] if c["name"] == "all_kinds_in_declaration_order")

#: The golden case ``all_kinds_in_declaration_order`` as a template, block for block.
CONFIG = """\
default_template = "all"

[serve]
port = 9                    # a privileged port: --port 0 on the command line must win
log_level = "info"

[templates.all]
prompt_cache = true

[[templates.all.blocks]]
label = "soul"
text = "You are a helpful assistant."

[[templates.all.blocks]]
label = "empty"
file = "empty.txt"

[[templates.all.blocks]]
label = "memory"
description = "Learned facts"
max_tokens = 1100
readonly = false
text = "Likes tea."

[[templates.all.blocks]]
label = "scratch"

[[templates.all.blocks]]
label = "knowledge"
description = "Team wiki"
search = true

[[templates.all.blocks]]
label = "skills"
skills = "skills"

[templates.bare]
"""

MISTAKES = """\
default_template = "nope"
colour = 1
[serve]
prot = 8000
port = "x"
max_body_bytes = "lots"
[compaction]
url = 5
api_key_env = "not a name"
[templates.a]
prompt_cache = "yes"
[[templates.a.blocks]]
lable = "x"
[[templates.a.blocks]]
label = "soul"
readonly = true
[[templates.a.blocks]]
label = "k"
skills = "missing"
max_tokens = 0
[[templates.a.blocks]]
label = "twice"
text = "a"
search = true
"""


async def _hub_files(tmp_path: Path) -> Path:
    """The config beside what its blocks read: an empty file, a skills folder, wiki entries."""
    (tmp_path / "empty.txt").write_text("")
    skills = FileSkillProvider(tmp_path / "skills")
    await skills.set(
        "code-review", "# Code review\nCheck tests first, then naming.", "How to review a pull request"
    )
    await skills.set("debugging", "# Debugging\nReproduce, bisect, fix.")
    async with await SqliteStore.open(str(tmp_path / "hub.db")) as store:
        wiki = StoreSearchProvider(store, "knowledge")
        await wiki.set("deploy-guide", "Deployments use blue/green rollouts.")
        await wiki.set("oncall", "Pager rotation is weekly.")
    config = tmp_path / "sessionhub.toml"
    config.write_text(CONFIG)
    return config


def test_config_check_prints_every_mistake_with_its_key_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(MISTAKES)
    result = run("config", "check", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    paths = [line.split(": ")[1] for line in result.stderr.splitlines()]
    assert paths == [
        "colour",
        "serve.prot",
        "serve.port",
        "serve.max_body_bytes",
        "compaction.url",
        "compaction.api_key_env",
        "templates.a.prompt_cache",
        "templates.a.blocks[0].lable",
        "templates.a.blocks[0].label",
        "templates.a.blocks[1].readonly",
        "templates.a.blocks[2].max_tokens",
        "templates.a.blocks[2].skills",
        "templates.a.blocks[3].search",
        "default_template",
    ]
    assert "serve.prot: unknown key (did you mean port?)" in result.stderr
    assert "blocks[0].lable: unknown key (did you mean label?)" in result.stderr


def test_config_check_words_cross_checks_with_key_paths(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text('[serve]\nport = 99999\n[compaction]\nurl = "http://127.0.0.1:1/v1"\n')
    result = run("config", "check", str(path))
    assert result.returncode == 2
    # serve's own checks run on the merged options and name the file's keys, not flags.
    assert (
        result.stderr.strip()
        == f"{path}: serve.port: serve.port 99999 is not a port (0-65535; 0 picks a free one)"
    )


def test_config_check_never_echoes_a_secret(tmp_path: Path) -> None:
    """A secret in the wrong shape (a list), an API key pasted where its variable's name
    belongs, a DSN's password: the mistakes are reported, the values not."""
    path = tmp_path / "secrets.toml"
    path.write_text(
        '[serve]\nauth_secret = ["hunter2-auth-SECRET-of-32-bytes-at-least"]\n'
        'db = ["postgresql://app:hunter2pw@db.internal/app"]\n'
        '[compaction]\nurl = "http://127.0.0.1:1/v1"\nmodel = "m"\napi_key_env = "sk-live-hunter2KEY"\n'
    )
    result = run("config", "check", str(path))
    assert result.returncode == 2
    assert "hunter2" not in result.stderr, result.stderr
    assert f"{path}: serve.auth_secret: must be a string or a number, got a list" in result.stderr
    assert (
        "serve.db: must be a string or a number, got ['postgresql://app:***@db.internal/app']"
        in result.stderr
    )
    assert "compaction.api_key_env: must name an environment variable, got a str" in result.stderr


def test_init_writes_a_starter_that_checks_and_is_not_overwritten(tmp_path: Path) -> None:
    made = run("init", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    starter = tmp_path / "sessionhub.toml"
    assert starter.read_text().startswith("# sessionhub.toml")
    checked = run("config", "check", "sessionhub.toml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "templates: assistant, default assistant" in checked.stdout
    again = run("init", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip() == "sessionhub: sessionhub.toml exists; pass --force to overwrite it"


def test_serve_refuses_a_bad_file_with_every_mistake(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[serve]\nprot = 1\n[templates.t]\nblocks = 3\n")
    result = run("serve", "--config", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"sessionhub: {path}: serve.prot: unknown key (did you mean port?)",
        f"sessionhub: {path}: templates.t.blocks: must be an array of tables ([[templates.NAME.blocks]])",
    ]
    missing = run("serve", env={"SESSIONHUB_CONFIG": str(tmp_path / "none.toml")}, cwd=tmp_path)
    assert missing.returncode == 2
    assert "none.toml: cannot read it: No such file or directory" in missing.stderr


async def test_served_template_renders_the_golden_prompt_and_its_tools_work(tmp_path: Path) -> None:
    config = await _hub_files(tmp_path)
    async with serve("--config", str(config), "--db", str(tmp_path / "hub.db")) as url, HubClient(url) as hub:
        info = await hub.sessions.create("chat")  # the default template
        session = hub.session(info.id)
        assert await session.freeze_system_prompt() == ALL_KINDS["prompt"]
        tools = {t.name: t for t in await session.tools()}
        assert sorted(tools) == ["load_context", "search_context", "set_context", "unload_context"]
        done = await tools["set_context"].execute({"label": "memory", "content": "Likes coffee."})
        assert not done.startswith("Error"), done
        assert (await session.get_context_block("memory")).content == "Likes coffee."  # type: ignore[union-attr]
        found = await tools["search_context"].execute({"label": "knowledge", "query": "rotation"})
        assert "Pager rotation is weekly." in found
        # Frozen: the write changed the block, not the prompt.
        assert await session.freeze_system_prompt() == ALL_KINDS["prompt"]

        bare = await hub.sessions.create("plain", template="bare")
        assert await hub.session(bare.id).tools() == []
        assert await hub.session(bare.id).freeze_system_prompt() == ""
        with pytest.raises(InvalidInput) as refused:
            await hub.sessions.create("x", template="nope")
        assert "unknown template 'nope'; this hub's templates: all, bare" in str(refused.value)
        assert [s.name for s in await hub.sessions.list()] == ["plain", "chat"]  # nothing created


async def test_an_mcp_client_sees_and_uses_the_memory_tools(tmp_path: Path) -> None:
    config = await _hub_files(tmp_path)
    async with serve("--config", str(config), "--db", str(tmp_path / "hub.db")) as url:
        async with HubClient(url) as hub:
            session_id = (await hub.sessions.create("chat")).id
        mcp_url = url.replace("ws://", "http://").removesuffix("/ws") + "/mcp"
        async with (
            httpx2.AsyncClient(timeout=10) as http,
            streamable_http_client(mcp_url, http_client=http) as (read, write),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            names = {t.name for t in (await mcp.list_tools()).tools}
            assert {"set_context", "load_context", "search_context"} <= names
            arguments: dict[str, Any] = {
                "session_id": session_id,
                "label": "memory",
                "content": "Owns a cat.",
            }
            result = await mcp.call_tool("set_context", arguments)
            assert not result.is_error
            loaded = await mcp.call_tool(
                "load_context", {"session_id": session_id, "label": "skills", "key": "debugging"}
            )
            assert "Reproduce, bisect, fix." in loaded.content[0].text  # type: ignore[union-attr]
            # An unknown tool is named as such, with or without a session (issue 29 §2).
            for extra in ({}, {"session_id": session_id}):
                unknown = await mcp.call_tool("nope", extra)
                assert unknown.is_error
                said = unknown.content[0].text  # type: ignore[union-attr]
                assert said.startswith('Error: unknown tool "nope". The tools are: '), said
                assert "set_context" in said and "append_message" in said, said
                assert "set_context" in said
        async with HubClient(url) as hub:
            block = await hub.session(session_id).get_context_block("memory")
            assert block is not None and block.content == "Owns a cat."


async def test_debug_prints_the_effective_configuration_with_secrets_masked(tmp_path: Path) -> None:
    secret = "s" * 40
    config = tmp_path / "c.toml"
    config.write_text(
        f'[serve]\nauth_secret = "{secret}"\nmax_body_bytes = "1M"\n[compaction]\nsummarizer = "workers"\n'
    )
    lines: list[str] = []
    async with serve(
        "--config", str(config), "--db", str(tmp_path / "hub.db"), "--log-level", "debug", lines=lines
    ):
        pass
    text = "\n".join(lines)
    assert "effective configuration (secrets masked)" in text
    assert 'auth_secret = "***"' in text and secret not in text
    assert "max_body_bytes = 1048576" in text
    assert 'summarizer = "workers"' in text
    assert "port = 0" in text  # the flag, over the default


def test_flags_beat_the_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hub.apps import cli
    from hub.apps.configfile import apply_config

    config = tmp_path / "c.toml"
    config.write_text('[serve]\ndb = "file.db"\nport = 1234\nhost = "localhost"\n')
    monkeypatch.setenv("SESSIONHUB_DB", "env.db")
    argv = ["serve", "--config", str(config), "--host", "127.0.0.1"]
    args = cli._parser().parse_args(argv)
    args.typed = argv
    apply_config(args)
    assert (args.db, args.port, args.host) == ("env.db", 1234, "127.0.0.1")


async def test_sessions_create_rename_end_delete_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hub.apps import cli
    from tests.apps.test_cli import arun, one_line

    async def sessions(*argv: str) -> tuple[int, str, str]:
        # In process (a thread: main runs its own loop); the real process is tested above.
        code = await asyncio.to_thread(cli.main, ["sessions", *argv, "--url", url])
        out, err = capsys.readouterr()
        return code, out, err

    config = await _hub_files(tmp_path)
    async with serve("--config", str(config), "--db", str(tmp_path / "hub.db")) as url:
        made = await arun("sessions", "--url", url, "create", "notes", "--template", "bare")
        assert made.returncode == 0, made.stderr
        session_id = made.stdout.strip()
        unknown = await arun("sessions", "create", "x", "--template", "nope", "--url", url)
        assert unknown.returncode == 2
        assert "unknown template 'nope'; this hub's templates: all, bare" in one_line(unknown)
        code, out, _ = await sessions("rename", session_id, "journal")
        assert code == 0 and "'journal'" in out
        code, out, _ = await sessions("end", session_id, "--reason", "done")
        assert code == 0 and "ended:done" in out
        async with HubClient(url) as hub:
            assert await hub.session(session_id).tools() == []  # bare, not the default
        code, out, _ = await sessions("delete", session_id)
        assert code == 0 and out.strip() == f"deleted {session_id}"
        code, _, err = await sessions("delete", session_id)
        assert code == 5 and f"no session {session_id!r}" in err


def test_the_docs_list_every_key_with_its_default() -> None:
    from hub.apps.configref import BEGIN, END, reference

    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    generated = page[page.index(BEGIN) : page.index(END) + len(END)]
    # Regenerate with: python -m hub.apps.configref (a new serve option is a new key).
    assert generated == reference()
    for action in __import__("hub.apps.configfile", fromlist=["x"]).serve_actions():
        assert f"| `{action.dest}` |" in generated or action.dest.startswith(("summarizer", "compact"))
