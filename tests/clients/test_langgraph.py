"""clients.langgraph: LangGraph's own conformance suite (``langgraph-checkpoint-conformance``
``validate()``) against ``HubCheckpointSaver`` in process on both stores and over a hub,
and a real ``StateGraph`` run with it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from clients import HubClient
from clients.langgraph import HubCheckpointSaver
from hub import SessionManager, Store
from tests.support.hubtest import served


async def _conformance(make: Callable[[], HubCheckpointSaver]) -> None:
    @checkpointer_test(name="HubCheckpointSaver")
    async def factory() -> AsyncIterator[HubCheckpointSaver]:
        yield make()

    report = await validate(factory)
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}
    for name, result in results.items():
        assert result.detected, f"{name} not detected"
        assert result.passed, f"{name}: {result.failures}"
        assert result.tests_failed == 0 and result.tests_passed > 0, name


async def test_the_conformance_suite_passes_in_process(store: Store) -> None:
    """Every base capability and copy_thread, prune, delete_for_runs, on a real SQLite
    file and on Postgres."""
    manager = SessionManager(store)
    await _conformance(lambda: HubCheckpointSaver(manager))


async def test_the_conformance_suite_passes_over_a_hub(tmp_path: Path) -> None:
    """The same suite through a served hub: every call a ``checkpoint_*`` op of a
    ``HubClient``, the bytes base64 on the wire."""
    async with served(db=tmp_path / "hub.db") as hub, HubClient(hub.ws_url) as client:
        await _conformance(lambda: HubCheckpointSaver(client))
