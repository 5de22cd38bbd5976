"""The pruning rules both stores apply (``Store.prune_events``): argument checks, and which
events of a stream one batch removes. A store only runs the statements."""

from __future__ import annotations

from datetime import UTC, datetime

from protocol import InvalidInput

from .policy import check_limit

__all__ = ["PruneArgs", "batch_end", "check_prune"]


class PruneArgs:
    """Checked arguments: ``cutoff`` as epoch seconds (None: no age rule)."""

    __slots__ = ("batch", "cutoff", "keep")

    def __init__(self, cutoff: float | None, keep: int | None, batch: int) -> None:
        self.cutoff = cutoff
        self.keep = keep
        self.batch = batch


def check_prune(older_than: object, keep_per_session: object, batch: object) -> PruneArgs:
    if older_than is None and keep_per_session is None:
        raise InvalidInput("prune needs older_than or keep_per_session (or both)")
    cutoff: float | None = None
    if older_than is not None:
        if not isinstance(older_than, datetime):
            raise InvalidInput(f"older_than must be a datetime, got {type(older_than).__name__}")
        # A naive datetime is UTC, as every timestamp the hub writes.
        cutoff = (older_than if older_than.tzinfo else older_than.replace(tzinfo=UTC)).timestamp()
    keep: int | None = None
    if keep_per_session is not None:
        keep = check_limit(keep_per_session, "keep_per_session")
        if keep < 0:
            raise InvalidInput(f"keep_per_session must be at least 0, got {keep}")
    size = check_limit(batch, "batch")
    if size < 1:
        raise InvalidInput(f"batch must be at least 1, got {size}")
    return PruneArgs(cutoff, keep, size)


def batch_end(first: int, last: int, args: PruneArgs, first_new: int | None) -> int:
    """The stream's new ``first_seq`` after one batch over ``first..last``: events before it
    go. ``first_new`` is the first seq of the batch's window (``first`` to ``first + batch``)
    stored at or after the cutoff (None: all of the window is older, or no age rule)."""
    window = min(first + args.batch, last + 1)
    ends = []
    if args.cutoff is not None:
        ends.append(window if first_new is None else first_new)
    if args.keep is not None:
        ends.append(last - args.keep + 1)
    return max(first, min(window, max(ends)))
