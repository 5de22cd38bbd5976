"""The browser inspector's files (web/), served from an allow-list: what the inspector and
the examples need, never the JS tests (web/test/) or anything else put beside them."""

from __future__ import annotations

import os
import re
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

__all__ = ["WEB_DIR", "InspectorFiles", "is_shipped"]

WEB_DIR = Path(__file__).resolve().parents[2] / "web"

#: Paths under web/ the hub serves ("." is the directory, i.e. index.html).
SHIPPED = frozenset({".", "index.html", "inspector.css", "sessionhub.js", "chat-transport.js"})
#: The examples and the inspector's ES modules (web/inspector/*.js).
_PATTERNS = re.compile(r"examples/[A-Za-z0-9_-]+\.html|inspector/[A-Za-z0-9_-]+\.js")


def is_shipped(path: str) -> bool:
    """Whether ``path`` (relative to web/, as StaticFiles normalises it) is served."""
    path = path.replace(os.sep, "/")
    return path in SHIPPED or _PATTERNS.fullmatch(path) is not None


class InspectorFiles(StaticFiles):
    """StaticFiles over web/ that answers 404 for anything not on the allow-list."""

    def __init__(self, directory: Path = WEB_DIR) -> None:
        super().__init__(directory=directory, html=True)

    async def get_response(self, path: str, scope: Scope) -> Response:
        if not is_shipped(path):
            raise HTTPException(status_code=404)
        return await super().get_response(path, scope)
