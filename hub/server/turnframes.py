"""What a turn says beyond the client protocol: how it ended, to its watchers (the chat
endpoints), and what nodes tell each other about it through the relay.

Values only, so that the ports (:mod:`.ports`), the relay and the chat endpoints can name
them without importing :mod:`.turndispatch`, which takes its host through the ports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from protocol import frames as f

__all__ = ["TurnOffer", "TurnOutcome", "TurnStatus", "Watcher"]


@dataclass(frozen=True)
class TurnOutcome:
    """How a turn ended: ``finished`` (the reply is stored), ``failed`` with why, or
    ``stopped`` (``stop_turn``: the reply is stored as it stood) with the stop's reason."""

    status: Literal["finished", "failed", "stopped"]
    error: str | None = None
    reason: str | None = None


#: A settled turn's outcome as agents 0.32's channels name it (``TurnStatus``: ``queued``,
#: ``running``, ``settled`` with an outcome), logged beside ``status`` on ``turn.ended``;
#: ``turn.started`` says ``state: queued`` (docs/engine.md, "Turn states").
SETTLED_OUTCOME: dict[str, str] = {"finished": "completed", "failed": "failed", "stopped": "aborted"}


def settled(status: str) -> dict[str, str]:
    """The state fields of a ``turn.ended`` of ``status``."""
    return {"state": "settled", "outcome": SETTLED_OUTCOME.get(status, "failed")}


#: Called with each stream frame of a turn's reply, then its outcome.
Watcher = Callable[[f.StreamFrame | TurnOutcome], None]


class TurnOffer(msgspec.Struct, tag="turn_offer", tag_field="frame", kw_only=True):
    """Node ``origin`` asks node ``to`` to give the turn to one of its responders."""

    origin: str
    to: str
    turn: f.TurnFrame


class TurnStatus(msgspec.Struct, tag="turn_status", tag_field="frame", kw_only=True):
    """The answering node's word on an offered turn: ``taken`` (given to a responder),
    ``declined`` (none could take it), ``started``, or ``failed`` with ``error``; or any
    node's ``stop`` of a turn (``error``: the reason) to the node holding it. Also a
    node's count of responders (``turn_id`` empty), so others know where to offer turns;
    or the user's ``word`` to a running turn (``answer``, ``steer``)."""

    origin: str
    to: str
    turn_id: str
    status: Literal["taken", "declined", "started", "failed", "responders", "stop", "answer", "steer"]
    error: str | None = None
    responders: int = 0
    #: ``answer`` (a tool's answer) and ``steer`` (a user message): the user's word, passed
    #: on toward the node whose responder answers the turn (:mod:`.turnanswers`).
    word: dict[str, Any] | None = None
