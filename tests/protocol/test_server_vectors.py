"""The server connection's shared vectors (``tests/vectors/server_connection.json``)
against :class:`protocol.serverconn.ServerConnection`: frames, ticks and stream positions
in, effects out, with real tokens (``hub.auth``) and no socket."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub.auth import Grant, issue_token, verify_token
from protocol import frames as f
from protocol.serverconn import (
    ArmExpiry,
    Close,
    EndSubscription,
    Join,
    Leave,
    Reannounce,
    Refused,
    Resume,
    Send,
    ServerConnection,
    ServerEffect,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors"
SECRET = "server-connection-vectors, 32 bytes or more"
CASES: list[dict[str, Any]] = json.loads((VECTORS / "server_connection.json").read_text(encoding="utf-8"))[
    "cases"
]


def _token(spec: Any) -> Any:
    """A token written as ``{sub, scopes, exp}`` is issued (its ``exp`` exactly that)."""
    if not isinstance(spec, dict):
        return spec
    return issue_token(SECRET, spec["scopes"], subject=spec["sub"], ttl=spec["exp"], now=0)


def canonical(effect: ServerEffect | f.Request) -> dict[str, Any]:
    """The effect as the vectors spell it."""
    if isinstance(effect, Refused):
        frame = effect.frame
        return {"kind": "refused", "reason": effect.reason, "code": frame.code, "id": frame.id}
    if isinstance(effect, Send):
        return {"kind": "send", "frame": msgspec.to_builtins(effect.frame)}
    if isinstance(effect, ArmExpiry):
        return {"kind": "arm_expiry", "at": effect.at}
    if isinstance(effect, Close):
        return {"kind": "close", "code": effect.code, "reason": effect.reason}
    if isinstance(effect, EndSubscription):
        return {"kind": "end_subscription", "session_id": effect.key}
    if isinstance(effect, Join):
        return {"kind": "join", "session_id": effect.session_id}
    if isinstance(effect, Leave):
        return {"kind": "leave", "session_id": effect.session_id}
    if isinstance(effect, Reannounce):
        return {"kind": "reannounce"}
    if isinstance(effect, Resume):
        return {"kind": "resume"}
    assert isinstance(effect, f.Request), effect
    return {"kind": "run", "op": type(effect).__struct_config__.tag, "id": effect.id}


def state(conn: ServerConnection[Grant]) -> dict[str, Any]:
    grant = conn.grant
    return {
        "name": conn.name,
        "role": conn.role,
        "announced": sorted(conn.announced),
        "summarizer": conn.summarizer,
        "presence_watch": sorted(conn.presence_watch),
        "subscriptions": [{"session_id": key, **asdict(sub)} for key, sub in conn.subscriptions.items()],
        "reading": conn.reading,
        "in_flight": conn.in_flight,
        "grant": None if grant is None else {"sub": grant.subject, "exp": grant.expires_at},
    }


def _receive(
    conn: ServerConnection[Grant], step: dict[str, Any], subscribes: dict[Any, f.Subscribe]
) -> list[Any]:
    if "receive_text" in step:
        data = step["receive_text"]
    else:
        fields = dict(step["receive"])
        if "token" in fields:
            fields["token"] = _token(fields["token"])
        data = json.dumps(fields)
    now = float(step.get("now", 0))
    parsed = conn.receive_text(data, now, draining=step.get("draining", False))
    effects: list[Any] = [parsed]
    # What the shell does with these two in the reader (or the hello task), at once.
    if isinstance(parsed, f.Hello):
        effects += conn.hello(parsed)
    elif isinstance(parsed, f.Auth):
        effects += conn.renew(parsed, now)
    elif isinstance(parsed, f.Subscribe):
        subscribes[parsed.session_id] = parsed
    return effects


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_server_connection_vector(case: dict[str, Any]) -> None:
    verify = functools.partial(verify_token, SECRET) if case.get("auth") else None
    conn: ServerConnection[Grant] = ServerConnection(**case.get("config", {}), verify=verify)
    subscribes: dict[Any, f.Subscribe] = {}
    for number, step in enumerate(case["steps"]):
        where = f"step {number}: {step}"
        effects: list[Any]
        if "receive" in step or "receive_text" in step:
            effects = _receive(conn, step, subscribes)
        elif "connect" in step:
            effects = conn.connect(_token(step["connect"]), float(step["now"]))
        elif "tick" in step:
            effects = conn.tick(float(step["tick"]))
        elif "opened" in step:
            stream = step["stream"]
            request = subscribes[step["opened"]]
            effects = [conn.opened(request, stream["epoch"], stream["first_seq"], stream["last_seq"])]
        elif "ended" in step:
            effects = [e for e in [conn.ended(step["ended"])] if e is not None]
        elif "started" in step:
            for _ in range(step["started"]):
                conn.started()
            continue
        elif "finished" in step:
            effects = [e for e in [conn.finished()] if e is not None]
        else:
            assert "is" in step, where
            now = state(conn)
            assert {key: now[key] for key in step["is"]} == step["is"], where
            continue
        assert [canonical(e) for e in effects] == step["effects"], where


def test_every_effect_kind_is_in_the_vectors() -> None:
    """The vectors exercise every kind of effect the state machine gives out."""
    kinds = {e["kind"] for case in CASES for step in case["steps"] for e in step.get("effects", [])}
    assert kinds == {
        "run",
        "refused",
        "send",
        "arm_expiry",
        "close",
        "end_subscription",
        "join",
        "leave",
        "reannounce",
        "resume",
    }
