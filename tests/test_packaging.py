"""How sessionhub installs and what it ships: optional backends stay unloaded, a missing
extra is one line naming it, the hub serves only the inspector's files, and the declared
dependency ranges admit what neighbouring libraries (openai-agents) need."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from .hubtest import served

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NETWORK = pytest.mark.skipif(
    os.environ.get("SESSIONHUB_TEST_NETWORK") != "1", reason="needs PyPI: set SESSIONHUB_TEST_NETWORK=1"
)


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT
    )


# -- optional backends ----------------------------------------------------------------------


def test_a_sqlite_hub_loads_neither_asyncpg_nor_redis(tmp_path: Path) -> None:
    code = """
import asyncio, sys
import hub, hub.server, hub.cli, hub.backends, hub.bus, hub.store, clients, protocol
from hub.backends import open_backend
from hub.server import create_app

async def main():
    create_app(db=sys.argv[1])
    async with open_backend(sys.argv[1]) as store:
        await store.list_sessions()

asyncio.run(main())
print(sorted(m for m in sys.modules if m.split(".")[0] in ("asyncpg", "redis")))
"""
    result = python(code, str(tmp_path / "x.db"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    # And they do load once asked for (the lazy names are real).
    asked = python("import sys; from hub import PostgresStore; from hub.bus import RedisBus; "
                   "print('asyncpg' in sys.modules, 'redis' in sys.modules)")  # fmt: skip
    assert asked.stdout.strip() == "True True", asked.stderr


@pytest.mark.parametrize(
    ("module", "code", "extra"),
    [
        ("asyncpg", "from hub import PostgresStore", "postgres"),
        ("asyncpg", "from hub.store import PostgresStore", "postgres"),
        ("asyncpg", "from hub.bus import PgListenBus", "postgres"),
        ("redis", "from hub.bus import RedisBus", "redis"),
    ],
)
def test_a_missing_extra_names_it(module: str, code: str, extra: str) -> None:
    # None in sys.modules is what Python does for a module that is not installed.
    result = python(f"import sys; sys.modules[{module!r}] = None\ntry:\n    {code}\n"
                    "except ImportError as exc:\n    print(type(exc).__name__, exc)")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"MissingExtra the {extra} backend needs {module!r}, which is not installed: "
        f"pip install 'sessionhub[{extra}]'"
    )


@pytest.mark.parametrize(
    ("module", "args", "extra"),
    [
        ("asyncpg", ["--db", "postgresql://postgres@127.0.0.1:5432/postgres"], "postgres"),
        ("redis", ["--bus", "redis://127.0.0.1:6379/0"], "redis"),
    ],
)
def test_serve_without_an_extra_is_one_line(tmp_path: Path, module: str, args: list[str], extra: str) -> None:
    code = (
        f"import sys; sys.modules[{module!r}] = None\nfrom hub.cli import main\nsys.exit(main(sys.argv[1:]))"
    )
    db = [] if "--db" in args else ["--db", str(tmp_path / "x.db")]
    result = python(code, "serve", *db, *args, "--port", "0")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"sessionhub: the {extra} backend needs {module!r}, which is not installed: "
        f"pip install 'sessionhub[{extra}]'"
    ]


# -- what the hub serves --------------------------------------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, b""


async def test_the_hub_serves_the_inspector_and_not_its_tests(tmp_path: Path) -> None:
    web = ROOT / "web"
    tests = sorted(p.relative_to(web).as_posix() for p in (web / "test").rglob("*") if p.is_file())
    assert tests, "web/test/ has the JS tests this checks for"
    async with served(db=tmp_path / "hub.db") as h:
        index = await asyncio.to_thread(_get, h.url + "/")
        assert index[0] == 200 and b"inspector/main.js" in index[1]
        modules = sorted(p.relative_to(web).as_posix() for p in (web / "inspector").glob("*.js"))
        assert "inspector/main.js" in modules
        pages = ("inspector.css", "sessionhub.js", "chat-transport.js", "index.html", "examples/chat.html")
        for path in (*pages, *modules):
            status, body = await asyncio.to_thread(_get, f"{h.url}/{path}")
            assert (path, status) == (path, 200)
            assert body == (web / path).read_bytes()
        for path in [*tests, "test/", "test", "examples/", "../pyproject.toml", "%2e%2e/pyproject.toml"]:
            status, _ = await asyncio.to_thread(_get, f"{h.url}/{path}")
            assert (path, status) == (path, 404)


# -- declared ranges and the development lock ------------------------------------------------


def _requirements() -> list[Requirement]:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["postgres"], *extras["redis"]]]


def _pins(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pins[requirement.name.lower().replace("_", "-")] = Version(spec.version)
    return pins


def test_runtime_dependencies_are_ranges_that_admit_openai_agents_websockets() -> None:
    for requirement in _requirements():
        operators = {s.operator for s in requirement.specifier}
        assert operators == {">=", "<"}, f"{requirement}: a library declares a compatible range"
    (websockets,) = [r for r in _requirements() if r.name == "websockets"]
    # openai-agents 0.24 requires websockets>=15,<17.
    for admitted in ("15.0", "15.0.1", "16.0", "16.1.1", "17.4"):
        assert websockets.specifier.contains(admitted), admitted


def test_the_development_pins_lie_inside_the_ranges_and_the_low_pins_are_the_bounds() -> None:
    pins, low = _pins("constraints.txt"), _pins("constraints-low.txt")
    for requirement in _requirements():
        name = requirement.name.lower()
        assert requirement.specifier.contains(pins[name]), f"constraints.txt {name}=={pins[name]}"
        (lower,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert low[name] == lower, f"constraints-low.txt {name} is not the declared lower bound"
    for script in ("scripts/test", "scripts/serve", ".ci/run"):
        assert '-e ".[dev]" -c constraints.txt' in (ROOT / script).read_text(), script


@pytest.mark.network
@NETWORK
def test_sessionhub_and_openai_agents_resolve_together(tmp_path: Path) -> None:
    # A resolution from scratch (--ignore-installed: nothing of this venv counts), as in a
    # fresh environment that wants both.
    report = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), f"{ROOT}[postgres,redis]", "openai-agents==0.24.0"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    chosen = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert Version(chosen["websockets"]).major in (15, 16)
    assert "sessionhub" in chosen


@pytest.mark.network
@NETWORK
def test_the_wheel_builds_quietly_and_ships_no_js_tests(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    noisy = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "Warning" in line or "deprecated" in line.lower() or "is absent from" in line
    ]
    assert [line for line in noisy if "Location 'file:" not in line] == []
    (wheel,) = tmp_path.glob("sessionhub-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {"web/index.html", "web/inspector/main.js", "web/sessionhub.js", "web/chat-transport.js"}
    shipped.add("web/examples/chat.html")
    assert shipped <= set(names)
    assert not [n for n in names if n.startswith("web/test")]
