"""How sessionhub installs and what it ships: optional backends stay unloaded, a missing
extra is one line naming it, the hub serves only the inspector's files, and the declared
dependency ranges admit what neighbouring libraries (openai-agents) need."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hub.server.static import is_shipped
from tests.support.hubtest import served

ROOT = Path(__file__).resolve().parents[2]
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
import hub, hub.server, hub.apps.cli, hub.apps.backends, hub.bus, hub.store, clients, protocol
from hub.apps.backends import open_backend
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
        f"import sys; sys.modules[{module!r}] = None\n"
        "from hub.apps.cli import main\nsys.exit(main(sys.argv[1:]))"
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
        modules = sorted(
            p.relative_to(web).as_posix()
            for part in ("inspector", "sessionhub")
            for p in (web / part).glob("*.js")
        )
        assert {"inspector/main.js", "sessionhub/client.js"} <= set(modules)
        pages = (
            "inspector.css",
            "sessionhub.js",
            "presence.js",
            "chat-transport.js",
            "index.html",
            "examples/chat.html",
        )
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


# -- the wheel: built, installed into a fresh venv, served -------------------------------------

#: The wheel's import packages, and all it may put at the top of site-packages: a `web`
#: there would clash with other distributions' (web.py installs one).
IMPORT_PACKAGES = {"hub", "protocol", "clients"}
#: Where the wheel carries the inspector's files (pyproject.toml maps web/ there).
PACKAGED_WEB = "hub/server/web/"


def _served_files() -> set[str]:
    """The repository's web/ files the hub serves (hub/server/static.py's allow-list)."""
    web = ROOT / "web"
    files = {p.relative_to(web).as_posix() for p in web.rglob("*") if p.is_file()}
    return {path for path in files if is_shipped(path)}


def _copy_tree(dst: Path) -> Path:
    """The project as a fresh checkout has it: a wheel built in ROOT itself would pick up
    whatever a stale build/ holds (an older layout's files), and would leave one behind."""
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "node_modules", "__pycache__",
        "*.db", "*.db-*", "test-artifacts", ".*_cache",
    ))  # fmt: skip
    return dst


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel built from a copy of the tree, and pip's output."""
    tree = _copy_tree(tmp_path_factory.mktemp("tree") / "sessionhub")
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(tree)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = out.glob("sessionhub-*.whl")
    return wheel, result.stdout + result.stderr


#: Where the installed hub finds the inspector's files, and what `import web` does.
PROBE = """
import hub.server.static
print(hub.server.static.WEB_DIR)
try:
    import web
except ImportError as exc:
    print(type(exc).__name__, exc)
"""


