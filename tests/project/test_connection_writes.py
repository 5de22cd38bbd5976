"""No module writes another module's connection state.

A connection's state has two owners: the protocol state machine
(``protocol/serverconn.py``, :class:`ServerConnection`) and the I/O shell that performs
its effects (``hub/server/socket_shell.py``, :class:`Connection`). Every other module
changes a connection through their methods. This scans the source (an AST walk, no
import): an assignment, augmented assignment or ``del`` whose target is an attribute of a
connection (or an item of one: ``connection.parked[key] = ...``), outside those two
modules, fails. A name is a connection when it is annotated with one of the connection
types, or is called ``connection``/``conn``/``peer``/``responder``/``owner`` in the
server's modules; anything reached through ``.protocol`` is the state machine's too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {"protocol/serverconn.py", "hub/server/socket_shell.py"}
#: The types a connection is known by (the shell, the state machine, the ports' views).
TYPES = {"Connection", "ServerConnection", "Peer", "Responder", "ReplyWriter", "Receiver"}
#: What the server's modules call a connection when they do not annotate it.
NAMES = {"connection", "conn", "peer", "responder", "owner", "c"}
SCANNED = ("hub", "protocol", "clients")


def _annotation_names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    return (
        {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        | {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    )


def _connection_names(tree: ast.AST, server: bool) -> set[str]:
    names = set(NAMES) if server else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _annotation_names(node.annotation) & TYPES:
            names.add(node.arg)
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and _annotation_names(node.annotation) & TYPES
        ):
            names.add(node.target.id)
    return names


def _written(target: ast.expr, names: set[str]) -> str | None:
    """The connection attribute ``target`` writes, if it writes one."""
    while isinstance(target, ast.Subscript):  # connection.parked[key] = ...
        target = target.value
    if not isinstance(target, ast.Attribute):
        return None
    base = target.value
    chain = [target.attr]
    while isinstance(base, ast.Attribute):
        chain.append(base.attr)
        base = base.value
    if not isinstance(base, ast.Name):
        return None
    if (base.id in names and len(chain) <= 2) or "protocol" in chain[1:]:
        return f"{base.id}.{'.'.join(reversed(chain))}"
    return None


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [
            t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        ]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def writes(source: str, path: str) -> list[str]:
    """``path:line: conn.attr`` for every write of a connection's state in ``source``."""
    tree = ast.parse(source)
    names = _connection_names(tree, server=path.startswith("hub/server/") or path.startswith("hub/adapters/"))
    found = []
    for node in ast.walk(tree):
        for target in _targets(node):
            written = _written(target, names)
            if written is not None:
                found.append(f"{path}:{node.lineno}: {written}")  # type: ignore[attr-defined]
    return found


def test_only_the_shell_and_the_state_machine_write_a_connection() -> None:
    found = []
    for top in SCANNED:
        for file in sorted((ROOT / top).rglob("*.py")):
            path = file.relative_to(ROOT).as_posix()
            if path not in OWNERS:
                found += writes(file.read_text(encoding="utf-8"), path)
    assert found == [], "write through the connection's methods instead:\n" + "\n".join(found)


def test_the_scan_sees_the_writes_it_forbids() -> None:
    """The patterns this module was written against (access.py, ops.py, subscriptions.py
    and hub.py did each of these), and what it must leave alone."""
    bad = """
def f(connection: Connection, other: "Peer", key: str) -> None:
    connection.grant = None
    connection.replay += 3
    connection.name, connection.role = "a", "b"
    connection.parked[key] = 1
    del connection.parked[key]
    other.closed = True
    connection.protocol.grant = None
    x.protocol.subscriptions[key] = 1
"""
    assert [line.split(": ", 1)[1] for line in writes(bad, "hub/server/x.py")] == [
        "connection.grant",
        "connection.replay",
        "connection.name",
        "connection.role",
        "connection.parked",
        "connection.parked",
        "other.closed",
        "connection.protocol.grant",
        "x.protocol.subscriptions",
    ]
    fine = """
def f(connection: Connection, state: State) -> None:
    state.bytes += 1
    connection.queue.put_nowait(None)
    self.grant = None
    local = connection.name
"""
    assert writes(fine, "hub/server/x.py") == []
    # Outside the server, only annotated names count (sqlite's ``conn`` is another thing).
    assert writes("def f(conn):\n    conn.row_factory = None\n", "hub/store/sqlite/x.py") == []
