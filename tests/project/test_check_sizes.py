"""scripts/check_sizes.py: no module past 600 lines, and the allow-list only shrinks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "scripts" / "check_sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tree_passes_and_counts_the_listed_modules() -> None:
    gate = _gate()
    sizes = gate.modules()
    assert gate.problems(sizes) == []
    assert set(gate.OVERSIZED) <= set(sizes)
    assert not any(name.startswith(("tests/", "bench/")) for name in sizes)
    assert "web/sessionhub.js" in sizes and "hub/server/ops.py" in sizes


def test_a_new_module_past_the_limit_fails() -> None:
    gate = _gate()
    sizes = {**gate.modules(), "hub/new.py": gate.LIMIT + 1}
    assert gate.problems(sizes) == ["hub/new.py: 601 lines, over 600: split it"]


def test_a_listed_module_may_shrink_but_not_grow() -> None:
    gate = _gate()
    name, count = next(iter(gate.OVERSIZED.items()))
    assert gate.problems({**gate.modules(), name: count - 1}) == []
    (grown,) = gate.problems({**gate.modules(), name: count + 1})
    assert grown.startswith(f"{name}: {count + 1} lines, past the {count}")


def test_a_listed_module_back_under_the_limit_must_leave_the_list() -> None:
    gate = _gate()
    name = next(iter(gate.OVERSIZED))
    assert gate.problems({**gate.modules(), name: 600}) == [
        f"{name}: 600 lines now: remove it from OVERSIZED in scripts/check_sizes.py"
    ]
    sizes = gate.modules()
    del sizes[name]
    assert gate.problems(sizes) == [f"{name}: gone: remove it from OVERSIZED in scripts/check_sizes.py"]
