"""What a draining hub (``Hub.drain()``, what SIGTERM runs) does to what it holds: every
open socket and every new one is closed with 1001 ("go elsewhere"), and a turn in flight
ends in the log (``turn.ended`` ``failed``: its responder's socket was closed) with its partial
reply kept, so nothing waits for a turn that no node runs any more (issue 24, the rolling
restart)."""

from __future__ import annotations

from pathlib import Path

from clients import HubClient
from tests.server.test_turns import _outcome, _session, _taker
from tests.support.hubtest import Client, served


async def test_a_draining_hub_closes_open_and_new_sockets_with_1001(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h:
        await _session(h)
        async with h.client() as open_before:
            await open_before.request("subscribe", session_id="s1", after_seq=0)
            await h.hub.drain()
            code, reason = await open_before.wait_closed()
            assert code == 1001
            assert "resume elsewhere" in (reason or "")
        async with Client.connect(h.ws_url) as after:  # accepted (not an HTTP refusal), then closed
            assert (await after.wait_closed())[0] == 1001


async def test_a_turn_in_flight_at_shutdown_ends_failed_and_keeps_its_partial_reply(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as worker:
        await _session(h)
        await _taker(worker)
        async with HubClient(h.ws_url) as user:
            await user.session("s1").start_turn()
            given = await worker.take(lambda f: f["frame"] == "turn")
            reply = {"session_id": "s1", "message_id": given["reply_id"]}
            started = await worker.request(
                "stream_start", **reply, turn_id=given["turn_id"], role="assistant", parent_id="u1"
            )
            assert started["frame"] == "reply", started
            await worker.request("stream_delta", **reply, kind="text", text="Hel")
            await h.hub.drain()
            outcome = await _outcome(h, "s1")
            # Its responder's socket closes first: the turn is failed for that reason.
            assert outcome["status"] == "failed", outcome
            assert outcome["error"] in ("the responder disconnected mid-reply", "the hub is shutting down")
            stored = await h.hub.manager.get_session("s1").get_message(given["reply_id"])
            assert stored is not None and stored.text() == "Hel"
