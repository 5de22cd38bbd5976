"""Fail on a module over 600 lines (tests, benchmarks and generated files aside).

A module that long is several things under one name (issue 25): split it by what its
parts are for. The modules already over the limit are listed below with the lines they
had when the gate came in; each may shrink, none may grow, and one that drops to 600 or
below (or goes) must leave the list (the gate fails until it does), so the list only ever
gets shorter. Lower a count when its module shrinks, so that it cannot regrow.
Run by scripts/check; ``python scripts/check_sizes.py`` prints what fails.
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

#: Today's oversized modules and their line counts when the gate came in: the most each
#: may have until it is split. Never raise one.
OVERSIZED: dict[str, int] = {
    "hub/cli.py": 681,  # every subcommand (issue 25: entry points in their own package)
}


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
    out: list[str] = []
    for name, lines in sorted(sizes.items()):
        allowed = OVERSIZED.get(name, LIMIT)
        if lines > allowed:
            if name in OVERSIZED:
                out.append(f"{name}: {lines} lines, past the {allowed} it had (split it, do not grow it)")
            else:
                out.append(f"{name}: {lines} lines, over {LIMIT}: split it")
        elif name in OVERSIZED and lines <= LIMIT:  # else the entry would let it regrow
            out.append(f"{name}: {lines} lines now: remove it from OVERSIZED in scripts/check_sizes.py")
    for name in sorted(set(OVERSIZED) - set(sizes)):
        out.append(f"{name}: gone: remove it from OVERSIZED in scripts/check_sizes.py")
    return out


def main() -> int:
    found = problems(modules())
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
