"""Turn states on the hub's ``turn.*`` events, as agents 0.32's channels name them
(``TurnStatus`` in the package's ``dist/protocol-*.d.ts``: ``queued``, ``running``,
``settled`` with ``completed`` / ``failed`` / ``aborted`` / ``awaiting-input``;
docs/engine.md, "Turn states"): ``turn.started`` is ``queued``, ``turn.ended`` ``settled``
with its outcome beside the hub's own ``status``."""

from __future__ import annotations

import re
from pathlib import Path

from hub.server.turnframes import SETTLED_OUTCOME
from tests.server.test_turns import _outcome, _session, _taker
from tests.support.chatkit import responder
from tests.support.hubtest import served

ROOT = Path(__file__).resolve().parents[2]


def test_the_outcomes_are_the_originals_names() -> None:
    names = {"completed", "failed", "aborted", "awaiting-input"}  # agents 0.32.0's TurnOutcome
    dist = ROOT / "tests" / "js7" / "node_modules" / "agents" / "dist"
    for typed in sorted(dist.glob("protocol-*.d.ts")):  # the package's own, when installed
        line = re.search(r"type TurnOutcome = ([^;]+);", typed.read_text("utf-8"))
        if line is not None:
            names = set(re.findall(r'"([a-z-]+)"', line.group(1)))
    assert set(SETTLED_OUTCOME.values()) <= names


async def test_a_turn_is_queued_then_settled_with_its_outcome(tmp_path: Path) -> None:
    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        h.client() as user,
    ):
        await _session(h)
        await user.call("start_turn", session_id="s1")
        ended = await _outcome(h, "s1")
        assert (ended["status"], ended["state"], ended["outcome"]) == ("finished", "settled", "completed")
        events = await h.hub.manager.get_session("s1").read_events()
        started = next(e for e in events if e.type == "turn.started")
        assert started.data["state"] == "queued"


async def test_a_stopped_turn_is_aborted(tmp_path: Path) -> None:
    async with served(db=tmp_path / "hub.db") as h, h.client() as agent, h.client() as user:
        await _session(h)
        await _taker(agent)
        turn = await user.call("start_turn", session_id="s1")
        given = await agent.take(lambda f: f["frame"] == "turn")
        fields = {"session_id": "s1", "message_id": given["reply_id"]}
        await agent.call("stream_start", **fields, parent_id="u1", turn_id=given["turn_id"])
        await user.call("stop_turn", session_id="s1", turn_id=turn["turn_id"], reason="enough")
        ended = await _outcome(h, "s1")
        assert (ended["status"], ended["state"], ended["outcome"]) == ("stopped", "settled", "aborted")


async def test_running_then_awaiting_input_then_running_again(tmp_path: Path) -> None:
    """A reply that asks for an approval: ``turn.running`` when it starts, ``turn.awaiting``
    (``awaiting-input``) while it waits for the user, ``turn.running`` once answered, then
    settled: what a UI needs to show a turn that waits (the original's channels)."""
    import httpx2

    from tests.adapters.test_answers import _answered, _page_copy, _post, _user

    async with (
        served(db=tmp_path / "hub.db") as h,
        responder(h.ws_url, lambda: len(h.hub.turns.responders) == 1),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        ask = _user("approve the deploy")
        first = await _post(http, h, {"id": "w1", "messages": [ask]})
        page = _answered(_page_copy(h, "w1", first[0]["messageId"]), True)
        await _post(http, h, {"id": "w1", "messages": [ask, page]})
        await _outcome(h, "w1")
        events = await h.hub.manager.get_session("w1").read_events()
        states = [e.data.get("state") for e in events if e.type.startswith("turn.")]
        assert states == ["queued", "running", "awaiting-input", "running", "settled"], states
