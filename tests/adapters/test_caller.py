"""The rules every HTTP door of the adapters shares (hub/adapters/caller.py): the Origin, the
token before the body, the scope of the equivalent WebSocket op. The doors themselves are
driven through a served hub in test_aisdk_chat.py and test_mcp.py."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from hub.adapters.caller import caller, cors_headers, origin_allowed
from hub.auth import issue_token
from hub.server import HubConfig
from protocol import Forbidden

SECRET = "s" * 32


def _headers(**fields: str) -> Headers:
    return Headers({k.replace("_", "-"): v for k, v in fields.items()})


def test_a_browser_from_elsewhere_is_refused_unless_allowed() -> None:
    config = HubConfig(allowed_origins=("https://app.example",))
    assert origin_allowed(_headers(host="hub:8000"), config)  # not a browser
    assert origin_allowed(_headers(host="hub:8000", origin="http://hub:8000"), config)  # itself
    assert origin_allowed(_headers(host="hub:8000", origin="https://app.example"), config)
    assert not origin_allowed(_headers(host="hub:8000", origin="https://evil.example"), config)
    assert origin_allowed(
        _headers(host="hub:8000", origin="https://evil.example"), HubConfig(allowed_origins=("*",))
    )


def test_cors_headers_only_for_an_allowed_cross_origin_page() -> None:
    config = HubConfig(allowed_origins=("https://app.example",))
    assert cors_headers(_headers(host="hub:8000"), config) == {}
    assert cors_headers(_headers(host="hub:8000", origin="https://evil.example"), config) is None
    cors = cors_headers(_headers(host="hub:8000", origin="https://app.example"), config, expose="x-a")
    assert cors is not None
    assert cors["access-control-allow-origin"] == "https://app.example"
    assert cors["access-control-expose-headers"] == "x-a"
    assert cors["vary"] == "Origin"


def test_without_a_secret_everyone_may_do_everything() -> None:
    anyone = caller(_headers(), HubConfig())
    assert anyone.allows("delete", "any") and anyone.allows("list", None)
    anyone.check("create", "any")


def test_with_a_secret_the_token_is_checked_first_then_each_op_by_its_scope() -> None:
    config = HubConfig(auth_secret=SECRET)
    with pytest.raises(Forbidden):
        caller(_headers(), config)  # no token: refused before any body is read
    with pytest.raises(Forbidden):
        caller(_headers(authorization="Bearer forged"), config)
    reader = caller(_headers(authorization="Bearer " + issue_token(SECRET, {"s1": "read"})), config)
    assert reader.allows("get_history", "s1")
    assert not reader.allows("append", "s1")  # read cannot write
    assert not reader.allows("get_history", "s2")  # nor reach another session
    with pytest.raises(Forbidden):
        reader.check("append_all", "s1")
    writer = caller(_headers(authorization="bearer " + issue_token(SECRET, {"s1": "write"})), config)
    writer.check("append_all", "s1")
    assert not writer.allows("create", "s1")  # creating a session needs admin
