"""The layering contracts in pyproject.toml cover every module of the hub package, and no two
modules share a name for different things.

The engine's rule is package-level: every module directly in ``hub/`` (and ``hub.store``,
``hub.bus``) is engine, and the contracts say who *may* import the server, the adapters,
the entry points (``hub.apps``), the clients and the bus implementations. So a new engine
module is bound without being listed anywhere; these tests keep the lists of who may
import them to the packages that are not engine, and prove the rule catches a new module.
The protocol adapters (``hub/adapters/``) reach the server only through the port modules
their contract lets them import, and every adapter module is mounted. Run by scripts/check.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]

#: hub's packages that are not engine: the only ones the contracts let import the server,
#: the adapters, the entry points or the clients.
NOT_ENGINE = {"hub.server", "hub.adapters", "hub.apps"}
#: What the engine may not import, each guarded by a ``protected`` contract.
GUARDED = {"hub.server", "hub.adapters", "hub.apps", "clients", "hub.bus.postgres", "hub.bus.redis"}


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _contract(words: str) -> dict[str, object]:
    (found,) = [c for c in _contracts() if words in str(c["name"])]
    return found


def _strings(contract: dict[str, object], key: str) -> set[str]:
    values = contract.get(key, [])
    assert isinstance(values, list)
    return {str(v) for v in values}


def test_only_the_packages_that_are_not_engine_may_import_what_the_engine_may_not() -> None:
    """Each of GUARDED is protected, and its allowed importers are packages that are not
    engine (hub.bus for its own implementations): an engine module added to a list of
    allowed importers would be let out of the engine's rule."""
    protected = [c for c in _contracts() if c["type"] == "protected"]
    guarded: set[str] = set()
    for contract in protected:
        guarded |= _strings(contract, "protected_modules")
        allowed = _strings(contract, "allowed_importers")
        bus_only = _strings(contract, "protected_modules") <= {"hub.bus.postgres", "hub.bus.redis"}
        assert allowed <= (NOT_ENGINE | ({"hub.bus"} if bus_only else set())), (
            f"{contract['name']!r} lets {sorted(allowed - NOT_ENGINE)} import it: those are engine"
        )
    assert guarded >= GUARDED, f"no protected contract guards {sorted(GUARDED - guarded)}"


def test_every_hub_package_that_is_not_engine_exists() -> None:
    packages = {f"hub.{p.name}" for p in (ROOT / "hub").iterdir() if (p / "__init__.py").is_file()}
    assert packages >= NOT_ENGINE


