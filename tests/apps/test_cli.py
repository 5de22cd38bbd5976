"""The ``sessionhub`` command as an operator meets it: real processes, one line on stderr
and a documented exit code for every mistake, never a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path

import pytest

from clients import HubClient
from hub.apps.cli import EXIT_CODES
from hub.auth import verify_token
from tests.support.services import redis_url

SECRET = "a-cli-test-secret-that-is-long-enough-for-hs256"
#: This checkout first on the path, whatever the subprocess's working directory.
ROOT = str(Path(__file__).resolve().parents[2])


def environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", **(extra or {})}


def run(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub.apps.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ(env),
        cwd=cwd,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserting it is one, and no traceback)."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("sessionhub"), lines[0]
    return lines[0]


@contextlib.asynccontextmanager
async def serve(
    *args: str, env: dict[str, str] | None = None, lines: list[str] | None = None
) -> AsyncIterator[str]:
    """A real ``sessionhub serve`` on a free port; yields its WebSocket URL once it listens
    (the stderr lines until then go to ``lines``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.apps.cli", "serve", "--port", "0", *args,
        stderr=subprocess.PIPE, env=environ(env),
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stderr.readline()).decode()
                assert line, "serve exited before listening"
                if lines is not None:
                    lines.append(line.rstrip("\n"))
                found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
                if found:
                    break
        yield f"ws://127.0.0.1:{found.group(1)}/ws"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(20):
            await proc.communicate()


