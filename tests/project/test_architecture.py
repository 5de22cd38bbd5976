"""The layering contracts in pyproject.toml cover every module of the hub package.

import-linter checks the modules a contract names; a new module named in none would be
outside every rule. Each top-level module or package of ``hub`` is in the engine's contract,
in the server's, or is one of the composition roots (``hub.cli``, ``hub.responder``), which
may import anything.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"hub.apps"}


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
    assert {"hub.server", "hub.apps", "clients"} <= set(forbidden)
