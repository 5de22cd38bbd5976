"""ServerConnection (protocol/serverconn.py) without a socket: what it refuses, what it
keeps per subscription, and that it reads no clock. The shared cases are in
tests/vectors/server_connection.json (test_server_vectors.py)."""

from __future__ import annotations

import functools
import json
from typing import Any

from hub.auth import Grant, issue_token, verify_token
from protocol.frames import REQUEST_TYPES, Auth, ErrorFrame, ReplyFrame, Subscribe
from protocol.serverconn import ArmExpiry, Close, Refused, Send, ServerConnection, Subscription

SECRET = "a secret of thirty-two bytes or more, for HS256"


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def sub(rid: int, session_id: str | None, after_seq: int = 0) -> str:
    return frame(op="subscribe", id=rid, session_id=session_id, after_seq=after_seq)


def conn(**kwargs: Any) -> ServerConnection[Grant]:
    return ServerConnection(**kwargs)


def test_passes_requests_and_answers_bad_frames() -> None:
    c = conn()
    request = c.receive_text(frame(op="get", id=1, session_id="s"), 0.0)
    assert type(request) is REQUEST_TYPES["get"]
    refused = c.receive_text("nope", 0.0)
    assert isinstance(refused, Refused) and (refused.frame.code, refused.reason) == ("bad_frame", "bad_frame")
    limited = conn(max_frame_bytes=20)
    refused = limited.receive_text(frame(op="get", id=2, session_id="s" * 40), 0.0)
    assert isinstance(refused, Refused) and (refused.frame.code, refused.frame.id) == ("too_large", 2)


def test_limits_subscriptions() -> None:
    c = conn(max_subscriptions=3)
    for i, key in enumerate(["a", "b", None]):
        assert isinstance(c.receive_text(sub(i, key), 0.0), Subscribe)
    assert set(c.subscriptions) == {"a", "b", None}
    refused = c.receive_text(sub(9, "c"), 0.0)
    assert isinstance(refused, Refused) and (refused.frame.code, refused.frame.id) == ("too_many", 9)
    assert "3" in refused.frame.message
    # Unsubscribing frees a slot; so does the server ending a subscription.
    assert not isinstance(c.receive_text(frame(op="unsubscribe", id=10, session_id="a"), 0.0), Refused)
    assert isinstance(c.receive_text(sub(11, "c"), 0.0), Subscribe)
    c.ended("b")
    assert isinstance(c.receive_text(sub(12, "d"), 0.0), Subscribe)
    assert set(c.subscriptions) == {"c", "d", None}


def test_refuses_a_duplicate_subscription_and_a_negative_after_seq() -> None:
    c = conn()
    assert isinstance(c.receive_text(sub(1, "a"), 0.0), Subscribe)
    refused = c.receive_text(sub(2, "a", after_seq=5), 0.0)
    assert isinstance(refused, Refused) and (refused.frame.code, refused.frame.id) == ("invalid", 2)
    assert c.subscriptions["a"] == Subscription(
        after_seq=0, epoch=None, presence=False
    )  # not the refused one's
    refused = c.receive_text(sub(3, "b", after_seq=-1), 0.0)
    assert isinstance(refused, Refused) and "after_seq" in refused.frame.message
    assert set(c.subscriptions) == {"a"}  # the refused subscription takes no slot


def test_a_refused_request_changes_nothing() -> None:
    """Draining or forbidden: a subscribe takes no slot, an unsubscribe ends nothing."""
    c = conn(verify=functools.partial(verify_token, SECRET))
    c.connect(issue_token(SECRET, {"a": "read"}, ttl=60, now=1000), 1000)
    assert isinstance(c.receive_text(sub(1, "a"), 1001), Subscribe)
    for draining in (True, False):
        refused = c.receive_text(sub(2, "b"), 1001, draining=draining)
        assert isinstance(refused, Refused) and refused.reason == ("draining" if draining else "forbidden")
    refused = c.receive_text(frame(op="unsubscribe", id=3, session_id="a"), 1001, draining=True)
    assert isinstance(refused, Refused) and refused.frame.code == "unavailable"
    assert set(c.subscriptions) == {"a"}


def test_reads_no_clock() -> None:
    """Expiry is judged at the ``now`` passed in, whatever the wall clock says: a token of
    1970 is good at 1970's times, and one of the far future expires at its exp."""
    c = conn(verify=functools.partial(verify_token, SECRET))
    assert c.connect(issue_token(SECRET, {"*": "read"}, ttl=100, now=1000), 1000) == [ArmExpiry(1100.0)]
    get = frame(op="get", id=1, session_id="s")
    assert not isinstance(c.receive_text(get, 1099.9), Refused)
    assert isinstance(c.receive_text(get, 1100), Refused)
    assert c.tick(1099) == [ArmExpiry(1100.0)]
    [close] = c.tick(1100)
    assert isinstance(close, Close) and close.code == 4001
    later = conn(verify=functools.partial(verify_token, SECRET))
    far = issue_token(SECRET, {"*": "read"}, ttl=60, now=4_000_000_000)
    assert later.connect(far, 4_000_000_030) == [ArmExpiry(4_000_000_060.0)]
    assert later.tick(4_000_000_060) == [Close(4001, close.reason)]


def test_renewal_with_auth_off_and_a_bad_token() -> None:
    c = conn()
    auth = c.receive_text(frame(op="auth", id=1, token="x"), 0.0)
    assert isinstance(auth, Auth)
    assert c.renew(auth, 0.0) == [Send(ReplyFrame(id=1, result={"sub": None, "exp": None, "ended": []}))]
    secured = conn(verify=functools.partial(verify_token, SECRET))
    assert secured.renew(auth, 0.0) == [Send(ErrorFrame(id=1, code="forbidden", message="forbidden"))]
    assert secured.grant is None


def test_in_flight_counts_and_reading() -> None:
    c = conn(max_in_flight=1)
    assert c.reading
    c.started()
    assert not c.reading
    assert c.finished() is not None and c.reading
