"""hub.auth.VerifiedTokens: a token's signature is checked once, its times on every use.
A remembered token expires, and a not-yet-valid one waits, exactly as an unremembered one;
a forged token is never a hit; the memory is bounded; the hub's connections share it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from hub import Forbidden
from hub.auth import VerifiedTokens, issue_token, verify_token
from hub.server import HubConfig
from tests.support.hubtest import served

SECRET = "a-test-secret-that-is-long-enough-for-hs256"
OTHER = "another-secret-that-is-long-enough-for-hs256"


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every token pyjwt decodes (it still decodes them: the count is what is checked)."""
    seen: list[str] = []
    real = jwt.decode

    def counted(token: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(token)
        return real(token, *args, **kwargs)

    monkeypatch.setattr("hub.auth.jwt.decode", counted)
    return seen


def signed(claims: dict[str, Any], secret: str = SECRET) -> str:
    return jwt.encode({"sub": "t", "scopes": {"*": "read"}, **claims}, secret, "HS256")


def test_a_token_is_decoded_once_and_grants_what_verify_token_does(decodes: list[str]) -> None:
    tokens = VerifiedTokens(SECRET)
    token = issue_token(SECRET, {"abc": "write"}, subject="w", ttl=60)
    first = tokens.verify(token)
    assert tokens.verify(token) is first
    assert first == verify_token(SECRET, token)
    assert decodes.count(token) == 2  # once by the cache, once by verify_token above


def test_expiry_is_judged_on_every_use(decodes: list[str]) -> None:
    now = time.time()
    tokens = VerifiedTokens(SECRET)
    token = signed({"exp": int(now) + 10})
    assert tokens.verify(token, now=now).expires_at == int(now) + 10
    assert tokens.verify(token, now=int(now) + 9.5)
    for at in (int(now) + 10, int(now) + 11):
        with pytest.raises(Forbidden, match=r"^forbidden$"):
            tokens.verify(token, now=at)
    # The wall clock too: an expired token is refused although its signature was checked.
    expired = signed({"exp": int(now) - 1})
    with pytest.raises(Forbidden):
        tokens.verify(expired)
    with pytest.raises(Forbidden):
        tokens.verify(expired)
    assert len(tokens) == 0  # past exp a token never verifies again: it is not kept


@pytest.mark.parametrize("claim", ["nbf", "iat"])
def test_a_token_valid_only_later_waits_for_its_time(claim: str, decodes: list[str]) -> None:
    now = time.time()
    tokens = VerifiedTokens(SECRET)
    token = signed({"exp": int(now) + 100, claim: int(now) + 50})
    with pytest.raises(Forbidden):
        tokens.verify(token, now=now)
    with pytest.raises(Forbidden):
        tokens.verify(token, now=now + 49)
    assert tokens.verify(token, now=now + 51)
    assert decodes.count(token) == 1  # the signature was checked once, the time three times
    # Bad time claims are refused as verify_token refuses them.
    for bad in ({"exp": "soon"}, {"exp": int(now) + 100, claim: "now"}):
        with pytest.raises(Forbidden):
            tokens.verify(signed(bad), now=now)


def test_a_forged_token_is_never_a_hit() -> None:
    tokens = VerifiedTokens(SECRET)
    claims = {"exp": int(time.time()) + 60}
    assert tokens.verify(signed(claims))
    with pytest.raises(Forbidden):
        tokens.verify(signed(claims, OTHER))  # the same claims, another signature
    genuine = signed(claims)
    header, payload, signature = genuine.split(".")
    with pytest.raises(Forbidden):
        tokens.verify(f"{header}.{payload}.{signature[:-2]}AA")
    for nothing in (None, ""):
        with pytest.raises(Forbidden):
            tokens.verify(nothing)


def test_the_memory_is_bounded_least_recently_used_first(decodes: list[str]) -> None:
    tokens = VerifiedTokens(SECRET, size=4)
    exp = int(time.time()) + 60
    many = [signed({"exp": exp, "sub": f"s{i}"}) for i in range(6)]
    for token in many[:4]:
        tokens.verify(token)
    tokens.verify(many[0])  # used again: the most recent now
    tokens.verify(many[4])
    tokens.verify(many[5])
    assert len(tokens) == 4
    decodes.clear()
    tokens.verify(many[0])
    assert decodes == []  # kept: it was used recently
    tokens.verify(many[1])
    assert decodes == [many[1]]  # dropped as the least recently used, so decoded again
    # The default bound.
    assert VerifiedTokens(SECRET).size == 1024


async def test_the_hubs_connections_share_one_verification(tmp_path: Path, decodes: list[str]) -> None:
    token = issue_token(SECRET, {"*": "admin"})
    headers = {"Authorization": f"Bearer {token}"}
    async with served(db=tmp_path / "hub.db", config=HubConfig(auth_secret=SECRET)) as hub:
        for _ in range(3):
            async with hub.client(additional_headers=headers) as client:
                assert await client.call("list") == []
                assert (await client.request("auth", token=token))["frame"] == "reply"
        assert decodes.count(token) == 1
        # An expired token is refused at connect and in band, although one like it verified.
        expired = issue_token(SECRET, {"*": "admin"}, ttl=-1)
        async with hub.client(additional_headers={"Authorization": f"Bearer {expired}"}) as client:
            frame = await client.request("list")
            assert (frame["code"], frame["message"]) == ("forbidden", "forbidden")
