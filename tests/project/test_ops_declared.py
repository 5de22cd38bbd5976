"""Every op is declared once (protocol/ops.py), and every list of ops agrees with it.

The lists derived from the declaration by hand (the op table, the two clients, the docs'
tables) fail here when one leaves an op out or names one that does not exist. scripts/check
runs this file, so CI fails on a missing op.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hub.server import create_app
from hub.server.hub import Hub
from protocol import frames as f
from protocol.ops import BY_NAME, DECLARED, NOT_IN_PYTHON_CLIENT

ROOT = Path(__file__).resolve().parents[2]
OPS = set(BY_NAME)


def _diff(found: set[str], expected: set[str]) -> dict[str, list[str]]:
    return {"missing": sorted(expected - found), "not declared": sorted(found - expected)}


def test_every_request_type_is_declared() -> None:
    assert set(DECLARED) == set(f.REQUEST_TYPES.values())
    assert set(f.REQUEST_TYPES) == OPS


def test_each_declared_session_field_is_the_requests() -> None:
    for request, op in DECLARED.items():
        fields = set(request.__struct_fields__)
        if op.session is not None:
            assert op.session in fields, f"{request.__name__} has no field {op.session}"
        # A request naming a session is judged on it, not on "*": its declaration says so.
        if "session_id" in fields and op.check == "grant":
            assert op.session == "session_id", f"{request.__name__} names a session: declare it"


async def test_the_op_table_has_a_handler_for_each_op_and_no_other(tmp_path: Path) -> None:
    app = create_app(db=tmp_path / "hub.db")
    async with app.router.lifespan_context(app):
        hub: Hub = app.state.hub
        assert _diff(set(hub.ops), OPS) == {"missing": [], "not declared": []}


# -- the Python client: the ops its code sends ---------------------------------------------

#: The calls that send an op named by their first argument (HubClient.request, streamed,
#: the remote API's _call); ClientConnection also writes frames as {"op": ...} literals.
_SENDERS = {"request", "streamed", "_call"}


def _python_client_ops() -> set[str]:
    sent: set[str] = set()
    sources = [*sorted((ROOT / "clients").glob("*.py")), ROOT / "protocol" / "clientconn.py"]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                first = node.args[0] if node.args else None
                if node.func.attr in _SENDERS and isinstance(first, ast.Constant):
                    sent.add(str(first.value))
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if (
                        isinstance(key, ast.Constant)
                        and key.value == "op"
                        and isinstance(value, ast.Constant)
                    ):
                        sent.add(str(value.value))
    return sent


def test_the_python_client_sends_every_op_but_the_declared_exceptions() -> None:
    assert set(NOT_IN_PYTHON_CLIENT) <= OPS
    assert _diff(_python_client_ops(), OPS - set(NOT_IN_PYTHON_CLIENT)) == {"missing": [], "not declared": []}


# -- the JS client: its shortcuts, parsed as text -------------------------------------------

_JS_OP = re.compile(r"""(?:\brequest\(\s*|\bop:\s*)["'](\w+)["']""")
_JS_METHOD = re.compile(r"^  (?:async )?(\w+)\([^\n]*\{\n(.*?)^  \}$", re.M | re.S)


def test_the_js_client_has_the_declared_shortcut_for_each_op() -> None:
    # The entry and the modules it loads (web/sessionhub/: the methods are client.js's).
    parts = [ROOT / "web" / "sessionhub.js", *sorted((ROOT / "web" / "sessionhub").glob("*.js"))]
    source = "\n".join(p.read_text(encoding="utf-8") for p in parts)
    bodies: dict[str, str] = {}
    for name, body in _JS_METHOD.findall(source):
        bodies[name] = bodies.get(name, "") + body  # ClientConnection's and HubClient's
    shortcuts = {name: op.js for name, op in BY_NAME.items() if op.js is not None}
    for name, method in shortcuts.items():
        assert method in bodies, f"web/sessionhub.js has no method {method} (op {name})"
        assert name in _JS_OP.findall(bodies[method]), f"{method} in web/sessionhub.js does not send {name}"
    # An op sent by a shortcut the declaration does not name (or no op at all) fails too.
    assert _diff(set(_JS_OP.findall(source)), set(shortcuts)) == {"missing": [], "not declared": []}


# -- the docs ------------------------------------------------------------------------------

_TABLE_HEAD = re.compile(r"^\|\s*op\s*\|\s*fields\s*\|\s*result\s*\|$")


def _documented_ops() -> set[str]:
    """The ops named in the first column of docs/protocol.md's ``| op | fields | result |``
    tables (a row may name several: ``append`` / ``upsert``)."""
    lines = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8").splitlines()
    found: set[str] = set()
    in_table = False
    for line in lines:
        if _TABLE_HEAD.match(line):
            in_table = True
        elif in_table and line.startswith("|"):
            found |= set(re.findall(r"`(\w+)`", line.split("|")[1]))
        else:
            in_table = False
    return found


def test_the_docs_tables_document_every_op() -> None:
    assert _diff(_documented_ops(), OPS) == {"missing": [], "not declared": []}
