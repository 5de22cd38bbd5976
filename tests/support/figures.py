"""The figures a fault test prints (``pytest -s`` shows them) and asserts on: what was
acknowledged, what of that is missing, the gaps and duplicates a subscriber saw, the writes
answered with an error that were stored anyway, and the time to recover."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Figures", "duplicates", "gaps"]


def gaps(seqs: Sequence[int], first: int = 1) -> int:
    """How many seqs are missing from ``first`` to the last one seen."""
    if not seqs:
        return 0
    return len(set(range(first, max(seqs) + 1)) - set(seqs))


def duplicates(items: Iterable[object]) -> int:
    """How many items come more than once (each extra copy counts)."""
    return sum(n - 1 for n in collections.Counter(items).values() if n > 1)


@dataclass
class Figures:
    name: str
    acknowledged: int = 0
    lost: int = 0
    gaps: int = 0
    duplicates: int = 0
    answered_but_stored: int = 0
    #: Seconds from the fault's end (or its start, for one the system rides out) to the
    #: first write that worked again.
    recovery: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def print(self) -> None:
        recovery = "-" if self.recovery is None else f"{self.recovery:.2f} s"
        more = "".join(f", {key} {value}" for key, value in self.extra.items())
        print(
            f"\n{self.name}: acknowledged {self.acknowledged}, lost {self.lost}, gaps {self.gaps}, "
            f"duplicates {self.duplicates}, answered-but-stored {self.answered_but_stored}, "
            f"time to recover {recovery}{more}"
        )

    def assert_exact(self) -> None:
        assert (self.lost, self.gaps, self.duplicates, self.answered_but_stored) == (0, 0, 0, 0), self
