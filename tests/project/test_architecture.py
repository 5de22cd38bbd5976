"""The layering contracts in pyproject.toml cover every module of the hub package.

import-linter checks the modules a contract names; a new module named in none would be
outside every rule. Each top-level module or package of ``hub`` is in the engine's contract,
in the server's, or is one of the composition roots (``hub.cli``, ``hub.responder``), which
may import anything. The protocol adapters (``hub/adapters/``) reach the server only through
the port modules their contract lets them import, and every adapter module is mounted.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"hub.cli", "hub.importers", "hub.responder"}


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _hub_modules() -> set[str]:
    hub = ROOT / "hub"
    modules = {f"hub.{p.stem}" for p in hub.glob("*.py") if p.stem != "__init__"}
    modules |= {f"hub.{p.name}" for p in hub.iterdir() if (p / "__init__.py").is_file()}
    return modules


def test_every_hub_module_is_in_a_layer() -> None:
    named: set[str] = set()
    for contract in _contracts():
        sources = contract.get("source_modules", [])
        assert isinstance(sources, list)
        named |= {str(m) for m in sources if str(m).startswith("hub.")}
    unclassified = _hub_modules() - named - ROOTS
    assert unclassified == set(), f"add these to a contract in pyproject.toml: {sorted(unclassified)}"


def test_the_engine_may_not_import_the_server_or_the_clients() -> None:
    (engine,) = [c for c in _contracts() if "engine" in str(c["name"])]
    forbidden = engine["forbidden_modules"]
    assert isinstance(forbidden, list)
    assert {"hub.server", "hub.cli", "clients"} <= set(forbidden)


def _contract(words: str) -> dict[str, object]:
    (found,) = [c for c in _contracts() if words in str(c["name"])]
    return found


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
