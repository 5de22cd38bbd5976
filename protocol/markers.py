"""Markers shared by the engine and the client."""

from __future__ import annotations

import enum
from typing import Final, Literal

__all__ = ["LATEST", "Parent", "ParentArg"]


class Parent(enum.Enum):
    """Where an appended message attaches when no explicit parent id is given."""

    LATEST = "latest"


#: Attach to the session's latest leaf (the newest message without children). On the wire
#: this is a request without ``parent_id``; ``None`` (``null``) starts a new root.
LATEST: Final = Parent.LATEST

#: ``str`` attaches to that message (unknown → new root); ``None`` starts a new root.
ParentArg = str | None | Literal[Parent.LATEST]
