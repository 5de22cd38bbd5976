"""The connection limit (hub/server/admission.py): past ``max_connections`` a WebSocket is
closed with 1013 and the documented reason, an HTTP request answered 503, each counted in
``/metrics``; the probes still answer and ``/readyz`` says ``full``; the open connections
are untouched, and a slot freed is taken again. And the clients' error is one line."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx2
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from clients import ConnectionLost, HubClient
from hub.server import HubConfig
from hub.server.admission import CLOSE_FULL, FULL_REASON
from tests.support.hubtest import Client, eventually, served


async def _refused(ws_url: str) -> tuple[int | None, str | None]:
    async with websockets.connect(ws_url) as ws:
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
        return ws.close_code, ws.close_reason


def _refused_count(metrics: str, kind: str) -> float:
    line = next(
        line
        for line in metrics.splitlines()
        if line.startswith(f'sessionhub_connections_refused_total{{kind="{kind}"}}')
    )
    return float(line.split()[-1])


async def test_past_the_limit_a_socket_gets_1013_a_request_503_and_the_open_ones_go_on(
    tmp_path: Path,
) -> None:
    async with served(db=tmp_path / "hub.db", config=HubConfig(max_connections=2)) as h:
        async with Client.connect(h.ws_url) as first, Client.connect(h.ws_url) as second:
            session = (await first.call("create", name="full"))["id"]
            await eventually(lambda: h.hub.admission.open == 2)
            assert await _refused(h.ws_url) == (CLOSE_FULL, FULL_REASON)
            # The chat doors' sockets too (the admission gate; /ws is the socket lane's).
            chat_ws = h.ws_url.removesuffix("/ws") + "/api/chat/ws"
            assert await _refused(chat_ws) == (CLOSE_FULL, FULL_REASON)
            async with httpx2.AsyncClient(base_url=h.url) as http:
                chat = await http.post("/api/chat", json={})
                assert chat.status_code == 503
                assert chat.headers["retry-after"] == "1"
                assert chat.json()["error"]["code"] == "unavailable"
                assert chat.json()["error"]["detail"] == {"max_connections": 2}
                # The probes answer however full: alive, not ready.
                assert (await http.get("/healthz")).status_code == 200
                ready = await http.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["status"] == "full"
                assert ready.json()["admitted"] == 2
                metrics = (await http.get("/metrics")).text
                assert _refused_count(metrics, "websocket") == 2
                assert _refused_count(metrics, "http") == 1
                assert "sessionhub_max_connections 2.0" in metrics
                # The two admitted connections lost nothing.
                await second.call("subscribe", session_id=session, after_seq=0)
                await first.call(
                    "append", session_id=session, message={"id": "m1", "role": "user", "parts": []}
                )
                await second.take(
                    lambda fr: fr.get("frame") == "event" and fr.get("type") == "message.appended"
                )
        # A slot freed is admitted again, and the node is ready again.
        await eventually(lambda: h.hub.admission.open == 0)
        async with Client.connect(h.ws_url) as third:
            assert await third.call("ping") == "pong"
        async with httpx2.AsyncClient(base_url=h.url) as http:
            assert (await http.get("/readyz")).status_code == 200


async def test_the_python_clients_error_at_a_full_hub_is_one_line(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db", config=HubConfig(max_connections=1)) as h,
        Client.connect(h.ws_url),
    ):
        await eventually(lambda: h.hub.admission.open == 1)
        async with HubClient(h.ws_url, open_timeout=0.5, max_backoff=0.05) as hub:
            error: ConnectionLost | None = None
            for _ in range(50):  # sent on a socket the hub closes, or waiting for one
                try:
                    await hub.request("ping")
                except ConnectionLost as exc:
                    error = exc
                    break
        assert error is not None, "a request at a full hub fails"
        message = str(error)
        assert "\n" not in message
        assert "1013" in message and "connection limit" in message, message


def test_hub_config_refuses_a_limit_below_one() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        HubConfig(max_connections=0)