# -- serve: options checked before anything starts ------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port", "99999"], "--port 99999 is not a port"),
        (["--port", "-1"], "--port -1 is not a port"),
        (["--port", "abc"], "argument --port: invalid int value"),
        (["--host", "bad_host"], "--host 'bad_host' is neither an IP address nor a host name"),
        (["--host", "300.1.1.1"], "--host '300.1.1.1' does not resolve"),
        (["--bus", "kafka://x"], "unknown bus 'kafka://x'"),
        (["--bus", "redis://127.0.0.1:notaport/0"], "is not a Redis URL"),
        (["--bus", "postgres"], "--bus postgres needs a Postgres --db"),
        (["--max-frame-bytes", "-1"], "--max-frame-bytes -1 must be above 0"),
        (["--max-frame-bytes", "0"], "--max-frame-bytes 0 must be above 0"),
        (["--ping-timeout", "nan"], "--ping-timeout nan is not a finite number"),
        (["--presence-ttl", "0"], "--presence-ttl 0.0 must be above 0"),
        (["--auth-secret", "short"], "--auth-secret is 5 bytes; HS256 needs at least 32"),
        (["--db", "mysql://root:hunter2@db/app"], "unsupported scheme 'mysql'"),
        (["--db", "sqlite:z.db"], "write sqlite:///PATH"),
        (["--db", "/nonexistent-dir/x.db"], "the directory '/nonexistent-dir' does not exist"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    db = ["--db", str(tmp_path / "hub.db")] if "--db" not in args else []
    result = run("serve", *db, *args, cwd=tmp_path)
    assert result.returncode == 2
    line = one_line(result)
    assert says in line
    assert "hunter2" not in line  # a DSN's password is never echoed
    # Nothing was created on the way: `sqlite:z.db` used to become a file of that name.
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_serve_reads_a_short_secret_from_the_environment_and_refuses_it(tmp_path: Path) -> None:
    result = run("serve", "--db", str(tmp_path / "hub.db"), env={"SESSIONHUB_AUTH_SECRET": "x" * 31})
    assert result.returncode == 2
    assert "$SESSIONHUB_AUTH_SECRET) is 31 bytes" in one_line(result)


async def test_serve_accepts_a_sqlite_url(tmp_path: Path) -> None:
    db = tmp_path / "url.db"
    async with serve("--db", f"sqlite:///{db}") as url, HubClient(url) as hub:
        info = await hub.sessions.create("via url")
    assert db.exists()
    assert not (tmp_path / "sqlite:").exists()
    async with serve("--db", str(db)) as url, HubClient(url) as hub:
        assert [s.id for s in await hub.sessions.list()] == [info.id]


# -- token ----------------------------------------------------------------------------------


def test_token_reads_the_secret_from_the_environment() -> None:
    result = run("token", "--session", "s1", "--scope", "read", env={"SESSIONHUB_AUTH_SECRET": SECRET})
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    grant = verify_token(SECRET, result.stdout.strip())
    assert dict(grant.scopes) == {"s1": "read"}


def test_token_refuses_a_short_secret_without_pyjwts_warning() -> None:
    result = run("token", "--secret", "short", "--session", "*", "--scope", "read")
    assert (result.returncode, result.stdout) == (2, "")
    line = one_line(result)
    assert "--secret is 5 bytes; HS256 needs at least 32" in line
    assert "InsecureKeyLengthWarning" not in result.stderr
    short_env = run("token", "--session", "*", "--scope", "read", env={"SESSIONHUB_AUTH_SECRET": "y" * 10})
    assert short_env.returncode == 2
    assert "$SESSIONHUB_AUTH_SECRET is 10 bytes" in one_line(short_env)


def test_token_without_any_secret_says_where_to_put_one() -> None:
    env = {k: v for k, v in environ().items() if k != "SESSIONHUB_AUTH_SECRET"}
    result = subprocess.run(
        [sys.executable, "-m", "hub.apps.cli", "token", "--session", "*", "--scope", "read"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert result.returncode == 2
    assert "--secret or $SESSIONHUB_AUTH_SECRET" in one_line(result)


# -- version and help -----------------------------------------------------------------------


def test_version_and_the_exit_codes_in_help() -> None:
    shown = run("--version")
    assert (shown.returncode, shown.stdout.strip()) == (0, f"sessionhub {version('sessionhub')}")
    for command in ([], ["serve"], ["tail"], ["sessions"], ["token"]):
        helped = run(*command, "--help")
        assert helped.returncode == 0
        assert EXIT_CODES in helped.stdout
    for code in ("0", "1", "2", "3", "4", "5", "6", "130", "141"):
        assert re.search(rf"^  {code} +\S", EXIT_CODES, re.MULTILINE)


# -- sessions and tail: the hub's answers as one line and an exit code ------------------------


async def arun(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, *args)


async def test_sessions_and_tail_when_the_hub_is_down() -> None:
    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: refused
        for command in (["sessions"], ["tail", "s1"]):
            result = await arun(*command, "--url", f"ws://127.0.0.1:{port}/ws")
            assert result.returncode == 3
            assert "cannot reach the hub at" in one_line(result)


async def test_several_urls_fail_over_and_are_named_when_none_answers(tmp_path: Path) -> None:
    """``--url a,b``: the client commands try each hub in turn (HubClient([...])); when none
    answers, the one line names them all."""
    with contextlib.closing(__import__("socket").socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"ws://127.0.0.1:{sock.getsockname()[1]}/ws"  # bound, never listening: refused
        async with serve("--db", str(tmp_path / "hub.db")) as live:
            async with HubClient(live) as hub:
                info = await hub.sessions.create("over there")
            listed = await arun("sessions", "--url", f"{dead}, {live}")
            assert listed.returncode == 0, listed.stderr
            assert info.id in listed.stdout
        down = await arun("sessions", "--url", f"{dead},{dead.replace('/ws', '/other')}")
        assert down.returncode == 3
        assert f"cannot reach the hub at {dead}, {dead.replace('/ws', '/other')}" in one_line(down)
    empty = await arun("sessions", "--url", " , ")
    assert empty.returncode == 2 and "no hub URL in" in empty.stderr


async def test_tokens_missing_refused_and_sessions_missing(tmp_path: Path) -> None:
    admin = run("token", "--secret", SECRET, "--session", "*", "--scope", "admin").stdout.strip()
    other = run(
        "token", "--secret", "another-secret-of-at-least-32-bytes!!", "--session", "*", "--scope", "admin"
    )
    async with serve("--db", str(tmp_path / "hub.db"), "--auth-secret", SECRET) as url:
        async with HubClient(url, token=admin) as hub:
            info = await hub.sessions.create("one")

        missing = await arun("sessions", "--url", url)
        assert missing.returncode == 4
        assert "needs a token for the registry: pass --token" in one_line(missing)

        refused = await arun("tail", info.id, "--url", url, "--token", other.stdout.strip())
        assert refused.returncode == 4
        assert f"refused the token for session {info.id!r}" in one_line(refused)

        nosuch = await arun("tail", "nosuch", "--url", url, "--token", admin)
        assert nosuch.returncode == 5
        assert "no session 'nosuch' on the hub" in one_line(nosuch)

        lost = await arun("tail", info.id, "--after", "99", "--url", url, "--token", admin)
        assert lost.returncode == 6
        assert "cannot resume after seq 99" in one_line(lost)
        assert "pass --after 1 to follow from now" in lost.stderr

        negative = await arun("tail", info.id, "--after", "-1", "--url", url, "--token", admin)
        assert negative.returncode == 2
        assert "--after -1 must be at least 0" in one_line(negative)

        listed = await arun("sessions", "--url", url, "--token", admin)
        assert listed.returncode == 0
        assert info.id in listed.stdout


async def test_a_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    async with serve("--db", str(tmp_path / "hub.db")) as url:
        async with HubClient(url) as hub:
            for i in range(3):
                await hub.sessions.create(f"s{i}")
        read, write = os.pipe()
        os.close(read)  # the reader is gone before anything is written: `| head` that exited
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hub.apps.cli", "sessions", "--url", url,
                stdout=write, stderr=subprocess.PIPE, env=environ(),
            )  # fmt: skip
        finally:
            os.close(write)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
        assert (proc.returncode, err.decode()) == (141, "")


# -- the bus a database is served with ------------------------------------------------------


async def test_a_node_on_another_bus_is_refused_until_overridden(tmp_path: Path) -> None:
    redis = redis_url()
    db = str(tmp_path / "hub.db")
    async with serve("--db", db):  # records "memory"
        pass
    refused = await arun("serve", "--db", db, "--port", "0", "--bus", redis)
    assert refused.returncode == 2
    line = one_line(refused)
    assert "this database is served with bus memory, not redis://" in line
    assert "--bus-override" in line
    async with serve("--db", db, "--bus", redis, "--bus-override") as url, HubClient(url) as hub:
        await hub.sessions.create("on redis now")
    # Now the record says Redis, and a node on the memory bus is the odd one out.
    back = await arun("serve", "--db", db, "--port", "0")
    assert back.returncode == 2
    assert "served with bus redis://" in one_line(back)


# -- import: a bad dump is exit 2 in one line, and writes nothing (issue 24, items 5-7) --------

#: The refusals the issue saw end in tracebacks or partial writes, on each store.
CLI_IMPORT_CASES = [
    "the same session twice",
    "input_tokens 2**63",
    "a 5,000-deep line",
    "created_at in year 1",
]


@contextlib.asynccontextmanager
async def cli_db(kind: str, tmp_path: Path) -> AsyncIterator[str]:
    """A ``--db`` of ``kind`` holding one session."""
    from hub.apps.backends import open_store
    from hub.dump import import_lines
    from tests.support.dumps import dump, session
    from tests.support.nodes import scratch_database
    from tests.support.services import postgres_dsn

    async with contextlib.AsyncExitStack() as stack:
        if kind == "sqlite":
            db = str(tmp_path / "hub.db")
        else:
            db = await stack.enter_async_context(scratch_database(postgres_dsn(), "sessionhub_cli"))
        async with open_store(db) as store:
            await import_lines(store, dump(session("seed")))
        yield db


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_bad_dump_exits_2_in_one_line_and_writes_nothing(kind: str, tmp_path: Path) -> None:
    """The CLI exited 1 with a RecursionError or OverflowError traceback, after writing
    the sessions ahead of the bad line."""
    from tests.support.dumps import bad_dumps, dump, session

    async with cli_db(kind, tmp_path) as db:
        before = await arun("export", "--db", db)
        assert before.returncode == 0, before.stderr
        for case in CLI_IMPORT_CASES:
            bad = bad_dumps()[case]
            file = tmp_path / "bad.jsonl"
            file.write_text("\n".join(bad.lines) + "\n")
            refused = await arun("import", str(file), "--db", db)
            line = one_line(refused)
            assert refused.returncode == 2, (case, refused.stderr)
            assert f"line {bad.line}: " in line and bad.says in line and "nothing was written" in line, line
        # A session already stored, after a new one: exit 7, and the new one is not written.
        file.write_text("\n".join(dump(session("new"), session("seed"))) + "\n")
        refused = await arun("import", str(file), "--db", db)
        assert refused.returncode == 7 and "'seed' already exists" in one_line(refused)
        after = await arun("export", "--db", db)
        assert after.stdout == before.stdout