def _venv(path: Path, *install: str) -> Path:
    """A fresh venv at ``path`` with ``pip install *install`` (dependencies from PyPI, at the
    development pins)."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    constraints = str(ROOT / "constraints.txt")
    result = _in_venv(path, "pip", "install", "--quiet", *install, "-c", constraints, cwd=path)
    assert result.returncode == 0, result.stderr
    return path


def _clean_env() -> dict[str, str]:
    # Nothing of this checkout or this venv: the venv's python sees only what it installed.
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _in_venv(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # cwd matters: `python -c` puts it on sys.path, and ROOT has a web/ directory.
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True, text=True, timeout=600, env=_clean_env(), cwd=cwd,
    )  # fmt: skip


def _serve_and_get(venv: Path, tmp_path: Path, paths: Sequence[str]) -> dict[str, tuple[int, bytes]]:
    """``sessionhub serve`` from the venv on a free port, and what it answers to GET ``paths``."""
    proc = subprocess.Popen(
        [str(venv / "bin" / "sessionhub"), "serve", "--db", str(tmp_path / "hub.db"), "--port", "0"],
        stderr=subprocess.PIPE, text=True, env=_clean_env(), cwd=tmp_path,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        seen: list[str] = []
        while not seen or not (found := re.search(r"Uvicorn running on (http://127\.0\.0\.1:\d+)", seen[-1])):
            seen.append(proc.stderr.readline())
            assert seen[-1], "serve exited before listening: " + "".join(seen)
        return {path: _get(found.group(1) + path) for path in paths}
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)


@pytest.mark.network
@NETWORK
def test_the_wheel_builds_quietly_and_ships_no_js_tests(wheel_build: tuple[Path, str]) -> None:
    wheel, output = wheel_build
    noisy = [
        line
        for line in output.splitlines()
        if "Warning" in line or "deprecated" in line.lower() or "is absent from" in line
    ]
    assert [line for line in noisy if "Location 'file:" not in line] == []
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        top_level = archive.read(f"{dist_info}/top_level.txt").decode().split()
        record = [row.split(",")[0] for row in archive.read(f"{dist_info}/RECORD").decode().splitlines()]
    # No top-level `web` (nor anything else but the three import packages), in the archive,
    # in what pip will install (RECORD) or in what the wheel says it provides (top_level.txt).
    for paths in (names, record):
        assert {p.split("/")[0] for p in paths} - {dist_info} == IMPORT_PACKAGES
    assert sorted(top_level) == sorted(IMPORT_PACKAGES)
    # The inspector's files are under hub/server/web/: exactly the ones the hub serves.
    served = _served_files()
    assert {
        "index.html",
        "inspector/main.js",
        "sessionhub.js",
        "sessionhub/client.js",
        "presence.js",
    } <= served
    assert "chat-transport.js" in served
    assert "examples/chat.html" in served
    assert {n.removeprefix(PACKAGED_WEB) for n in names if n.startswith(PACKAGED_WEB)} == served
    assert not [n for n in names if "/test/" in n or n.endswith(".mjs")]


@pytest.mark.network
@NETWORK
@pytest.mark.timeout(600)
def test_the_installed_wheel_serves_the_inspector_and_installs_no_web_package(
    wheel_build: tuple[Path, str], tmp_path: Path
) -> None:
    wheel, _ = wheel_build
    venv = _venv(tmp_path / "venv", str(wheel))

    result = _in_venv(venv, "python", "-c", PROBE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    web_dir, *imported = result.stdout.splitlines()
    assert imported == ["ModuleNotFoundError No module named 'web'"]
    assert Path(web_dir).is_relative_to(venv) and Path(web_dir).as_posix().endswith("/hub/server/web")

    paths = ["/", "/sessionhub.js", "/inspector/main.js", "/examples/chat.html", "/test/client.test.mjs"]
    answers = _serve_and_get(venv, tmp_path, paths)
    assert answers["/"] == (200, (ROOT / "web" / "index.html").read_bytes())
    for path in paths[1:-1]:
        assert answers[path] == (200, (ROOT / "web" / path.lstrip("/")).read_bytes()), path
    assert answers["/test/client.test.mjs"][0] == 404

    # Were the packaged files gone, a web/ beside hub/ in site-packages (another
    # distribution's, even one with a sessionhub.js) is still not served.
    packaged = Path(web_dir)
    packaged.rename(packaged.with_name("web-away"))
    foreign = packaged.parents[2] / "web"
    foreign.mkdir()
    (foreign / "__init__.py").write_text("")
    (foreign / "sessionhub.js").write_text("// not ours")
    result = _in_venv(venv, "python", "-c", "import hub.server.static as s; print(s.WEB_DIR.is_dir())",
                      cwd=tmp_path)  # fmt: skip
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.network
@NETWORK
@pytest.mark.timeout(600)
def test_an_editable_install_serves_the_checkouts_web_and_installs_no_web_package(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path / "sessionhub")
    venv = _venv(tmp_path / "venv", "-e", str(tree))
    result = _in_venv(venv, "python", "-c", PROBE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tree / "web"), "ModuleNotFoundError No module named 'web'"]
    # An edit in the checkout is what the hub serves: no copy in between.
    (tree / "web" / "sessionhub.js").write_text("// edited\n")
    answers = _serve_and_get(venv, tmp_path, ["/", "/sessionhub.js"])
    assert answers["/"] == (200, (ROOT / "web" / "index.html").read_bytes())
    assert answers["/sessionhub.js"] == (200, b"// edited\n")


def test_every_python_package_is_listed_for_the_wheel() -> None:
    """pyproject.toml lists the wheel's packages by hand (a flat layout with several roots):
    a new package left off the list (hub/adapters/, say) would import from the checkout and
    be missing from every install. Checked without building, so without PyPI."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("hub", "protocol", "clients")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert found - listed == set(), f"add these to [tool.setuptools] packages: {sorted(found - listed)}"
