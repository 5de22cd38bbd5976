"""Presence: who is on a session, announced with hello or by subscribing, live join/leave."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from clients import HubClient
from protocol import SessionInfo
from protocol.frames import PresenceFrame
from tests.support.hubtest import Served, eventually, served


@contextlib.asynccontextmanager
async def watched(
    tmp_path: Path, role: str | None = None
) -> AsyncIterator[tuple[Served, HubClient, SessionInfo, list[PresenceFrame]]]:
    """A served hub, and ``dash`` (as ``role``) subscribed to a new session ``chat`` with
    presence on: yields the hub, ``dash``, the session and every presence frame ``dash`` is
    sent. The subscription is live when it yields; it is closed on the way out."""
    async with served(db=tmp_path / "hub.db") as hub:
        seen: list[PresenceFrame] = []
        async with HubClient(hub.ws_url, name="dash", role=role, on_presence=seen.append) as observer:
            session = await observer.sessions.create("chat")
            events = observer.subscribe(session.id)
            first = await anext(events)  # the subscription is live
            assert first.type == "session.created"
            yield hub, observer, session, seen
            await events.aclose()


async def cut_off(hub: Served, name: str) -> None:
    """Close ``name``'s connection from the server side, as a dead peer would be."""
    (conn,) = [c for c in hub.hub.connections if c.name == name]
    await conn.close(1011, "test: peer died")


async def test_subscribers_and_announced_connections_are_present(tmp_path: Path) -> None:
    async with watched(tmp_path, role="observer") as (hub, observer, session, seen):
        async with HubClient(hub.ws_url, name="worker-1", role="worker", sessions=[session.id]) as worker:
            await eventually(lambda: len(seen) >= 2)
            who = {(e.name, e.role) for e in await observer.presence(session.id)}
            assert who == {("dash", "observer"), ("worker-1", "worker")}
            joined = [f for f in seen if f.action == "join"]
            assert {f.entry.name for f in joined} == {"dash", "worker-1"}
            assert all(f.session_id == session.id for f in seen)
            assert await worker.presence("another-session") == []
        # The worker closed its client: it leaves, and the observer is told.
        await eventually(lambda: any(f.action == "leave" for f in seen))
        left = [f for f in seen if f.action == "leave"]
        assert [f.entry.name for f in left] == ["worker-1"]
        assert [e.name for e in await observer.presence(session.id)] == ["dash"]


async def test_a_killed_connection_leaves_presence(tmp_path: Path) -> None:
    async with watched(tmp_path) as (hub, observer, session, seen):
        worker = HubClient(hub.ws_url, name="doomed", role="worker", sessions=[session.id], reconnect=False)
        await worker.connect()
        await eventually(lambda: any(f.entry.name == "doomed" for f in seen))
        await cut_off(hub, "doomed")
        await eventually(lambda: any(f.action == "leave" and f.entry.name == "doomed" for f in seen))
        assert [e.name for e in await observer.presence(session.id)] == ["dash"]
        await worker.aclose()


async def test_unsubscribing_leaves_unless_announced(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url, name="solo") as client:
        session = await client.sessions.create("chat")
        events = client.subscribe(session.id)
        await anext(events)
        assert [e.name for e in await client.presence(session.id)] == ["solo"]
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
        assert [(e.name, e.role) for e in await worker.presence("s-1")] == [("w", "worker")]


async def test_a_streaming_writer_is_present_while_it_streams(tmp_path: Path) -> None:
    # The writer neither subscribes nor announces the session: streaming puts it there.
    async with (
        watched(tmp_path) as (hub, observer, session, seen),
        HubClient(hub.ws_url, name="writer", role="worker") as writer,
    ):
        assert [e.name for e in await observer.presence(session.id)] == ["dash"]
        async with writer.session(session.id).stream_message("m1") as stream:
            await stream.text("hello")
            await eventually(lambda: any(f.entry.name == "writer" for f in seen))
            names = sorted(str(e.name) for e in await observer.presence(session.id))
            assert names == ["dash", "writer"]
        # Its stream ended: it was there only for it, so it leaves.
        await eventually(lambda: any(f.action == "leave" and f.entry.name == "writer" for f in seen))
        assert [e.name for e in await observer.presence(session.id)] == ["dash"]


def streaming_of(name: str, frames: list[PresenceFrame]) -> list[tuple[str, list[str]]]:
    """The action and ``streaming`` of each presence frame about ``name``, in order."""
    return [(f.action, f.entry.streaming) for f in frames if f.entry.name == name]


