"""What an idle connection holds (hub/server/socketlane.py, handshake.release_handshake):
/ws is served past Starlette's router with the same checks, the handshake's request and
response are let go once accepted, and a hub mounted under a prefix still serves its /ws."""

from __future__ import annotations

from pathlib import Path

import pytest
import websockets
from starlette.applications import Starlette
from starlette.routing import Mount

from hub.apps.serve import ws_protocol
from hub.server import create_app
from hub.server.asgiscope import RAW_SEND
from tests.support.hubtest import Client, eventually, served


@pytest.mark.parametrize("ws", ["hub", "websockets-sansio"])
async def test_an_accepted_socket_holds_no_handshake(tmp_path: Path, ws: str) -> None:
    # The hub's own protocol lets them go itself; uvicorn's is made to (release_handshake).
    options = {"ws": ws_protocol(ws)}
    async with served(db=tmp_path / "hub.db", options=options) as h, Client.connect(h.ws_url) as c:
        assert await c.call("ping") == "pong"
        (connection,) = await eventually(lambda: list(h.hub.connections))
        protocol = connection.websocket.scope[RAW_SEND].__self__
        assert type(protocol) is ws_protocol(ws) or type(protocol).__name__ == "WebSocketsSansIOProtocol"
        assert protocol.request is None and protocol.response is None
        # Nothing of the router ran for it: no route or endpoint was put in its scope.
        assert "endpoint" not in connection.websocket.scope
        assert h.hub.admission.open == 1


async def test_a_hub_mounted_under_a_prefix_serves_its_socket(tmp_path: Path) -> None:
    hub_app = create_app(db=tmp_path / "hub.db")
    outer = Starlette(routes=[Mount("/hub", app=hub_app)])
    # The outer app runs no lifespan of the mounted one: start it as a user would.
    async with (
        served(app=outer) as h,
        hub_app.router.lifespan_context(hub_app),
        websockets.connect(h.url.replace("http", "ws") + "/hub/ws", proxy=None) as ws,
    ):
        await ws.send('{"op": "ping", "id": 1}')
        assert '"pong"' in str(await ws.recv())