def _copy_sources(to: Path) -> None:
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "node_modules")
    for package in ("hub", "protocol", "clients"):
        shutil.copytree(ROOT / package, to / package, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", to / "pyproject.toml")


def test_a_new_engine_module_importing_what_it_may_not_fails_lint_imports(tmp_path: Path) -> None:
    """The rule binds a module nobody listed: a new ``hub/newthing.py`` (and a new store
    module) importing the server, an adapter, an entry point, the clients and a bus
    implementation breaks the contracts, each import named."""
    _copy_sources(tmp_path)
    bad = {
        "hub/newthing.py": [
            "import clients",
            "import hub.adapters",
            "import hub.apps.cli",
            "import hub.server.hub",
        ],
        "hub/store/newthing.py": ["import hub.bus.redis", "from hub.apps import backends"],
    }
    for path, lines in bad.items():
        (tmp_path / path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run(
        [str(lint), "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 1, out.stdout + out.stderr
    for importer, imported in [
        ("hub.newthing", "clients"),
        ("hub.newthing", "hub.adapters"),
        ("hub.newthing", "hub.apps.cli"),
        ("hub.newthing", "hub.server.hub"),
        ("hub.store.newthing", "hub.bus.redis"),
        ("hub.store.newthing", "hub.apps.backends"),
    ]:
        assert f"{importer} -> {imported} (l." in out.stdout, (importer, imported, out.stdout)


# -- one name per thing ----------------------------------------------------------------------

#: Names that mean the same role wherever they stand, and why.
SAME_ROLE = {
    "__init__": "a package's own module",
    "errors": "each package's own exceptions (the wire's codes, the client's, each store's driver errors)",
    "ops": "the ops from each side: their declaration (protocol/ops.py) and their handlers "
    "(hub/server/ops.py), one op table",
}
#: Packages that implement one contract side by side: a module of one may have its
#: counterpart, under the same name, in the others (sql, schema, store, tx, maintenance...).
PARALLEL = [{"hub/store/sqlite", "hub/store/postgres"}]
#: Deprecation aliases (docs/architecture.md, "Renamed in 0.1.0"): an old name kept for one
#: release, no module of its own; each must still exist, and go with its release.
ALIASES = {"protocol/connection.py": "0.1.0: protocol.clientconn and protocol.serverconn"}


def _modules_by_name() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for package in ("hub", "protocol", "clients"):
        for path in (ROOT / package).rglob("*.py"):
            name = path.relative_to(ROOT).as_posix()
            if "__pycache__" not in path.parts and name not in ALIASES:
                found[path.stem].add(name)
    return found


def clashes(by_name: dict[str, set[str]]) -> dict[str, set[str]]:
    """The names that stand for different things: shared by modules outside one set of
    parallel packages, and not of the same role everywhere."""
    out: dict[str, set[str]] = {}
    for name, paths in sorted(by_name.items()):
        if len(paths) < 2 or name in SAME_ROLE:
            continue
        folders = {p.rpartition("/")[0] for p in paths}
        if any(folders <= group for group in PARALLEL):
            continue
        out[name] = paths
    return out


def test_no_two_modules_share_a_name_for_different_things() -> None:
    by_name = _modules_by_name()
    found = clashes(by_name)
    gone = sorted(p for p in ALIASES if not (ROOT / p).is_file())
    assert not gone, f"ALIASES: {gone} removed: drop them from the list"
    assert not found, "rename one of each (or say why they are one role, in SAME_ROLE): " + "; ".join(
        f"{name}: {', '.join(sorted(paths))}" for name, paths in found.items()
    )


def test_the_name_gate_sees_a_clash() -> None:
    """A second ``retention`` (the name that meant both the policy and the pruner) is a
    clash; a backend's ``sql`` beside the other backend's is not; nor is each ``errors``."""
    by_name = _modules_by_name()
    assert clashes({"retention": {"hub/retention.py", "hub/server/retention.py"}})
    assert not clashes({"sql": by_name["sql"], "errors": by_name["errors"]})
    assert clashes({"sql": {*by_name["sql"], "hub/server/sql.py"}})


def _server_ports() -> set[str]:
    """The server modules the adapters' contract lets them import (its ignored imports)."""
    ignored = _contract("adapters reach the hub")["ignore_imports"]
    assert isinstance(ignored, list)
    ports = set()
    for line in ignored:
        importer, _, imported = str(line).partition(" -> ")
        assert importer == "hub.adapters.**", f"an adapter exception names every adapter: {line}"
        ports.add(imported)
    return ports


def test_the_adapters_may_import_no_server_module_but_the_ports() -> None:
    """The contract forbids the whole server package, so a server module added tomorrow is
    forbidden too until it is listed as a port; the entry points and clients the server may
    not import, adapters may not either."""
    adapters = _contract("adapters reach the hub")
    forbidden = adapters["forbidden_modules"]
    assert isinstance(forbidden, list)
    assert "hub.server" in forbidden
    server = _contract("the server, tokens")["forbidden_modules"]
    assert isinstance(server, list)
    assert set(server) <= set(forbidden), "adapters may import no entry point the server may not"
    modules = {f"hub.server.{p.stem}" for p in (ROOT / "hub" / "server").glob("*.py")}
    assert _server_ports() <= modules, "a port module listed in pyproject.toml does not exist"


def test_the_port_modules_reach_no_other_server_module() -> None:
    """An adapter may import a port module; through it, it must not reach the Hub, a
    Connection, the op table...: each port module imports nothing of the server beyond the
    other port modules (derived from the import graph, TYPE_CHECKING imports counted)."""
    graph = grimp.build_graph("hub", "protocol", "clients", exclude_type_checking_imports=False)
    ports = _server_ports()
    for port in sorted(ports):
        reached = {m for m in graph.find_upstream_modules(port) if m.startswith("hub.server")}
        assert reached <= ports, f"{port} reaches {sorted(reached - ports)}, which adapters may not import"


def test_every_adapter_module_is_mounted() -> None:
    """A module of hub/adapters/ with an ``adapter()`` is a protocol; it must be in the list
    ``create_app`` mounts (hub.adapters.adapters), or nobody can reach it."""
    from hub.adapters import adapters

    mounted = {a.name for a in adapters()}
    for path in sorted((ROOT / "hub" / "adapters").glob("*.py")):
        if "\ndef adapter(" not in path.read_text(encoding="utf-8"):
            continue
        made = importlib.import_module(f"hub.adapters.{path.stem}").adapter()
        if made is not None:  # None: its optional package is not installed
            assert made.name in mounted, f"add hub/adapters/{path.name} to hub.adapters.adapters()"