async def test_presence_says_what_a_connection_streams(tmp_path: Path) -> None:
    async with watched(tmp_path) as (hub, observer, session, seen):
        other = await observer.sessions.create("elsewhere")

        async def streaming() -> dict[str | None, list[str]]:
            return {e.name: e.streaming for e in await observer.presence(session.id)}

        async with HubClient(hub.ws_url, name="writer-1", role="worker") as writer:
            s = writer.session(session.id)
            async with s.stream_message("m-42") as first:
                await first.text("hello")
                await eventually(lambda: streaming_of("writer-1", seen) == [("join", ["m-42"])])
                assert await streaming() == {"dash": [], "writer-1": ["m-42"]}
                # A second stream in the same session, and one in another session: each
                # session's entry lists only its own streams, oldest first.
                async with s.stream_message("m-43", parent_id=None) as second:
                    await second.text("hi")
                    async with writer.session(other.id).stream_message("x-1"):
                        await eventually(
                            lambda: streaming_of("writer-1", seen)[-1] == ("join", ["m-42", "m-43"])
                        )
                        assert await streaming() == {"dash": [], "writer-1": ["m-42", "m-43"]}
                        assert [e.streaming for e in await observer.presence(other.id)] == [["x-1"]]
                await eventually(lambda: streaming_of("writer-1", seen)[-1] == ("join", ["m-42"]))
                assert await streaming() == {"dash": [], "writer-1": ["m-42"]}
            # The last stream ended: the writer was there only for it, and leaves, with an
            # entry that streams nothing.
            await eventually(lambda: streaming_of("writer-1", seen)[-1] == ("leave", []))
            assert await streaming() == {"dash": []}
            assert hub.hub.presence.streaming == {}


async def test_a_subscribed_writer_stays_and_its_mark_clears(tmp_path: Path) -> None:
    async with (
        watched(tmp_path) as (hub, observer, session, seen),
        HubClient(hub.ws_url, name="writer", sessions=[session.id]) as writer,
    ):
        await eventually(lambda: streaming_of("writer", seen) == [("join", [])])
        async with writer.session(session.id).stream_message("m1") as stream:
            await stream.text("hello")
            await eventually(lambda: streaming_of("writer", seen)[-1] == ("join", ["m1"]))
        # Announced with hello: it stays on the session, streaming nothing.
        await eventually(lambda: streaming_of("writer", seen)[-1] == ("join", []))
        entries = {e.name: e.streaming for e in await observer.presence(session.id)}
        assert entries == {"dash": [], "writer": []}


async def test_unsubscribing_mid_stream_stays_until_the_stream_ends(tmp_path: Path) -> None:
    async with (
        watched(tmp_path) as (hub, observer, session, seen),
        HubClient(hub.ws_url, name="writer") as writer,
    ):
        own = writer.subscribe(session.id)
        await anext(own)
        async with writer.session(session.id).stream_message("m1") as stream:
            await eventually(lambda: streaming_of("writer", seen)[-1:] == [("join", ["m1"])])
            await own.aclose()
            await stream.text("still streaming")
            # Still there: it streams into the session.
            await writer.ping()
            names = {e.name: e.streaming for e in await observer.presence(session.id)}
            assert names == {"dash": [], "writer": ["m1"]}
        await eventually(lambda: streaming_of("writer", seen)[-1] == ("leave", []))


async def test_a_writer_dropped_mid_stream_leaves_with_its_mark_cleared(tmp_path: Path) -> None:
    async with watched(tmp_path) as (hub, observer, session, seen):
        writer = HubClient(hub.ws_url, name="doomed", sessions=[session.id], reconnect=False)
        await writer.connect()
        stream = await writer.session(session.id).start_stream("m1")
        await stream.text("half a")
        await eventually(lambda: hub.hub.streams.active[(session.id, "m1")].index == 1)
        await eventually(lambda: streaming_of("doomed", seen)[-1:] == [("join", ["m1"])])
        await cut_off(hub, "doomed")
        await eventually(lambda: streaming_of("doomed", seen)[-1:] == [("leave", [])])
        assert [e.name for e in await observer.presence(session.id)] == ["dash"]
        assert hub.hub.presence.streaming == {}
        ended = await observer.session(session.id).get_message("m1")
        assert ended is not None and ended.text() == "half a"  # saved as interrupted
        with contextlib.suppress(Exception):
            await writer.aclose()
