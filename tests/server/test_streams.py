"""Streamed messages: deltas live to subscribers, late joiners, resumes, interrupted writers,
periodic saves, and the errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
import pytest

from clients import HubClient, LiveMessages
from hub import SqliteStore
from hub.server import HubConfig
from protocol import SessionHubError
from protocol.frames import StreamFrame
from tests.support.chatkit import sse_chunks
from tests.support.hubtest import eventually as wait_for
from tests.support.hubtest import served

TOOL = {
    "type": "tool-weather",
    "toolCallId": "c1",
    "state": "input-available",
    "input": {"city": "Paris"},
}


def text_of(message: dict[str, Any] | None) -> str:
    if message is None:
        return ""
    return "".join(p.get("text", "") for p in message["parts"] if p.get("type") == "text")


class Reader:
    """A subscriber that rebuilds streamed messages from the frames it gets."""

    def __init__(self) -> None:
        self.live = LiveMessages()
        self.frames: list[StreamFrame] = []

    def __call__(self, frame: StreamFrame) -> None:
        self.frames.append(frame)
        self.live.apply(frame)


async def follow(client: HubClient, session_id: str, reader: Reader | None = None) -> asyncio.Task[None]:
    subscribed = asyncio.Event()

    async def run() -> None:
        async for event in client.subscribe(session_id):
            subscribed.set()  # the backlog's first event: the subscription is in place
            if reader is not None:
                reader.live.apply_event(event)

    task = asyncio.create_task(run())
    await wait_for(lambda: subscribed.is_set() or task.done())
    if task.done():
        task.result()  # the subscription failed: say why
    return task


async def test_a_stream_grows_live_and_is_stored_when_finished(tmp_path: Path) -> None:
    reader = Reader()
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url, name="worker", role="worker") as worker,
        HubClient(hub.ws_url, on_stream=reader) as ui,
    ):
        info = await worker.sessions.create("chat")
        await worker.sessions.append(
            info.id, {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
        )
        watching = await follow(ui, info.id)
        words = [f"word{i} " for i in range(200)]
        async with worker.session(info.id).stream_message("a1", role="assistant") as st:
            await st.reasoning("thinking")
            await st.reasoning(" more")
            for w in words:
                await st.text(w)
            await st.tool_part(TOOL)
            await st.tool_part({**TOOL, "state": "output-available", "output": {"temp": 21}})
        await wait_for(lambda: reader.live.status.get("a1") == "finished")
        seen = reader.live.messages["a1"]
        assert text_of(seen) == "".join(words)
        assert seen["parts"][0] == {"type": "reasoning", "text": "thinking more"}
        assert seen["parts"][-1]["output"] == {"temp": 21} and len(seen["parts"]) == 3
        batches = [f.deltas or [] for f in reader.frames if f.action == "delta"]
        assert [d["index"] for batch in batches for d in batch] == list(range(1, 205))
        # Coalesced: far fewer frames than deltas, each frame's index its last delta's.
        assert len(batches) < 204
        assert all(
            f.index == (f.deltas or [{}])[-1].get("index") for f in reader.frames if f.action == "delta"
        )
        stored = await worker.sessions.get_history(info.id)
        assert [m.id for m in stored] == ["u1", "a1"]
        assert stored[1].to_dict()["parts"] == seen["parts"]
        watching.cancel()
    async with await SqliteStore.open(tmp_path / "hub.db") as store:
        events = await store.read_events(f"s:{info.id}")
        ended = [e for e in events if e.type == "stream.ended"]
        assert [(e.data["status"], e.data["deltas"]) for e in ended] == [("finished", 204)]
        # Deltas are not logged one by one: start (appended), the final update, the end.
        assert [e.type for e in events][-3:] == ["message.appended", "message.updated", "stream.ended"]


async def test_a_late_joiner_gets_the_state_then_the_rest(tmp_path: Path) -> None:
    late = Reader()
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url) as worker,
        HubClient(hub.ws_url, on_stream=late) as joiner,
    ):
        info = await worker.sessions.create("chat")
        st = await worker.session(info.id).start_stream("a1")
        for i in range(50):
            await st.text(f"{i},")
        await wait_for(lambda: hub.hub.streams.active[info.id, "a1"].index == 50)  # the hub has them
        watching = await follow(joiner, info.id)
        await wait_for(lambda: "a1" in late.live.messages)
        assert any(f.action == "state" for f in late.frames)
        for i in range(50, 100):
            await st.text(f"{i},")
        await st.__aexit__(None, None, None)
        await wait_for(lambda: late.live.status.get("a1") == "finished")
        assert text_of(late.live.messages["a1"]) == "".join(f"{i}," for i in range(100))
        watching.cancel()


async def test_a_dropped_subscriber_resumes_mid_stream_without_loss_or_doubling(tmp_path: Path) -> None:
    reader = Reader()
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url) as worker,
        HubClient(hub.ws_url, name="ui", on_stream=reader) as ui,
    ):
        info = await worker.sessions.create("chat")
        watching = await follow(ui, info.id, reader)
        st = await worker.session(info.id).start_stream("a1")
        for i in range(100):
            await st.text(f"{i};")
            if i in (30, 70):
                await wait_for(lambda: reader.live.index.get("a1") == st.deltas)  # (back) on the stream
                (conn,) = [c for c in hub.hub.connections if c.name == "ui"]
                await conn.close(1011, "test: dropped")
        await st.__aexit__(None, None, None)
        await wait_for(lambda: reader.live.status.get("a1") == "finished", timeout=10)
        assert text_of(reader.live.messages["a1"]) == "".join(f"{i};" for i in range(100))
        assert ui.reconnects == 2
        watching.cancel()


async def test_a_writer_that_dies_leaves_an_interrupted_message(tmp_path: Path) -> None:
    reader = Reader()
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url, on_stream=reader) as ui:
        info = await ui.sessions.create("chat")
        watching = await follow(ui, info.id)
        worker = HubClient(hub.ws_url, name="doomed", reconnect=False)
        await worker.connect()
        st = await worker.session(info.id).start_stream("a1")
        for i in range(10):
            await st.text(f"part{i} ")
        await wait_for(lambda: reader.live.index.get("a1") == 10)
        (conn,) = [c for c in hub.hub.connections if c.name == "doomed"]
        await conn.close(1011, "test: worker died")
        await wait_for(lambda: reader.live.status.get("a1") == "interrupted")
        stored = await ui.sessions.get_history(info.id)
        assert text_of(stored[-1].to_dict()) == "".join(f"part{i} " for i in range(10))
        await worker.aclose()
        watching.cancel()


async def test_an_unfinished_stream_is_saved_within_100_ms(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as worker:
        info = await worker.sessions.create("chat")
        st = await worker.session(info.id).start_stream("a1")
        for i in range(20):
            await st.text(f"{i} ")
        async with await SqliteStore.open(tmp_path / "hub.db") as store:

            async def saved_all() -> bool:
                saved = await store.get_message(info.id, "a1")
                return saved is not None and text_of(saved.to_dict()) == "".join(f"{i} " for i in range(20))

            await wait_for(saved_all)  # the periodic save; the stream is still open
            saved = await store.get_message(info.id, "a1")
            assert saved is not None and text_of(saved.to_dict()) == "".join(f"{i} " for i in range(20))
            # The periodic save logs nothing: no event per delta, none per save.
            types = [e.type for e in await store.read_events(f"s:{info.id}")]
            assert types == ["session.created", "message.appended"]
        await st.__aexit__(None, None, None)


async def test_stream_errors(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as hub,
        HubClient(hub.ws_url) as worker,
        HubClient(hub.ws_url) as other,
    ):
        info = await worker.sessions.create("chat")
        session = worker.session(info.id)
        with pytest.raises(SessionHubError, match="no stream"):
            await session._call("stream_delta", message_id="nope", kind="text", text="x")
        st = await session.start_stream("a1")
        with pytest.raises(SessionHubError, match="already exists"):
            await session.start_stream("a1")
        with pytest.raises(SessionHubError) as foreign:
            await other.session(info.id)._call("stream_delta", message_id="a1", kind="text", text="x")
        assert getattr(foreign.value, "code", None) == "conflict"
        with pytest.raises(SessionHubError, match="needs `text`"):
            await session._call("stream_delta", message_id="a1", kind="text")
        with pytest.raises(SessionHubError, match="tool"):
            await session._call("stream_delta", message_id="a1", kind="tool", part={"type": "text"})
        await st.__aexit__(None, None, None)


# -- the byte limit of a streamed message (issue 24, item 9) ---------------------------------


async def test_a_stream_past_its_byte_limit_ends_too_large_and_keeps_what_it_had(tmp_path: Path) -> None:
    reader = Reader()
    config = HubConfig(max_stream_bytes=1000)
    async with (
        served(db=tmp_path / "hub.db", config=config) as hub,
        hub.client() as writer,
        HubClient(hub.ws_url, on_stream=reader) as ui,
    ):
        info = await ui.sessions.create("chat")
        watching = await follow(ui, info.id)
        fields = {"session_id": info.id, "message_id": "a1"}
        await writer.call("stream_start", **fields)
        for _ in range(3):
            await writer.call("stream_delta", **fields, kind="text", text="é" * 150)  # 300 bytes each
        await writer.call("stream_delta", **fields, kind="tool", part=TOOL)  # ~90 bytes
        refused = await writer.request("stream_delta", **fields, kind="text", text="x" * 200)
        assert (refused["frame"], refused["code"]) == ("error", "too_large"), refused
        assert "1000-byte limit" in refused["message"]
        await wait_for(lambda: reader.live.status.get("a1") == "too_large")
        # Everything before the refused delta is kept, live and stored; nothing of it after.
        kept = "é" * 450
        assert text_of(reader.live.messages["a1"]) == kept
        (stored,) = await ui.sessions.get_history(info.id)
        assert text_of(stored.to_dict()) == kept and stored.parts[-1]["toolCallId"] == "c1"
        ended = [e for e in await ui.session(info.id).read_events() if e.type == "stream.ended"]
        assert [e.data["status"] for e in ended] == ["too_large"]
        # The stream is over; the connection is not.
        late = await writer.request("stream_delta", **fields, kind="text", text="x")
        assert (late["frame"], late["code"]) == ("error", "invalid"), late
        assert await writer.call("ping") == "pong"
        watching.cancel()


async def test_a_chat_reply_past_the_limit_is_an_error_chunk_and_is_kept(tmp_path: Path) -> None:
    config = HubConfig(max_stream_bytes=64)
    async with served(db=tmp_path / "hub.db", config=config) as h, h.client() as responder:
        await h.hub.store.create_session("t", session_id="s1")
        await responder.call("take_turns")
        body = {
            "id": "s1",
            "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
        }
        async with httpx2.AsyncClient() as http, http.stream("POST", f"{h.url}/api/chat", json=body) as r:
            chunks = sse_chunks(r)
            await anext(chunks)
            given = await responder.take(lambda f: f["frame"] == "turn")
            fields = {"session_id": "s1", "message_id": given["reply_id"]}
            await responder.call("stream_start", **fields, turn_id=given["turn_id"])
            await responder.call("stream_delta", **fields, kind="text", text="a" * 60)
            refused = await responder.request("stream_delta", **fields, kind="text", text="b" * 10)
            assert refused["code"] == "too_large", refused
            rest = [c async for c in chunks]
        said = "".join(c["delta"] for c in rest if isinstance(c, dict) and c["type"] == "text-delta")
        assert said == "a" * 60
        error = rest[-2]
        assert rest[-1] == "[DONE]" and isinstance(error, dict) and error["type"] == "error", rest
        assert "max_stream_bytes" in error["errorText"]
        stored = await h.hub.manager.get_session("s1").get_message(given["reply_id"])
        assert stored is not None and stored.text() == "a" * 60
