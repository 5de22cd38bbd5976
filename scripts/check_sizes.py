"""Fail on a module over 600 lines (tests, benchmarks and generated files aside).

A module that long is several things under one name (issue 25): split it by what its
parts are for. There is no allow-list: the modules that were over the limit when the gate
came in have all been split. Run by scripts/check; ``python scripts/check_sizes.py`` prints
what fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 600
#: The source trees (tests/ and bench/ are outside them; schema.json, the one generated
#: file, is no module).
SOURCES = ("hub", "protocol", "clients", "scripts", "web")
SUFFIXES = {".py", ".js", ".mjs"}
#: Directories that are not our modules: installed packages, caches, browser tests.
SKIP = {"node_modules", "__pycache__", "test", "tests"}


def modules() -> dict[str, int]:
    """Every source module's path (relative, with /) and its line count."""
    found: dict[str, int] = {}
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            if SKIP & set(path.relative_to(ROOT).parts[:-1]):
                continue
            with path.open("rb") as text:
                found[path.relative_to(ROOT).as_posix()] = sum(1 for _ in text)
    return found


def problems(sizes: dict[str, int]) -> list[str]:
    return [
        f"{name}: {lines} lines, over {LIMIT}: split it"
        for name, lines in sorted(sizes.items())
        if lines > LIMIT
    ]


def main() -> int:
    found = problems(modules())
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
