"""The shared protocol vectors (``tests/vectors/*.json``) against the Python side:
``protocol.clientconn.ClientConnection``, error decoding and delta application.

``web/test/vectors.test.mjs`` runs the same files against ``web/sessionhub.js``, so the two
clients cannot drift apart without one of them failing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from clients import ConnectionLost, LiveMessages
from clients.errors import error_from
from protocol import Event, InvalidInput
from protocol.clientconn import (
    ClientConnection,
    ClientEffect,
    Delivered,
    Failed,
    Ignored,
    PresenceChanged,
    Reset,
    Resolved,
    Streamed,
    Subscribed,
    SubscribeFailed,
    SummaryWanted,
    Unsubscribed,
)
from protocol.deltas import apply_delta
from protocol.frames import StreamFrame

VECTORS = Path(__file__).resolve().parent.parent / "vectors"


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))
    return data


def _sent(data: bytes | None) -> Any:
    return None if data is None else json.loads(data)


def canonical(effect: ClientEffect) -> dict[str, Any]:
    """The effect as the vectors spell it (the JS test builds the same from its effects)."""
    if isinstance(effect, Resolved):
        return {"kind": "resolved", "id": effect.id, "result": effect.result}
    if isinstance(effect, Failed):
        fields = {"id": effect.id, "code": effect.code, "message": effect.message, "detail": effect.detail}
        return {"kind": "failed", **fields}
    if isinstance(effect, Subscribed):
        return {"kind": "subscribed", "session_id": effect.key, "result": effect.result}
    if isinstance(effect, SubscribeFailed):
        fields = {"id": effect.id, "code": effect.code, "message": effect.message, "detail": effect.detail}
        return {"kind": "subscribe_failed", "session_id": effect.key, **fields}
    if isinstance(effect, Delivered):
        event = effect.event
        return {"kind": "delivered", "session_id": effect.key, "seq": event.seq, "epoch": event.epoch}
    if isinstance(effect, Reset):
        again = None if effect.resubscribe is None else _sent(effect.resubscribe[1])
        frame = effect.frame
        return {
            "kind": "reset",
            "session_id": effect.key,
            "epoch": frame.epoch,
            "last_seq": frame.last_seq,
            "resubscribe": again,
        }
    if isinstance(effect, Unsubscribed):
        return {"kind": "unsubscribed", "session_id": effect.key, "code": effect.frame.code}
    if isinstance(effect, Ignored):
        return {"kind": "ignored", "reason": effect.reason}
    if isinstance(effect, Streamed):
        f = effect.frame
        return {"kind": "stream", "message_id": f.message_id, "action": f.action, "index": f.index}
    if isinstance(effect, PresenceChanged):
        return {"kind": "presence", "session_id": effect.frame.session_id, "action": effect.frame.action}
    assert isinstance(effect, SummaryWanted)
    return {"kind": "summarize", "request_id": effect.frame.request_id}


def _call(conn: ClientConnection, step: dict[str, Any]) -> Any:
    do = step["do"]
    if do == "subscribe":
        _, data = conn.subscribe(
            step["session_id"],
            step.get("after_seq", 0),
            step.get("epoch"),
            presence=step.get("presence", False),
            reload=step.get("reload", False),
        )
        return _sent(data)
    if do == "unsubscribe":
        return _sent(conn.unsubscribe(step["session_id"])[1])
    if do == "request":
        return _sent(conn.request(step["op"], **step["fields"])[1])
    if do == "resubscribe":
        return [_sent(data) for _, data in conn.resubscribe()]
    if do == "abandon":
        conn.abandon(step["id"])
        return None
    if do == "hello":
        hello = conn.hello(
            step.get("name"),
            step.get("role"),
            step.get("sessions", []),
            summarizer=step.get("summarizer", False),
        )
        return _sent(hello)
    if do == "summary":
        return _sent(conn.summary(step["request_id"], step.get("summary"), step.get("error")))
    if do == "position":
        position = conn.positions.get(step["session_id"])
        return None if position is None else {"epoch": position.epoch, "seq": position.seq}
    raise AssertionError(f"unknown step {do!r}")


CONNECTION = _load("connection")["cases"]


@pytest.mark.parametrize("case", CONNECTION, ids=[c["name"] for c in CONNECTION])
def test_connection_vector(case: dict[str, Any]) -> None:
    conn = ClientConnection()
    for number, step in enumerate(case["steps"]):
        where = f"step {number}: {step}"
        if "receive" in step:
            effect = conn.receive_text(json.dumps(step["receive"]))
            assert canonical(effect) == step["effect"], where
        elif step["do"] == "position":
            assert _call(conn, step) == step["is"], where
        else:
            assert _call(conn, step) == step.get("sends"), where


ERRORS = _load("errors")


@pytest.mark.parametrize("case", ERRORS["cases"], ids=[c["frame"]["message"] for c in ERRORS["cases"]])
def test_error_vector(case: dict[str, Any]) -> None:
    conn = ClientConnection()
    effect = conn.receive_text(json.dumps(case["frame"]))
    assert isinstance(effect, Failed)
    error = error_from(effect.code, effect.message, effect.detail)
    assert type(error).__name__ == case["type"]["python"]
    assert {"code": error.code, "message": str(error), "detail": error.detail} == case["error"]


def test_connection_lost_vector() -> None:
    lost = ERRORS["lost"]
    error = ConnectionLost()
    assert type(error).__name__ == lost["type"]["python"]
    assert (error.code, str(error)) == (lost["code"], lost["message"])


DELTAS = _load("deltas")


@pytest.mark.parametrize("case", DELTAS["apply"], ids=[c["name"] for c in DELTAS["apply"]])
def test_apply_delta_vector(case: dict[str, Any]) -> None:
    parts = json.loads(json.dumps(case["parts"]))
    delta = case["delta"]
    if case.get("invalid"):
        with pytest.raises(InvalidInput):
            apply_delta(parts, delta.get("kind"), delta.get("text"), delta.get("part"))
    else:
        apply_delta(parts, delta.get("kind"), delta.get("text"), delta.get("part"))
    assert parts == case["after"]


def _event(data: dict[str, Any]) -> Event:
    return Event(
        session_id="s1",
        seq=1,
        epoch="e1",
        type=data["type"],
        data=data["data"],
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize("case", DELTAS["live"], ids=[c["name"] for c in DELTAS["live"]])
def test_live_messages_vector(case: dict[str, Any]) -> None:
    live = LiveMessages()
    for number, step in enumerate(case["feed"]):
        if "frame" in step:
            live.apply(msgspec.convert(step["frame"], StreamFrame))
        elif "event" in step:
            live.apply_event(_event(step["event"]))
        else:
            expect = step["expect"]
            held = {
                "message": live.messages.get("m"),
                "status": live.status.get("m"),
                "index": live.index.get("m"),
            }
            assert held == expect, f"step {number}"
