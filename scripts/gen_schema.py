#!/usr/bin/env python3
"""Write protocol/schema.json: the JSON Schema of the wire protocol, generated from its types.

Run after changing a request or a frame (protocol/requests.py, protocol/serverframes.py:
``.venv/bin/python scripts/gen_schema.py``); a test fails while the committed file differs
from what this script generates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "protocol" / "schema.json"


def render() -> str:
    """The schema file's exact text."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from protocol.frames import Request, ServerFrame

    (request, server_frame), components = msgspec.json.schema_components(
        [Request, ServerFrame], ref_template="#/$defs/{name}"
    )
    document = {"$defs": components, "request": request, "server_frame": server_frame}
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def main() -> None:
    SCHEMA_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {SCHEMA_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
