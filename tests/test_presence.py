"""Presence: who is on a session, announced with hello or by subscribing, live join/leave."""

from __future__ import annotations

from pathlib import Path

from clients import HubClient
from protocol.frames import PresenceFrame

from .hubtest import eventually, served


async def test_subscribers_and_announced_connections_are_present(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub:
        seen: list[PresenceFrame] = []
        async with HubClient(hub.ws_url, name="dash", role="observer", on_presence=seen.append) as observer:
            session = await observer.sessions.create("chat")
            events = observer.subscribe(session.id)
            first = await anext(events)  # the subscription is live
            assert first.type == "session.created"
            async with HubClient(hub.ws_url, name="worker-1", role="worker", sessions=[session.id]) as worker:
                await eventually(lambda: len(seen) >= 2)
                who = {(e["name"], e["role"]) for e in await observer.presence(session.id)}
                assert who == {("dash", "observer"), ("worker-1", "worker")}
                joined = [f for f in seen if f.action == "join"]
                assert {f.entry["name"] for f in joined} == {"dash", "worker-1"}
                assert all(f.session_id == session.id for f in seen)
                assert await worker.presence("another-session") == []
            # The worker closed its client: it leaves, and the observer is told.
            await eventually(lambda: any(f.action == "leave" for f in seen))
            left = [f for f in seen if f.action == "leave"]
            assert [f.entry["name"] for f in left] == ["worker-1"]
            assert [e["name"] for e in await observer.presence(session.id)] == ["dash"]
            await events.aclose()


async def test_a_killed_connection_leaves_presence(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub:
        seen: list[PresenceFrame] = []
        async with HubClient(hub.ws_url, name="dash", on_presence=seen.append) as observer:
            session = await observer.sessions.create("chat")
            events = observer.subscribe(session.id)
            await anext(events)
            worker = HubClient(
                hub.ws_url, name="doomed", role="worker", sessions=[session.id], reconnect=False
            )
            await worker.connect()
            await eventually(lambda: any(f.entry["name"] == "doomed" for f in seen))
            # Cut the worker off from the server side, as a dead peer would be.
            (conn,) = [c for c in hub.hub.connections if c.name == "doomed"]
            await conn.close(1011, "test: peer died")
            await eventually(lambda: any(f.action == "leave" and f.entry["name"] == "doomed" for f in seen))
            assert [e["name"] for e in await observer.presence(session.id)] == ["dash"]
            await worker.aclose()
            await events.aclose()


async def test_unsubscribing_leaves_unless_announced(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url, name="solo") as client:
        session = await client.sessions.create("chat")
        events = client.subscribe(session.id)
        await anext(events)
        assert [e["name"] for e in await client.presence(session.id)] == ["solo"]
        await events.aclose()
        await eventually(lambda: not hub.hub.presence.get(session.id))
        assert await client.presence(session.id) == []


async def test_presence_survives_a_reconnect(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url, name="w", role="worker", sessions=["s-1"]) as worker,
    ):
        await eventually(lambda: bool(hub.hub.presence.get("s-1")))
        (conn,) = list(hub.hub.connections)
        await conn.close(1011, "test drop")
        # The client reconnects and announces itself again on the new socket.
        await eventually(lambda: worker.reconnects == 1 and bool(hub.hub.presence.get("s-1")))
        assert [(e["name"], e["role"]) for e in await worker.presence("s-1")] == [("w", "worker")]


async def test_a_streaming_writer_is_present_while_it_streams(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub:
        seen: list[PresenceFrame] = []
        async with HubClient(hub.ws_url, name="dash", on_presence=seen.append) as observer:
            session = await observer.sessions.create("chat")
            events = observer.subscribe(session.id)
            await anext(events)
            # The writer neither subscribes nor announces the session: streaming puts it there.
            async with HubClient(hub.ws_url, name="writer", role="worker") as writer:
                assert [e["name"] for e in await observer.presence(session.id)] == ["dash"]
                async with writer.session(session.id).stream_message("m1") as stream:
                    await stream.text("hello")
                    await eventually(lambda: any(f.entry["name"] == "writer" for f in seen))
                    names = sorted(e["name"] for e in await observer.presence(session.id))
                    assert names == ["dash", "writer"]
                # Its stream ended: it was there only for it, so it leaves.
                await eventually(
                    lambda: any(f.action == "leave" and f.entry["name"] == "writer" for f in seen)
                )
                assert [e["name"] for e in await observer.presence(session.id)] == ["dash"]
            await events.aclose()
