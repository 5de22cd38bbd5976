"""The browser inspector's files (web/), served from an allow-list: what the inspector and
the examples need, never the JS tests (web/test/) or anything else put beside them.

Where they are: an installed wheel carries them as ``hub/server/web/`` beside this module
(pyproject.toml maps the repository's web/ there, so that the wheel installs no top-level
``web`` package); a checkout, or an editable install of one, has them in the repository's
web/."""

from __future__ import annotations

import os
import re
from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

__all__ = ["WEB_DIR", "InspectorFiles", "is_shipped"]


def _web_dir() -> Path:
    here = Path(__file__).resolve().parent
    packaged = here / "web"
    if packaged.is_dir():
        return packaged
    # The checkout's web/ only if it is ours: beside an installed hub/ (site-packages), a
    # web/ is another distribution's package (web.py installs one), never to be served.
    checkout = here.parents[1] / "web"
    if (checkout / "sessionhub.js").is_file() and (here.parents[1] / "pyproject.toml").is_file():
        return checkout
    # Neither: nothing to serve (create_app mounts no files when WEB_DIR is not a directory).
    return packaged


WEB_DIR = _web_dir()

#: Paths under web/ the hub serves ("." is the directory, i.e. index.html).
SHIPPED = frozenset({".", "index.html", "inspector.css", "sessionhub.js", "presence.js", "chat-transport.js"})
#: The examples and the ES modules of the inspector (web/inspector/*.js) and of the JS
#: client, which sessionhub.js loads (web/sessionhub/*.js).
_PATTERNS = re.compile(r"examples/[A-Za-z0-9_-]+\.html|(?:inspector|sessionhub)/[A-Za-z0-9_-]+\.js")


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
