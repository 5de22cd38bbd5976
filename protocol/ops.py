"""Every op, declared once: the scope its token needs and how its session is found.

:data:`DECLARED` maps each request type of :mod:`protocol.frames` to an :class:`Op`. What
used to be written by hand in five places is derived from it or checked against it:

- the access check (``hub.auth.OP_LEVELS`` and ``hub.server.access.allowed``) is derived
  from ``level``, ``session``, ``null`` and ``check``;
- the op table (``hub.server.ops.operations``), the Python client (``clients/``), the JS
  client (``web/sessionhub.js``, ``js``) and the docs' op tables (docs/protocol.md) are
  held to it by tests/project/test_ops_declared.py, which ``scripts/check`` runs.

Adding an op: docs/architecture.md, "Where to add an op".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import frames as f

__all__ = ["BY_NAME", "DECLARED", "LEVELS", "NOT_IN_PYTHON_CLIENT", "Check", "Level", "Op", "declared"]

#: A token's levels, each including the ones before it (docs/security.md).
Level = Literal["read", "write", "admin"]
LEVELS: tuple[Level, ...] = ("read", "write", "admin")

#: How a request's access is judged (by ``hub.server.access.allowed``):
#:
#: - ``grant``: ``level`` on the session its ``session`` field names; on ``*`` when it has
#:   no such field or the field is null (``null="registry"``: the registry stream, which
#:   needs admin on ``*``);
#: - ``open``: no grant at all (``ping``; ``auth``, which checks the token it brings);
#: - ``own``: any live grant; the request only answers what this connection was asked (a
#:   summary prompt, a turn), and the asking checked the grant (a summary's session, the
#:   turn's write);
#: - ``announce``: ``level`` on every session its ``session`` field lists and, when it asks
#:   for summary prompts (``summarizer``), write on some session (``hello``).
Check = Literal["grant", "open", "own", "announce"]


@dataclass(frozen=True, slots=True)
class Op:
    """One op's declaration."""

    #: The level its token needs (for ``open`` and ``own`` ops, the nominal one
    #: ``Grant.allows`` knows them by: read).
    level: Level
    #: The field naming its session (a list of them for ``announce``); ``None``: the op is
    #: about no one session and is judged on ``*``.
    session: str | None = "session_id"
    #: What a null ``session`` field means: every session (``*``) or the registry stream.
    null: Literal["all", "registry"] = "all"
    check: Check = "grant"
    #: The ``web/sessionhub.js`` method that sends it; ``None``: only ``request(op, fields)``
    #: reaches it (the JS client's generic request, which reaches every op).
    js: str | None = None


DECLARED: dict[type[f.Request], Op] = {
    # -- the registry (SessionManager) --------------------------------------------------
    f.Create: Op("admin", session=None),
    f.Get: Op("read"),
    f.List: Op("read", session=None),
    f.Rename: Op("admin"),
    f.Delete: Op("admin"),
    f.End: Op("admin"),
    f.Fork: Op("admin"),
    f.CompactAndSplit: Op("admin"),
    f.Search: Op("read", session=None),
    # -- messages -------------------------------------------------------------------------
    f.Append: Op("write"),
    f.Upsert: Op("write"),
    f.AppendAll: Op("write"),
    f.GetHistory: Op("read"),
    f.GetBranches: Op("read"),
    f.GetMessageCount: Op("read"),
    f.ClearMessages: Op("write"),
    f.DeleteMessages: Op("write"),
    f.GetMessage: Op("read"),
    f.GetLatestLeaf: Op("read"),
    f.GetPathLength: Op("read"),
    f.UpdateMessage: Op("write"),
    f.SessionSearch: Op("read"),
    # -- overlays, usage, context, tools ------------------------------------------------
    f.AddCompaction: Op("write"),
    f.GetCompactions: Op("read"),
    f.AddUsage: Op("write"),
    f.GetContextBlocks: Op("read"),
    f.GetContextBlock: Op("read"),
    f.ReplaceContextBlock: Op("write"),
    f.AppendContextBlock: Op("write"),
    f.FreezeSystemPrompt: Op("write"),
    f.RefreshSystemPrompt: Op("write"),
    f.Tools: Op("read"),  # session_id null: the manager's tools, on "*"
    f.RunTool: Op("write"),
    f.Compact: Op("write"),
    f.EstimateTokens: Op("read", js="estimateTokens"),
    # -- event logs ---------------------------------------------------------------------
    f.ReadEvents: Op("read", null="registry", js="readEvents"),
    f.PruneEvents: Op("admin", session=None, js="pruneEvents"),  # every session's log
    f.Subscribe: Op("read", null="registry", js="subscribe"),
    f.Unsubscribe: Op("read", null="registry", js="unsubscribe"),
    # -- the connection -------------------------------------------------------------------
    f.Ping: Op("read", session=None, check="open", js="ping"),
    f.Auth: Op("read", session=None, check="open", js="renew"),
    f.Hello: Op("read", session="sessions", check="announce", js="hello"),
    f.Presence: Op("read", js="presence"),
    f.Summary: Op("read", session=None, check="own", js="summary"),
    # -- streamed messages and turns ------------------------------------------------------
    f.StreamStart: Op("write", js="streamMessage"),
    f.StreamDelta: Op("write", js="streamMessage"),
    f.StreamEnd: Op("write", js="streamMessage"),
    f.TakeTurns: Op("read", session=None, check="own"),  # each turn given is checked (write)
    f.StartTurn: Op("write"),
    f.GetTurn: Op("read"),
    f.TurnFailed: Op("read", session=None, check="own"),
    f.StopTurn: Op("write"),
    f.AnswerTool: Op("write"),
    f.SteerTurn: Op("write"),
    # -- export and import: every session (or those named), judged on "*" ----------------
    f.Export: Op("admin", session=None),
    f.Import: Op("admin", session=None),
    # -- LangGraph checkpoints (the session is the thread) ----------------------------------
    f.CheckpointPut: Op("write"),  # the first put registers the session
    f.CheckpointWrites: Op("write"),
    f.CheckpointGet: Op("read"),
    f.CheckpointList: Op("read"),  # session_id null: every thread, on "*"
    f.CheckpointDelete: Op("write"),
    f.CheckpointPrune: Op("write"),
    f.CheckpointDeleteRuns: Op("write", session=None),  # runs span threads: on "*"
}

#: The declarations by op name (the request's ``op`` tag).
BY_NAME: dict[str, Op] = {str(t.__struct_config__.tag): op for t, op in DECLARED.items()}

#: Ops no method of the Python client (``clients/``) sends, and why. Every other op has
#: one; tests/project/test_ops_declared.py holds the client to this list both ways. Empty today:
#: an op the client leaves out goes here with its reason, e.g.
#: ``"some_op": "connection-internal: the hub sends it, not a program"``.
NOT_IN_PYTHON_CLIENT: dict[str, str] = {}


def declared(request: f.Request) -> Op | None:
    """The declaration of ``request``'s op (``None``: undeclared, which is refused)."""
    return DECLARED.get(type(request))
